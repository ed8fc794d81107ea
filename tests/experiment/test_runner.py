"""The runner end to end: real episodes, logs that replay and audit, typed ends, deterministic rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiment_configs import small_toml, strip_timing, tiny_toml, write_config
from ctxkit.cli.parser import main
from ctxkit.events import EpisodeStart, StateSnapshot, ToolCall
from ctxkit.experiment.agents.base import AgentTurn
from ctxkit.experiment.config import load_config
from ctxkit.experiment.episode import _act_on
from ctxkit.experiment.runner import read_rows, run_experiment
from ctxkit.experiment.tasks.base import make_task


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("small")
    cfg = load_config(write_config(tmp, small_toml()))
    summary = run_experiment(cfg, tmp / "run", progress=False)
    return cfg, tmp / "run", summary


def test_every_cell_has_a_row_and_a_verified_log(small_run):
    from ctxkit.log.event_log import read_events, verify

    cfg, out, summary = small_run
    assert (summary.total, summary.ran, summary.reused) == (8, 8, 0)
    rows = read_rows(out)
    assert sorted(r["episode_id"] for r in rows) == sorted(s.key for s in cfg.episodes())
    for r in rows:
        path = out / r["log"]
        assert r["log"] == f"episodes/{r['arm']}/{r['task']}-{r['seed']}.jsonl"
        assert verify(path).ok
        events = read_events(path)
        assert isinstance(events[0], EpisodeStart) and events[0].episode_id == r["episode_id"]
        assert events[-1].kind == "episode_end" and events[-1].cause == r["cause"]
        assert r["steps"] == sum(e.kind == "step" for e in events)


def test_episode_start_records_the_builder_description(small_run):
    from ctxkit.context.builder import ContextBuilder
    from ctxkit.log.event_log import read_events

    cfg, out, _ = small_run
    for arm in cfg.arms:
        expected = ContextBuilder(cfg.tokenizer, cfg.template, arm.compressor, arm.budget, arm.params,
                                  detect_pins=arm.pins).describe()
        start = read_events(out / f"episodes/{arm.name}/needle-recall-0.jsonl")[0]
        assert dict(start.context) == json.loads(json.dumps(expected))
        assert start.sampler["seed"] == 0 and start.task["name"] == "needle-recall"


def test_window_loses_the_rule_and_pins_keep_it(small_run):
    _, out, _ = small_run
    rows = {r["episode_id"]: r for r in read_rows(out)}
    for seed in (0, 1):
        lost = rows[f"window/constraint-edit-{seed}"]
        kept = rows[f"window+pins/constraint-edit-{seed}"]
        assert (lost["outcome"], lost["cause"], lost["reward_kind"], lost["violations"]) == (
            "terminated", "constraint_violated", "constraint_violation", 1)
        assert (kept["cause"], kept["reward_kind"], kept["quality"], kept["violations"]) == ("answered", "scored", 1.0, 0)
        assert kept["pins"] >= 1 and lost["pins"] == 0
        assert rows[f"window/needle-recall-{seed}"]["quality"] == 1.0
        assert rows[f"window/needle-recall-{seed}"]["repeated_tool_calls"] >= 1  # the needle was re-read


def test_snapshots_show_the_violation(small_run, tmp_path):
    from ctxkit.log.event_log import read_events
    from ctxkit.log.state import BlobStore, restore_snapshot

    _, out, _ = small_run
    for arm, changed in (("window", True), ("window+pins", False)):
        path = out / f"episodes/{arm}/constraint-edit-0.jsonl"
        snaps = [e for e in read_events(path) if isinstance(e, StateSnapshot)]
        assert len(snaps) >= 2 and snaps[0].after_event_id is None
        first, last = tmp_path / f"{arm}-first", tmp_path / f"{arm}-last"
        store = BlobStore.for_log(path)
        restore_snapshot(snaps[0], store, first)
        restore_snapshot(snaps[-1], store, last)
        assert ((first / "settings").read_bytes() != (last / "settings").read_bytes()) is changed
        assert (last / "settings-local").exists() is (not changed)


def test_every_log_replays_and_the_run_audits(small_run, capsys):
    _, out, _ = small_run
    logs = sorted((out / "episodes").rglob("*.jsonl"))
    assert len(logs) == 8
    for log in logs:
        assert main(["replay", "--verify", str(log)]) == 0, log
    capsys.readouterr()
    assert main(["audit", str(out)]) == 0
    assert "audit: ok" in capsys.readouterr().out


def test_report_files(small_run):
    _, out, _ = small_run
    text = (out / "report.md").read_text()
    for heading in ("## Arms", "## Ends", "## Difference against `window+pins`", "## Where time goes", "ctxkit replay --verify"):
        assert heading in text
    assert "| window | " in text and "terminated/constraint_violated: 2" in text
    for png in ("quality_vs_tokens.png", "latency_breakdown.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_rows_are_deterministic_and_process_workers_agree(small_run, tmp_path):
    cfg, out, _ = small_run
    run_experiment(cfg, tmp_path / "again", workers=2, progress=True, report=False)  # rich bar on stderr
    assert strip_timing(read_rows(tmp_path / "again")) == strip_timing(read_rows(out))


def _run_one(tmp_path, name, **kw):
    path = write_config(tmp_path, small_toml(seeds="[0]", **kw), f"{name}.toml")
    run_experiment(load_config(path), tmp_path / name, progress=False, report=False)
    return {r["episode_id"]: r for r in read_rows(tmp_path / name)}


def test_typed_ends_for_tool_failures_and_limits(tmp_path):
    tasks = """
[tasks.needle-recall]
n_files = 4
lines_per_file = 8
fault_at_call = 2
fault = "raise"
[tasks.multi-hop]
n_files = 4
lines_per_file = 8
fault_at_call = 1
fault = "timeout"
"""
    rows = _run_one(tmp_path, "faults", tasks=tasks)
    r = rows["window+pins/needle-recall-0"]
    assert (r["outcome"], r["cause"], r["reward"], r["reward_kind"], r["tool_errors"]) == (
        "terminated", "tool_failed", 0.0, "tool_failure", 1)
    assert r["steps"] == 3 and not r["completed"]
    r = rows["window+pins/multi-hop-0"]
    assert (r["outcome"], r["cause"], r["reward_kind"], r["timed_out"]) == ("terminated", "tool_timeout", "tool_failure", True)

    short = small_toml(seeds="[0]").replace("max_steps = 20", "max_steps = 3")
    run_experiment(load_config(write_config(tmp_path, short, "short.toml")), tmp_path / "short", progress=False, report=False)
    for r in read_rows(tmp_path / "short"):
        assert (r["outcome"], r["cause"], r["reward"], r["reward_kind"], r["steps"]) == (
            "truncated", "max_steps", None, "limit_truncation", 3)

    quick = small_toml(seeds="[0]").replace("wall_time_s = 120.0", "wall_time_s = 1e-9")
    run_experiment(load_config(write_config(tmp_path, quick, "quick.toml")), tmp_path / "quick", progress=False, report=False)
    for r in read_rows(tmp_path / "quick"):
        assert (r["outcome"], r["cause"], r["reward_kind"], r["steps"], r["timed_out"]) == (
            "truncated", "wall_time", "limit_truncation", 0, True)


def test_typed_ends_for_context_limits(tmp_path):
    arms = """
[[arms]]
name = "keep-all-error"
compressor = "keep-all"
[[arms]]
name = "keep-all-truncate"
compressor = "keep-all"
params = { on_overflow = "truncate" }
[[arms]]
name = "window+pins"
compressor = "window"
params = { keep_first = 1 }
"""
    rows = _run_one(tmp_path, "ctx", arms=arms)
    for arm in ("keep-all-error", "keep-all-truncate"):
        for task in ("constraint-edit", "needle-recall"):
            r = rows[f"{arm}/{task}-0"]
            assert (r["outcome"], r["cause"], r["reward"], r["reward_kind"], r["discarded"]) == (
                "truncated", "context_budget", None, "length_truncation", True)
            assert r["loss_tokens"] == 0 < r["generated_tokens"]
    # the policy's window is smaller than the builder's budget: the context outgrows it
    needle_only = "[tasks.needle-recall]\nn_files = 4\nlines_per_file = 8\n"
    text = small_toml(seeds="[0]", arms=arms, tasks=needle_only).replace("max_context = 900", "max_context = 500")
    run_experiment(load_config(write_config(tmp_path, text, "win.toml")), tmp_path / "win", progress=False, report=False)
    r = {r["episode_id"]: r for r in read_rows(tmp_path / "win")}["window+pins/needle-recall-0"]
    assert (r["outcome"], r["cause"], r["reward_kind"]) == ("truncated", "context_limit", "length_truncation")
    assert r["peak_context"] <= 500


def _episode_log(tmp_path):
    from ctxkit.log.event_log import EventLog

    work = tmp_path / "w"
    work.mkdir()
    ep = make_task("needle-recall").episode(0, work)
    log = EventLog.create(tmp_path / "ep.jsonl")
    return ep, log


def test_invalid_tool_call_is_a_task_failure_and_leaves_no_orphan(tmp_path):
    from ctxkit.events import Step
    from ctxkit.context.view import build_view, find_orphans

    ep, log = _episode_log(tmp_path)
    calls = (ToolCall(id="a", name="delete_everything", arguments="{}"),
             ToolCall(id="b", name="read_file", arguments='{"path": "logs/00.log"}'))
    turn = AgentTurn(token_ids=(1, 2), content="", tool_calls=calls, finish_reason="tool_calls")
    log.append(Step(token_ids=turn.token_ids, tool_calls=calls, context_hash="h"))
    end, _ = _act_on(log, ep, turn)
    assert (end.outcome, end.cause, end.reward, end.reward_kind) == ("terminated", "invalid_tool_call", 0.0, "task_failure")
    assert "unknown tool 'delete_everything'" in end.scores["error"]
    results = [e for e in log.events() if e.kind == "tool_result"]
    assert [(r.tool_call_id, r.status) for r in results] == [("a", "error"), ("b", "error")]
    assert results[1].content.startswith("not run")
    assert find_orphans(build_view(log.events()).messages) == []


def test_a_turn_cut_by_the_generation_limit_is_a_length_truncation(tmp_path):
    ep, log = _episode_log(tmp_path)
    end, _ = _act_on(log, ep, AgentTurn(token_ids=(1,) * 5, content="The code is K3", finish_reason="length"))
    assert (end.outcome, end.cause, end.reward, end.reward_kind) == ("truncated", "max_new_tokens", None, "length_truncation")
    end, _ = _act_on(log, ep, AgentTurn(token_ids=(1,), content=ep.facts["expected"], finish_reason="stop"))
    assert (end.outcome, end.cause, end.reward, end.reward_kind) == ("terminated", "answered", 1.0, "scored")


class _OutOfVocabulary:
    """A real (tiny) agent that answers with a token id no tokenizer has: the next build must refuse it."""

    name = "out-of-vocabulary"

    def act(self, context, *, tools, seed):
        return AgentTurn(token_ids=(10**9,), content="", finish_reason="tool_calls",
                         tool_calls=(ToolCall(id="c1", name="read_file", arguments='{"path": "logs/00.log"}'),))

    def close(self):
        pass


def test_a_library_error_ends_only_that_episode_as_harness_error(tmp_path):
    import time

    from ctxkit.context.builder import ContextBuilder
    from ctxkit.events import EpisodeStart, message_from_openai
    from ctxkit.experiment.config import EpisodeSpec
    from ctxkit.experiment.episode import _loop

    cfg = load_config(write_config(tmp_path, small_toml(seeds="[0]")))
    ep, log = _episode_log(tmp_path)
    builder = ContextBuilder(cfg.tokenizer, None, "window", 900)
    log.append(EpisodeStart(episode_id="x", tools=ep.tools, context=builder.describe()))
    log.extend([message_from_openai(m) for m in ep.messages])
    end = _loop(cfg, EpisodeSpec("window", "needle-recall", 0), log, builder, _OutOfVocabulary(), ep, [], time.perf_counter())
    assert (end.outcome, end.cause, end.reward, end.reward_kind) == ("truncated", "harness_error", None, "unscored")
    assert end.scores["error"].startswith("MessageFormatError:") and "token_ids" in end.scores["error"]


def test_two_runs_in_one_process_with_other_tokenizers_record_their_own_ids(tmp_path):
    """Regression: agents were cached per (agent label, task) for the life of the process, so a second run
    with another tokenizer reused an agent built for the first and recorded Qwen2.5 ids in a SmolLM2 log."""
    from conftest import tokenizer_dir
    from ctxkit.log.event_log import read_events
    from ctxkit.text.rendering.renderer import encode_assistant_turn
    from ctxkit.text.tokenizer.loader import load_tokenizer

    qwen = tokenizer_dir("qwen2.5-instruct")
    first = write_config(tmp_path, tiny_toml(), "qwen.toml")
    second = write_config(tmp_path, tiny_toml().replace(str(qwen), str(tokenizer_dir("smollm2-135m-instruct")))
                          .replace('name = "small"', 'name = "small"\ntemplate = "chatml-tools-v1"'), "smollm.toml")
    for name, path in (("qwen", first), ("smollm", second)):
        run_experiment(load_config(path), tmp_path / name, progress=False, report=False)
    (row,) = read_rows(tmp_path / "smollm")
    events = read_events(tmp_path / "smollm" / row["log"])
    smollm = load_tokenizer(events[0].context["tokenizer"]["spec"])
    assert smollm.id.startswith("smollm2-135m-instruct@")
    steps = [e for e in events if e.kind == "step"]
    assert steps
    for step in steps:
        message = {"role": "assistant", "content": step.content,
                   "tool_calls": [c.to_openai() for c in step.tool_calls] or None}
        message = {k: v for k, v in message.items() if v is not None}
        assert step.token_ids == tuple(encode_assistant_turn(message, smollm, "chatml-tools-v1", tools=list(events[0].tools)))
