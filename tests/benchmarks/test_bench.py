"""`ctxkit bench build` / `bench render`: tiny runs through the CLI, asserting the report's shape, that every
ctxkit context equals a from-scratch render (ids identical), and the budget rules. Never timing values."""

from __future__ import annotations

import json

import pytest

from conftest import require_module, tokenizer_dir
from ctxkit.benchmarks.workload import BUDGET_STEP, percentile, summarize_times
from ctxkit.cli.parser import main

TIMING_KEYS = {"total_s", "p50_ms", "p90_ms", "p99_ms", "max_ms", "decisions"}
LANGCHAIN = "langchain trim_messages + apply_chat_template"
ENCODE_ONLY = "encode only the new text"


def conversation(path, *, turns: int = 5, system_repeat: int = 40) -> str:
    """A coding-agent conversation: a long system prompt, `turns` tool calls with 30-line outputs, a final answer."""
    tools = [{"type": "function", "function": {"name": "run_shell", "description": "Run a shell command.",
              "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}]
    msgs = [{"role": "system", "content": "You are a coding agent. " + "Follow the repository rules carefully. " * system_repeat},
            {"role": "user", "content": "Fix the failing test. Do not modify the original config file."}]
    for t in range(turns):
        call = {"id": f"call{t}", "type": "function",
                "function": {"name": "run_shell", "arguments": json.dumps({"cmd": f"pytest -q tests/test_{t}.py"})}}
        msgs.append({"role": "assistant", "content": f"Step {t}: run the tests.", "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"call{t}",
                     "content": "\n".join(f"line {i} of output {t}: assert value failed in module {i}" for i in range(30))})
    msgs.append({"role": "assistant", "content": "Done: the config is unchanged."})
    path.write_text(json.dumps({"messages": msgs, "tools": tools}))
    return str(path)


@pytest.fixture(scope="module")
def qwen() -> str:
    require_module("langchain_core")
    return str(tokenizer_dir("qwen2.5-instruct"))


def run_json(capsys, argv) -> tuple[int, object]:
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def check_arm_shape(arm: dict) -> None:
    assert set(arm["timing"]) == TIMING_KEYS
    t = arm["timing"]
    assert t["p50_ms"] <= t["p90_ms"] <= t["p99_ms"] <= t["max_ms"]


def test_bench_build_synthetic_reports_totals_tails_and_ratios(qwen, capsys):
    code, out = run_json(capsys, ["bench", "build", "--turns", "5", "--budget", "1500", "--repeats", "1",
                                  "--tokenizer", qwen, "--json"])
    assert code == 0
    assert out["episode"] == "synthetic:5" and out["decisions"] == 5 and out["budget"] == 1500
    assert out["budget_note"] == "given" and out["repeats"] == 1 and out["episode_tokens"] > 1500
    names = [a["name"] for a in out["arms"]]
    assert names == ["window-v1", "mask-observations-v1", LANGCHAIN, ENCODE_ONLY]
    assert [a["kind"] for a in out["arms"]] == ["ctxkit", "ctxkit", "peer", "reference"]
    for arm in out["arms"]:
        check_arm_shape(arm)
        assert arm["timing"]["decisions"] == 5
    peer = out["arms"][2]
    assert peer["vs_peer"] == 1.0 and out["arms"][3]["vs_encode_only"] == 1.0
    for arm in out["arms"][:2]:
        assert arm["ids_identical"] is True and arm["over_budget"] == 0 and arm["orphans"] == 0
        assert arm["error"] is None and arm["compactions"] >= 1 and arm["max_tokens"] <= 1500
        assert arm["vs_peer"] > 0 and arm["vs_encode_only"] > 0


def test_bench_build_table_puts_totals_and_ratios_first(qwen, capsys):
    assert main(["bench", "build", "--turns", "5", "--budget", "1500", "--repeats", "1", "--tokenizer", qwen,
                 "--compressors", "window"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("arm "))
    assert header.split()[:5] == ["arm", "total", "s", "vs", "langchain"]
    assert "ids identical to a full render: yes, every build" in "\n".join(lines)


def test_bench_build_episode_raises_a_too_small_fraction_to_the_smallest_fitting_budget(qwen, tmp_path, capsys):
    from ctxkit.benchmarks.build_bench import fits_with
    from ctxkit.benchmarks.workload import episode_workloads
    from ctxkit.errors import BudgetError
    from ctxkit.text.template.chat_template import load_template
    from ctxkit.text.tokenizer.loader import load_tokenizer

    path = conversation(tmp_path / "conv.json", system_repeat=120)  # a fixed prefix over 20 % of the episode
    code, out = run_json(capsys, ["bench", "build", "--episode", path, "--budget-fraction", "0.2", "--repeats", "1",
                                  "--tokenizer", qwen, "--compressors", "window", "--json"])
    assert code == 0 and len(out) == 1
    res = out[0]
    assert res["episode"] == "conv.json#0" and res["decisions"] == 6  # every assistant turn is a decision point
    wanted = int(res["episode_tokens"] * 0.2)
    assert res["budget"] > wanted and (res["budget"] - wanted) % BUDGET_STEP == 0
    assert "is below the fixed prefix + newest turn" in res["budget_note"] and str(res["budget"]) in res["budget_note"]
    tok = load_tokenizer(qwen)
    tpl = load_template(None, tok)
    wl = episode_workloads(path, tok, tpl)[0]
    assert wl.full_tokens == res["episode_tokens"]
    fits = fits_with(tok, tpl, "window", wl)
    fits(res["budget"])
    with pytest.raises(BudgetError):
        fits(res["budget"] - BUDGET_STEP)  # the smallest that fits
    window = res["arms"][0]
    assert window["ids_identical"] is True and window["over_budget"] == 0 and window["timing"]["decisions"] == 6


def test_bench_build_episode_default_half_and_a_stopped_arm(qwen, tmp_path, capsys):
    path = conversation(tmp_path / "conv.json")
    code, out = run_json(capsys, ["bench", "build", "--episode", path, "--repeats", "1", "--tokenizer", qwen,
                                  "--compressors", "window,keep-all", "--json"])
    assert code == 0
    res = out[0]
    assert res["budget"] == res["episode_tokens"] // 2
    assert res["budget_note"] == f"50% of the full {res['episode_tokens']} tokens"
    window, keep_all = res["arms"][:2]
    assert window["error"] is None and window["ids_identical"] is True
    assert keep_all["name"] == "keep-all-v1" and keep_all["error"].startswith("BudgetError at decision ")
    assert keep_all["vs_peer"] is None and keep_all["vs_encode_only"] is None
    assert keep_all["timing"]["decisions"] < 6


def test_bench_render_episode_ids_identical_with_tails(qwen, tmp_path, capsys):
    path = conversation(tmp_path / "conv.json")
    code, out = run_json(capsys, ["bench", "render", "--episode", path, "--repeats", "1", "--tokenizer", qwen, "--json"])
    assert code == 0 and len(out) == 1
    res = out[0]
    assert res["ids_identical"] is True and res["turns"] == 6 and res["episode"] == "conv.json#0"
    assert [a["name"] for a in res["arms"]] == ["ctxkit IncrementalRenderer",
                                                "apply_chat_template(tokenize=True) every turn", ENCODE_ONLY]
    for arm in res["arms"]:
        check_arm_shape(arm)
        assert arm["timing"]["decisions"] == 6
    assert res["arms"][1]["vs_peer"] == 1.0 and res["arms"][2]["vs_encode_only"] == 1.0
    assert res["ctxkit_s"] == res["arms"][0]["timing"]["total_s"]


def test_bench_build_trajectories_folder_one_table(qwen, tmp_path, capsys):
    folder = tmp_path / "traj"
    folder.mkdir()
    conversation(folder / "a__conv.json", turns=3)
    conversation(folder / "b__conv.json", turns=4)
    code, rows = run_json(capsys, ["bench", "build", "--trajectories", str(folder), "--repeats", "1",
                                   "--tokenizer", qwen, "--compressors", "window", "--json"])
    assert code == 0
    assert [(r["file"], r["arm"]) for r in rows] == [(f, a) for f in ("a__conv.json", "b__conv.json")
                                                     for a in ("window-v1", LANGCHAIN, ENCODE_ONLY)]
    assert [r["builds"] for r in rows] == [4, 4, 4, 5, 5, 5]
    assert all(r["episodes"] == 1 and r["budgets"].endswith("%") for r in rows)
    assert [r["ids_identical"] for r in rows] == [True, None, None] * 2
    assert main(["bench", "build", "--trajectories", str(folder), "--repeats", "1", "--tokenizer", qwen,
                 "--compressors", "window"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split()[:4] == ["file", "episodes", "builds", "arm"]


def test_trajectory_files_pair_tool_schemas_by_source_and_spread(tmp_path, monkeypatch):
    from ctxkit.benchmarks import trajectories_bench
    from ctxkit.benchmarks.trajectories_bench import skipped_files, spread, trajectory_files

    assert trajectories_bench.NOT_YET_IMPORTED == ()  # every shared file imports
    for name in ("tau__airline_tools.json", "tau__gpt.json", "swe__x.traj", "oh__rows.jsonl", "notes.md", "new__x.json"):
        (tmp_path / name).write_text("[]")
    assert [(p.name, t and t.name) for p, t in trajectory_files(tmp_path)] == \
        [("new__x.json", None), ("oh__rows.jsonl", None), ("swe__x.traj", None), ("tau__gpt.json", "tau__airline_tools.json")]
    assert skipped_files(tmp_path) == []
    monkeypatch.setattr(trajectories_bench, "NOT_YET_IMPORTED", ("new__x.json",))  # a file no importer reads yet
    assert [p.name for p, _ in trajectory_files(tmp_path)] == ["oh__rows.jsonl", "swe__x.traj", "tau__gpt.json"]
    assert skipped_files(tmp_path) == ["new__x.json"]
    assert spread(200) == list(range(0, 200, 20)) and spread(5) == [0, 1, 2, 3, 4] and spread(20) == list(range(20))


def test_percentiles_and_per_decision_medians_are_exact():
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, q) for q in (50, 90, 99, 100)] == [50.0, 90.0, 99.0, 100.0]
    assert percentile([3.0], 99) == 3.0
    t = summarize_times([[0.001, 0.004, 0.002], [0.003, 0.002, 0.010]])  # per decision: median of the repeats
    assert t.decisions == 3
    assert t.total_s == pytest.approx(0.002 + 0.003 + 0.006)
    assert (t.p50_ms, t.max_ms) == (pytest.approx(3.0), pytest.approx(6.0))


@pytest.mark.parametrize("argv, message", [
    (["bench", "build", "--select", "0"], "--select and --tools apply to --episode FILE"),
    (["bench", "build", "--budget-fraction", "1.5"], "--budget-fraction 1.5: expected a fraction in (0, 1]"),
    (["bench", "build", "--trajectories", "--budget", "100"], "--trajectories runs every file at --budget-fraction"),
    (["bench", "build", "--compressors", "nope"], "nope"),
])
def test_bench_build_bad_options_are_one_line_errors(argv, message, qwen, capsys):
    assert main([*argv, "--tokenizer", qwen]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cold_start_empties_every_cache_of_episode_content(qwen):
    """A timed pass must tokenize all of its own text: after `cold_start` no count, piece or pin detection
    from an earlier pass is left (the repeats of `bench build` used to re-use them)."""
    from ctxkit.benchmarks.workload import cold_start
    from ctxkit.events import Message
    from ctxkit.context.pins import detect_constraints
    from ctxkit.text.tokenizer.loader import load_tokenizer
    from ctxkit.context import pins

    tok = load_tokenizer(qwen)
    text = "Do not modify the original file. " * 3
    tok.count(text)
    tok.encode_with_offsets("<|im_start|>user\n" + text)
    detect_constraints([Message(role="user", content=text, id="m1")])
    assert len(tok._count_cache) and len(tok._piece_cache) and len(tok._recent_counts) and len(pins._FOUND)
    cold_start(tok)
    assert (len(tok._count_cache), len(tok._piece_cache), len(tok._recent_counts), len(pins._FOUND)) == (0, 0, 0, 0)
    assert tok.count(text) == len(tok.encode(text))  # and the caches fill again as before
