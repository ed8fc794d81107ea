"""Arms that showed the policy the same contexts: traces read from real logs, pairs found exactly, a damaged
log named, and the finding in an ablation report and a GRPO report."""

from __future__ import annotations

import json

import pytest

from ctxkit.errors import LogFormatError
from ctxkit.experiment.same_contexts import SameContexts, decision_trace, same_context_pairs
from step_logs import write_step_log as write_log


def test_a_trace_is_the_context_hash_of_each_step_in_order(tmp_path):
    path = write_log(tmp_path / "e.jsonl", ["h1", "h2", "h1"])
    assert decision_trace(path) == ("h1", "h2", "h1")
    assert decision_trace(write_log(tmp_path / "none.jsonl", [])) == ()


def test_a_damaged_log_is_a_typed_error_naming_the_file(tmp_path):
    path = write_log(tmp_path / "e.jsonl", ["h1", "h2"])
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1].replace('"out"', '"OUT"'))  # breaks the hash chain
    with pytest.raises(LogFormatError, match="e.jsonl"):
        decision_trace(path)


def test_pairs_are_arms_equal_on_every_shared_episode():
    traces = {
        "window": {("t", 0): ("a", "b"), ("t", 1): ("c",)},
        "window+pins": {("t", 0): ("a", "b"), ("t", 1): ("c",)},
        "mask": {("t", 0): ("a", "b"), ("t", 1): ("d",)},  # one decision differs
        "fewer": {("t", 0): ("a", "b")},                     # not the same episodes
        "empty": {},
        "silent": {("t", 0): (), ("t", 1): ()},
        "silent-too": {("t", 0): (), ("t", 1): ()},          # no decision to compare
    }
    assert same_context_pairs(traces) == [SameContexts(first="window", second="window+pins", episodes=2, decisions=3)]
    assert same_context_pairs({"b": traces["window"], "a": traces["window"], "c": traces["window"]}) == [
        SameContexts("b", "a", 2, 3), SameContexts("b", "c", 2, 3), SameContexts("a", "c", 2, 3)]


def test_the_ablation_report_names_arms_with_the_same_contexts(tmp_path):
    pytest.importorskip("matplotlib")
    from ctxkit.experiment.report import write_report

    rows = []
    for arm, hashes in {"keep-all": [["k1", "k2"], ["k3"]], "window": [["w1", "w2"], ["w3"]],
                        "window+pins": [["w1", "w2"], ["w3"]]}.items():
        for seed, trace in enumerate(hashes):
            log = f"episodes/{arm}/needle-recall-{seed}.jsonl"
            write_log(tmp_path / log, trace)
            rows.append(_row(arm, seed, log))
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "run.json").write_text(json.dumps({"experiment": {
        "name": "same", "baseline": "keep-all", "arms": [{"name": a} for a in ("keep-all", "window", "window+pins")]}}))
    text = write_report(tmp_path).read_text()
    assert ("- `window` and `window+pins` showed the policy identical contexts at every decision (2 of 2 shared "
            "episodes, 3 decisions, equal context hashes)") in text
    assert text.count("identical contexts") == 1
    (tmp_path / "episodes/window+pins/needle-recall-1.jsonl").unlink()  # a log not in the folder: not compared
    assert "identical contexts" not in write_report(tmp_path).read_text()


def _row(arm, seed, log):
    timing = {"build_s": 0.0, "decode_s": 0.0, "generate_s": 0.1, "model_load_s": 0.0, "other_s": 0.0,
              "prefill_s": 0.0, "tool_s": 0.0, "tool_waits": [], "wall_s": 0.2}
    return {"arm": arm, "task": "needle-recall", "seed": seed, "episode_id": f"{arm}/needle-recall-{seed}", "log": log,
            "agent": "scripted", "agent_kind": "scripted", "budget": 1024, "pins_detection": arm.endswith("pins"),
            "compressor": {"name": arm, "params": {}}, "cause": "answered", "outcome": "terminated", "completed": True,
            "quality": 1.0, "reward": 1.0, "reward_kind": "scored", "discarded": False, "steps": 2, "tool_calls": 1,
            "repeated_tool_calls": 0, "malformed_tool_calls": 0, "prompt_tokens": [10, 20], "prompt_tokens_total": 30,
            "full_tokens_total": 30, "peak_context": 20, "compactions": 0, "compression_ratio": 1.0,
            "prefix_reuse": 0.5, "generated_tokens": 4, "loss_tokens": 4, "pins": 0, "timed_out": False, "violations": 0,
            "timing": timing}
