"""`ctxkit.benchmarks.arm_costs`: the report's exact structure and arithmetic on rows with given timings, a tiny
grid run through the benchmark (cold cache, a real MiniLM arm) and read back with `--run`. Never measured
timing values."""

from __future__ import annotations

import json

import pytest

from conftest import require_module, tokenizer_dir
from ctxkit.benchmarks import arm_costs
from ctxkit.errors import ConfigError

WINDOW = {"name": "window-v1", "params": {"keep_first": 1}}
KEEP_ALL = {"name": "keep-all-v1", "params": {"on_overflow": "truncate"}}
RETRIEVE = {"name": "retrieve-v1", "params": {"top_k": 3}}
PIPELINE = {"name": "pipeline-v1", "params": {"stages": [{"name": "summarize-v2", "params": {}}, WINDOW]}}


def row(arm: str, compressor: dict, seed: int, wall: float, build: float, *, load: float = 0.0, pid: int = 7,
        cause: str = "answered") -> dict:
    """A results row as `ctxkit ablate` writes it (the fields the reader checks), with the given timings."""
    timing = {"wall_s": wall, "build_s": build, "generate_s": 0.0, "prefill_s": 0.0, "decode_s": 0.0, "tool_s": 0.0,
              "other_s": 0.0, "tool_waits": [], "model_load_s": load, "worker_pid": pid}
    return {"arm": arm, "task": "needle-recall", "seed": seed, "episode_id": f"{arm}/needle-recall-{seed}",
            "compressor": compressor, "outcome": "truncated" if cause == "context_budget" else "terminated",
            "cause": cause, "completed": cause == "answered", "discarded": False, "timed_out": False, "quality": 1.0,
            "violations": 0, "steps": 3, "tool_calls": 2, "repeated_tool_calls": 0, "prompt_tokens_total": 100,
            "peak_context": 50, "compression_ratio": 1.0, "prefix_reuse": 0.5, "generated_tokens": 10,
            "loss_tokens": 10, "timing": timing}


def write_run(path, rows) -> str:
    path.mkdir()
    (path / "results.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    (path / "run.json").write_text(json.dumps({"config": "tiny.toml", "fingerprint": "x"}))
    return str(path)


def given_rows() -> list[dict]:
    return [
        row("keep-all", KEEP_ALL, 0, 0.1, 0.01, cause="context_budget"),
        row("keep-all", KEEP_ALL, 1, 0.1, 0.01, cause="context_budget"),
        row("window", WINDOW, 0, 0.2, 0.02),
        row("window", WINDOW, 1, 0.6, 0.04),
        row("retrieve", RETRIEVE, 0, 5.0, 4.5, load=3.5),
        row("retrieve", RETRIEVE, 1, 1.2, 1.0, pid=8),
        row("summarize", PIPELINE, 0, 1.6, 1.4, pid=8),
        row("summarize", PIPELINE, 1, 2.0, 1.8, pid=8, load=0.0),
    ]


def test_kinds_come_from_the_recorded_compressor_spec_pipeline_stages_included():
    assert not arm_costs.is_model_backed(WINDOW) and not arm_costs.is_model_backed(KEEP_ALL)
    assert arm_costs.is_model_backed(RETRIEVE) and arm_costs.is_model_backed(PIPELINE)
    assert arm_costs.compressor_names(PIPELINE) == ["pipeline-v1", "summarize-v2", "window-v1"]


def test_report_of_given_rows_has_the_exact_structure_and_arithmetic(tmp_path, capsys):
    run = write_run(tmp_path / "run", given_rows())
    assert arm_costs.main(["--run", run, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"run_dir", "config", "episodes", "loads_recorded", "rule_based", "excluded", "rule_mean_wall_s",
                         "arms", "workers", "grid_wall_s", "load_average"}
    assert (data["config"], data["episodes"], data["loads_recorded"]) == ("tiny.toml", 8, True)
    assert data["rule_based"] == ["window"] and list(data["excluded"]) == ["keep-all"]
    assert data["excluded"]["keep-all"] == "2 of 2 episodes end truncated (context_budget)"
    assert data["grid_wall_s"] is None and data["load_average"] is None
    assert data["rule_mean_wall_s"] == pytest.approx(0.4)
    arms = {a["arm"]: a for a in data["arms"]}
    assert list(arms) == ["keep-all", "window", "retrieve", "summarize"]
    assert set(arms["window"]) == {"arm", "compressor", "kind", "episodes", "truncated", "in_baseline", "wall", "build",
                                   "model_load_s", "vs_rule_based"}
    assert set(arms["window"]["wall"]) == {"p50_s", "p99_s", "mean_s", "total_s"}
    assert [(a["kind"], a["in_baseline"], a["truncated"]) for a in arms.values()] == [
        ("rule-based", False, 2), ("rule-based", True, 0), ("model-backed", False, 0), ("model-backed", False, 0)]
    # the model load is taken out of the episode that paid it: retrieve's walls are 1.5 and 1.2
    retrieve = arms["retrieve"]
    assert retrieve["wall"]["mean_s"] == pytest.approx(1.35) and retrieve["wall"]["p99_s"] == pytest.approx(1.5)
    assert retrieve["build"]["p50_s"] == pytest.approx(1.0) and retrieve["model_load_s"] == pytest.approx(3.5)
    assert retrieve["vs_rule_based"] == pytest.approx(1.35 / 0.4)
    assert arms["summarize"]["vs_rule_based"] == pytest.approx(4.5) and arms["window"]["vs_rule_based"] == pytest.approx(1)
    assert data["workers"] == [
        {"worker": 7, "episodes": 5, "model_load_s": 3.5, "paid_by": ["retrieve/needle-recall-0"]},
        {"worker": 8, "episodes": 3, "model_load_s": 0.0, "paid_by": []},
    ]
    assert arm_costs.main(["--run", run, "--check", "--json"]) == 1  # summarize is 4.5x
    capsys.readouterr()
    assert arm_costs.main(["--run", run]) == 0
    text = capsys.readouterr().out
    assert "vs rule-based" in text and "rule-based (excluded)" in text and "3.38x" in text and "4.50x" in text
    assert "rule-based mean (over window): 0.400 s per episode" in text
    assert "left out of the rule-based mean: keep-all: 2 of 2 episodes end truncated (context_budget)" in text
    assert "model loads in all: 3.50 s" in text and "<= 3x the rule-based mean per episode: NO" in text


def test_rows_without_load_fields_are_reported_as_including_the_load(tmp_path):
    rows = given_rows()
    for r in rows:
        del r["timing"]["model_load_s"], r["timing"]["worker_pid"]
    result = arm_costs.read_run(write_run(tmp_path / "old", rows))
    assert not result.loads_recorded and result.workers == [] and result.model_load_s == 0
    assert {a.arm: a.wall.mean_s for a in result.arms}["retrieve"] == pytest.approx(3.1)
    assert "model loads INCLUDED" in arm_costs.cost_table(result)


def test_errors_are_typed(tmp_path):
    with pytest.raises(ConfigError, match="no results.jsonl"):
        arm_costs.read_run(tmp_path)
    with pytest.raises(ConfigError, match="no results rows"):
        arm_costs.analyze([])
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(ConfigError, match="not an empty folder"):
        arm_costs.run("experiments/quickstart.toml", tmp_path / "busy")


TINY = """
name = "arm-costs-tiny"
tokenizer = "{tok}"
seeds = [0]
budget = 900
baseline = "window"
[limits]
max_steps = 12
max_context = 900
wall_time_s = 120.0
[agents.scripted]
[tasks.needle-recall]
n_files = 4
lines_per_file = 8
[[arms]]
name = "keep-all"
compressor = "keep-all"
params = {{ on_overflow = "truncate" }}
[[arms]]
name = "window"
compressor = "window"
params = {{ keep_first = 1 }}
[[arms]]
name = "retrieve"
compressor = "retrieve"
params = {{ keep_first = 1, keep_last = 1, top_k = 2 }}
[report]
bootstrap_resamples = 200
"""


@pytest.mark.slow
def test_tiny_grid_runs_cold_and_reads_back(tmp_path, capsys):
    require_module("sentence_transformers")
    require_module("faiss")
    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(tok=tokenizer_dir("qwen2.5-instruct")))
    out = tmp_path / "run"
    assert arm_costs.main(["--config", str(config), "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["episodes"] == 3 and data["loads_recorded"] and data["config"] == str(config)
    assert [(a["arm"], a["kind"], a["episodes"]) for a in data["arms"]] == [
        ("keep-all", "rule-based", 1), ("window", "rule-based", 1), ("retrieve", "model-backed", 1)]
    assert data["grid_wall_s"] > 0 and len(data["load_average"]) == 2
    assert len(data["workers"]) == 1 and data["workers"][0]["episodes"] == 3
    assert (out / "cache" / "embeddings").is_dir() and not (out / "report.md").exists()
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all({"model_load_s", "worker_pid"} <= set(r["timing"]) for r in rows)
    assert arm_costs.main(["--run", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"arm costs: {out} ({config}), 3 episodes") and "model loads per worker:" in text
