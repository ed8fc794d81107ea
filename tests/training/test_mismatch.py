"""ctxkit.training.mismatch: quantiles, buckets, correction shares and the trap on hand-built steps (exact values),
the llama.cpp transform order, CLI errors, and (slow) the control: transformers sampling vs its own
recompute on a real SmolLM2 log, ratios within 1e-4 of 1."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from ctxkit.cli.parser import main
from ctxkit.errors import ConfigError
from ctxkit.training.mismatch import ScoredStep, analyze, processed_logprobs, quantiles, render_text
from ctxkit.training.mismatch.stats import bucketize, kind_stats, trap_stats

REPO = Path(__file__).resolve().parents[2]


def _step(index, context_length, behaviour, recomputed, *, kind="processed", raw=None, rec_raw=None, sampling=None, log="a.jsonl",
          arm=None, episode_id="ep"):
    behaviour = np.asarray(behaviour, dtype=np.float64)
    recomputed = np.asarray(recomputed, dtype=np.float64)
    extra = {} if arm is None else {"arm": arm}
    return ScoredStep(
        log=log, episode_id=episode_id, index=index, seq=10 + index, context_length=context_length,
        token_ids=tuple(range(100, 100 + len(behaviour))), logprob_kind=kind, behaviour=behaviour,
        behaviour_raw=None if raw is None else np.asarray(raw, dtype=np.float64),
        recomputed_raw=recomputed if rec_raw is None else np.asarray(rec_raw, dtype=np.float64),
        recomputed_processed=recomputed, sampling=sampling or {"temperature": 1.0}, **extra,
    )


def test_quantiles_are_numpy_linear_over_finite_values():
    assert quantiles(np.arange(101)) == {"p1": 1.0, "p5": 5.0, "p25": 25.0, "p50": 50.0, "p75": 75.0, "p95": 95.0, "p99": 99.0}
    assert quantiles([1.0, 2.0, 3.0, 4.0, math.inf, -math.inf], (0.25, 0.5)) == {"p25": 1.75, "p50": 2.5}
    assert quantiles([math.nan], (0.5,)) == {"p50": None}


def test_buckets():
    assert bucketize([0, 127, 128, 4095, 4096, 9000]) == ["0-127", "0-127", "128-255", "2048-4095", "4096+", "4096+"]
    with pytest.raises(ConfigError, match="must be increasing and start at 0"):
        bucketize([1], edges=(5, 10))


def test_kind_stats_exact_on_hand_built_steps():
    a = _step(0, 10, [-1.0, -1.0, -1.0], [-1.0, -1.0 + math.log(3.0), -1.0 - math.log(4.0)])  # ratios 1, 3, 0.25
    b = _step(1, 200, [-0.5, -0.5], [-0.5 + math.log(2.0), -0.5 + math.log(2.0)], log="b.jsonl")  # ratios 2, 2
    k = kind_stats([a, b], clip=2.0, mask_low=0.5, mask_high=2.0, top=2, decode=lambda t: f"<{t}>")
    assert (k["steps"], k["tokens"], k["non_finite_diffs"]) == (2, 5, 0)
    assert k["max_abs_diff"] == pytest.approx(math.log(4.0), abs=1e-15)
    assert k["tis"] == {"clip": 2.0, "token_share": 0.2, "tokens": 1, "sequence_share": 0.5, "sequences": 1}
    assert k["token_mask"] == {"low": 0.5, "high": 2.0, "token_share": 0.4, "tokens": 2, "sequence_share": 0.5, "sequences": 1}
    # sequence ratios: a = 3 * 0.25 = 0.75 (kept), b = 2 * 2 = 4 > 3 (masked, its 2 of 5 tokens)
    assert k["sequence_mask"] == {"clip_max": 3.0, "clip_min": None, "sequence_share": 0.5, "sequences": 1, "token_share": 0.4, "tokens": 2}
    assert [(e["position"], e["token_id"], e["text"], e["log"], e["step"]) for e in k["extremes"]] == [
        (12, 102, "<102>", "a.jsonl", 0), (11, 101, "<101>", "a.jsonl", 0)]
    assert k["extremes"][0]["ratio"] == pytest.approx(0.25, rel=1e-12)
    assert [(r["bucket"], r["tokens"]) for r in k["by_position"]] == [("0-127", 3), ("128-255", 2)]
    assert [(r["bucket"], r["tokens"]) for r in k["by_sequence_length"]] == [("0-127", 3), ("128-255", 2)]
    assert k["by_position"][0]["tis_share"] == pytest.approx(1 / 3, rel=1e-12)
    assert k["by_position"][1]["ratio_p50"] == pytest.approx(2.0, rel=1e-12)
    assert k["ratio_quantiles"]["p50"] == pytest.approx(2.0, rel=1e-12)


def _paired_run_steps():
    """A paired run: arms `full` and `window` sample the same first step of `t-0` (same context, same seed),
    then differ; `t-1` is another episode of `full`."""
    run = "run/episodes"
    same = ([-1.0, -1.0], [-1.0 - math.log(4.0), -1.0 + math.log(1.5)])  # diffs -log 4, +log 1.5
    return [
        _step(0, 10, *same, log=f"{run}/full/t-0.jsonl", arm="full", episode_id="full/t-0"),
        _step(0, 10, *same, log=f"{run}/window/t-0.jsonl", arm="window", episode_id="window/t-0"),
        _step(1, 40, [-2.0], [-2.0 + math.log(3.0)], log=f"{run}/window/t-0.jsonl", arm="window", episode_id="window/t-0"),
        _step(1, 60, [-2.0], [-2.0 + math.log(2.0)], log=f"{run}/full/t-0.jsonl", arm="full", episode_id="full/t-0"),
        _step(0, 10, [-0.5], [-0.5 - math.log(1.25)], log=f"{run}/full/t-1.jsonl", arm="full", episode_id="full/t-1"),
    ]


def test_extremes_list_each_extreme_once_with_its_arms():
    k = kind_stats(_paired_run_steps(), top=4, decode=lambda t: f"<{t}>")
    # by |diff| descending: log 4 (both arms' step 0, one row), log 3, log 2, log 1.5 (both arms again)
    assert [(e["arms"], e["log"], e["step"], e["position"], e["token_id"]) for e in k["extremes"]] == [
        (["full", "window"], "run/episodes/full/t-0.jsonl", 0, 10, 100),
        (["window"], "run/episodes/window/t-0.jsonl", 1, 40, 100),
        (["full"], "run/episodes/full/t-0.jsonl", 1, 60, 100),
        (["full", "window"], "run/episodes/full/t-0.jsonl", 0, 11, 101),
    ]
    assert [e["ratio"] for e in k["extremes"]] == pytest.approx([0.25, 3.0, 2.0, 1.5], rel=1e-12)
    # a log without an arm (not from a run folder) lists no arm; the same log given twice is one row
    bare = _step(0, 5, [-1.0], [-3.0], log="b.jsonl")
    k = kind_stats([bare, bare], top=10)
    assert [(e["arms"], e["log"], e["position"]) for e in k["extremes"]] == [([], "b.jsonl", 5)]


def test_extremes_table_has_one_row_per_extreme_and_an_arm_column():
    report = analyze(_paired_run_steps(), top=4, decode=lambda t: f"<{t}>")
    lines = render_text(report).splitlines()
    start = lines.index("| extreme | arm | position | token | behaviour | recomputed | ratio | where |")
    assert lines[start + 1:start + 7] == [
        "|---|---|---|---|---|---|---|---|",
        "| 1 | full, window | 10 | '<100>' (100) | -1.000000 | -2.386294 | 0.25 | t-0.jsonl step 0 |",
        "| 2 | window | 40 | '<100>' (100) | -2.000000 | -0.901388 | 3 | t-0.jsonl step 1 |",
        "| 3 | full | 60 | '<100>' (100) | -2.000000 | -1.306853 | 2 | t-0.jsonl step 1 |",
        "| 4 | full, window | 11 | '<101>' (101) | -1.000000 | -0.594535 | 1.5 | t-0.jsonl step 0 |",
        "",
    ]


def test_trap_counts_actions_outside_the_kept_support():
    hot = {"temperature": 0.7, "top_p": 0.9, "order": "hf"}
    s = _step(0, 5, [-0.2, -3.0], [-0.1, -math.inf], raw=[-0.5, -3.0], rec_raw=[-0.5, -3.0], sampling=hot)
    cold = _step(1, 5, [-1.0], [-1.0], raw=[-1.0])  # identity transform: not part of the trap
    t = trap_stats([s, cold])
    assert (t["steps"], t["tokens"], t["outside_support"], t["outside_support_share"]) == (1, 2, 1, 0.5)
    assert t["sampling"] == [{"min_p": None, "order": "hf", "temperature": 0.7, "top_k": None, "top_p": 0.9}]
    # trap ratios exp(-0.1 + 0.5) and exp(-inf) = 0: a ratio of 0 is a value, not dropped
    assert t["trap_ratio_quantiles"]["p50"] == pytest.approx(math.exp(0.4) / 2, rel=1e-12)
    assert t["matched_ratio_quantiles"]["p50"] == 1.0
    assert (t["trap_token_mask_share"], t["matched_token_mask_share"]) == (0.5, 0.0)
    assert trap_stats([cold])["note"].startswith("no step with a non-identity sampling transform")
    report = analyze([s, cold])
    assert sorted(report["kinds"]) == ["processed", "raw (recorded beside processed)"]


def test_llama_cpp_order_filters_before_the_temperature():
    logits = np.array([2.0, 1.0, 0.0, -1.0])
    cfg = {"temperature": 0.5, "top_p": 0.8}
    # llama.cpp: top-p on the temperature-1 distribution keeps ids 0 and 1 (0.644 < 0.8), then logits / 0.5
    got = processed_logprobs(logits, {**cfg, "order": "llama.cpp", "top_k": 0})
    assert got[0] == pytest.approx(-math.log1p(math.exp(-2.0)), rel=1e-12)
    assert got[1] == pytest.approx(-2.0 - math.log1p(math.exp(-2.0)), rel=1e-12)
    assert np.isneginf(got[2:]).all()
    # transformers order: temperature first (p0 = 0.867 >= 0.8), so top-p keeps id 0 alone
    hf = processed_logprobs(logits, {**cfg, "order": "hf"})
    assert hf[0] == 0.0 and np.isneginf(hf[1:]).all()
    # what the OpenAI agent records for a llama.cpp server means the same order
    served = processed_logprobs(logits, {**cfg, "top_k": 0, "repeat_penalty": 1.0, "engine_sampler_order": "top_k,typical,top_p,min_p,temperature"})
    assert served.tolist() == got.tolist()
    with pytest.raises(ConfigError, match=r"sampling.typical_p=0.5: not modelled"):
        processed_logprobs(logits, {"order": "llama.cpp", "typical_p": 0.5})
    with pytest.raises(ConfigError, match=r"sampling.order='sglang': unknown"):
        processed_logprobs(logits, {"order": "sglang"})


def test_cli_errors_name_what_and_where(tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    assert main(["mismatch", str(missing), "--model", "default"]) == 2
    assert f"{missing} does not exist (expected an episode log or a run folder)" in capsys.readouterr().err
    empty = tmp_path / "run"
    (empty / "episodes").mkdir(parents=True)
    (empty / "episodes" / "notes.jsonl").write_text('{"not": "a ctxkit log"}\n')
    assert main(["mismatch", str(empty), "--model", "default"]) == 2
    assert f"mismatch: no ctxkit episode log under {empty}" in capsys.readouterr().err
    assert main(["mismatch", str(missing), "--model", "default", "--mask-low", "3"]) == 2
    assert "--mask-low 3 > --mask-high 2" in capsys.readouterr().err
    assert main(["mismatch", str(missing), "--model", "default", "--clip", "-1"]) == 2
    assert "argument --clip: expected a finite number > 0, got '-1'" in capsys.readouterr().err


def _runs_module():
    spec = importlib.util.spec_from_file_location("mismatch_runs", REPO / "scripts" / "mismatch_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_control_transformers_sampling_vs_its_own_recompute(tmp_path, hf_tokenizer_paths, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    runs = _runs_module()
    runs.TOKENIZER = hf_tokenizer_paths["smollm2-135m-instruct"]
    logs = runs.run("transformers", tmp_path / "logs", episodes=1, steps=2, temperature=0.7, top_p=0.9,
                    max_new_tokens=12, threads=1)
    out_json, out_png = tmp_path / "m.json", tmp_path / "m.png"
    assert main(["mismatch", *map(str, logs), "--model", "default", "--json", str(out_json), "--plot", str(out_png)]) == 0
    report = json.loads(out_json.read_text())
    assert report["header"]["dtype"] == "float32" and report["header"]["steps"] == 2
    for kind in ("processed", "raw (recorded beside processed)"):
        k = report["kinds"][kind]
        assert k["non_finite_diffs"] == 0
        assert k["max_abs_diff"] < 1e-4, kind
        assert all(abs(v - 1.0) < 1e-4 for v in k["ratio_quantiles"].values()), kind
        assert (k["tis"]["tokens"], k["token_mask"]["tokens"], k["sequence_mask"]["sequences"]) == (0, 0, 0)
    trap = report["trap"]
    assert trap["steps"] == 2 and trap["outside_support"] == 0
    # the extremes: each token once (these logs record no arm), one table row each, under an arm column
    text = capsys.readouterr().out
    for kind, k in report["kinds"].items():
        where = [(e["log"], e["step"], e["position"]) for e in k["extremes"]]
        assert len(where) == len(set(where)) == min(10, k["tokens"]), kind
        assert all(e["arms"] == [] for e in k["extremes"]), kind
    head = "| extreme | arm | position | token | behaviour | recomputed | ratio | where |"
    assert text.count(head) == len(report["kinds"])
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.endswith(" |") and " step " in line]
    assert len(rows) == sum(len(k["extremes"]) for k in report["kinds"].values())
    assert all(row.split(" | ")[1] == "-" for row in rows)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # attribution: the transformers agent recorded its kept set on both steps; within the default bounds nothing
    # is out; with bounds tighter than the float noise, every out token gets one cause, and a scorer holding other
    # weights puts them all on policy-version lag
    att = report["attribution"]["kinds"]["processed"]
    assert (att["steps"], att["steps_with_kept_set"], att["out_of_bounds"]) == (2, 2, 0)
    assert "### mismatch attribution" in text
    tight = ["--clip", "1.000001", "--mask-low", "0.999999", "--mask-high", "1.000001", "--force", "--json", str(out_json)]
    for version in ("scorer", "other-weights"):
        assert main(["mismatch", *map(str, logs), "--model", "default", *tight, "--policy-version", version]) == 0
        att = json.loads(out_json.read_text())["attribution"]
        k = att["kinds"]["processed"]
        rows = {r["cause"]: r["tokens"] for r in k["rows"] if r["tokens"]}
        assert k["out_of_bounds"] > 0 and sum(rows.values()) == k["out_of_bounds"], rows
        if version == "scorer":
            assert att["policy_version"].startswith("SmolLM2") and "policy_version_lag" not in rows, rows
        else:
            assert rows == {"policy_version_lag": k["out_of_bounds"]}


def test_unknown_order_override_is_refused_before_reading(tmp_path):
    from ctxkit.training.mismatch.scoring import score_steps

    with pytest.raises(ConfigError, match=r"order='sglang': unknown; expected one of \['hf', 'vllm', 'llama.cpp'\]"):
        score_steps(tmp_path / "never-read.jsonl", None, order="sglang")


def _log(path, **step):
    from ctxkit.events import EpisodeStart, Message, Step
    from ctxkit.log.event_log import EventLog

    with EventLog.create(path, episode_id=path.stem) as log:
        log.extend([EpisodeStart(episode_id=path.stem), Message(role="user", content="hi"),
                    Step(token_ids=(1, 2), content="yo", **step)])
    return path


@pytest.fixture()
def no_model(monkeypatch):
    """Fail the test if anything tries to load a model."""
    import ctxkit.training.mismatch.scoring as scoring

    def refuse(*args, **kwargs):
        raise AssertionError("the model loader was called")

    monkeypatch.setattr(scoring, "load_causal_lm", refuse)


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "gpu0"])
def test_a_bad_device_fails_before_any_model_loads(tmp_path, capsys, no_model, device):
    import time

    log = _log(tmp_path / "ep.jsonl", logprobs=(-0.1, -0.2), logprob_kind="processed")
    start = time.perf_counter()
    assert main(["mismatch", str(log), "--model", "default", "--device", device]) == 2
    assert time.perf_counter() - start < 5
    assert f"mismatch: device {device!r}: expected cpu, cuda, cuda:N or mps" in capsys.readouterr().err
    from ctxkit.training.mismatch.scoring import score_logs

    with pytest.raises(ConfigError, match="expected cpu, cuda, cuda:N or mps"):
        score_logs([log], device=device)


@pytest.mark.parametrize("step, held", [
    ({}, "1 step(s), logprob_kind None"),
    ({"logprob_kind": "none"}, "1 step(s), logprob_kind none"),
    ({"logprob_kind": "recomputed", "logprobs": (-0.1, -0.2)}, "1 step(s), logprob_kind recomputed"),
])
def test_a_log_without_log_probs_fails_before_any_model_loads(tmp_path, capsys, no_model, step, held):
    good = _log(tmp_path / "good.jsonl", logprobs=(-0.1, -0.2), logprob_kind="processed")
    bare = _log(tmp_path / "bare.jsonl", **step)
    assert main(["mismatch", str(good), str(bare), "--model", "default"]) == 2
    err = capsys.readouterr().err
    assert f"mismatch: log {bare} holds no step with raw or processed log-probs ({held}); nothing to re-score" in err, err


def test_a_step_of_a_scored_kind_without_log_probs_is_named(tmp_path, capsys, no_model):
    bad = _log(tmp_path / "bad.jsonl", logprob_kind="raw")
    assert main(["mismatch", str(bad), "--model", "default"]) == 2
    assert f"{bad}: step 0 (seq 2): logprob_kind 'raw' but no log-probs recorded" in capsys.readouterr().err
