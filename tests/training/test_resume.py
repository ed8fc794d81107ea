"""Resume: interrupt episodes anywhere (between units, mid tool call, with a torn tail, between a tool
result and its snapshot), resume from the log alone, continue with the same deterministic driver, and get
the same contexts and the same final external state as an uninterrupted run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import tokenizer_dir
from rollout_driver import Driver, step_hashes
from ctxkit.context.builder import ContextBuilder
from ctxkit.errors import ConfigError
from ctxkit.events import EpisodeEnd, StateSnapshot, Step, ToolResult, event_to_dict
from ctxkit.log.event_log import EventLog, read_events
from ctxkit.training.context_replay import resume

SETUPS = {
    "keep-all": ({}, 4096),
    # event ids are random per run, so the placeholder leaves them out to make two runs comparable
    "mask-observations": ({"keep_last": 2, "placeholder": "[tool output masked: {n_tokens} tokens]"}, 480),
    "window": ({"keep_last": 2}, 440),
}


def builder_for(compressor: str) -> ContextBuilder:
    params, budget = SETUPS[compressor]
    return ContextBuilder(str(tokenizer_dir("qwen2.5-instruct")), compressor=compressor, params=params, budget=budget)


def normalized(events) -> list[dict]:
    """Events without ids/timestamps and without snapshot bookkeeping (a resume may add a snapshot)."""
    out = []
    for e in events:
        if isinstance(e, StateSnapshot):
            continue
        d = event_to_dict(e)
        for k in ("seq", "id", "ts", "pin_id", "source_event_id"):  # ids are random per run
            d.pop(k, None)
        if d["kind"] == "compaction":
            d["edits"] = [{k: v for k, v in ed.items() if k not in ("event_id", "event_ids")} for ed in d["edits"]]
        out.append(d)
    return out


def uninterrupted(tmp: Path, compressor: str, n_turns: int):
    work = tmp / "work-full"
    work.mkdir()
    log = EventLog.create(tmp / "full.jsonl", episode_id="ep-r")
    Driver(n_turns=n_turns, seed=11, workdir=work, episode_id="ep-r").run(log, builder_for(compressor))
    return log.events(), (work / "notes.txt").read_text()


class CrashAfterResult(Driver):
    """Crashes between appending a tool result and snapshotting the state it left."""

    def snapshot(self, log) -> None:
        if any(isinstance(e, ToolResult) for e in log.events()):
            raise KeyboardInterrupt("crash before the snapshot")
        super().snapshot(log)


def interrupted(tmp: Path, compressor: str, n_turns: int, units: int, mode: str):
    work = tmp / "work"
    work.mkdir()
    path = tmp / "cut.jsonl"
    log = EventLog.create(path, episode_id="ep-r")
    cls = CrashAfterResult if mode == "before-snapshot" else Driver
    try:
        cls(n_turns=n_turns, seed=11, workdir=work, episode_id="ep-r").run(log, builder_for(compressor), max_units=units)
    except KeyboardInterrupt:
        pass
    log.close()
    events = read_events(path)
    if mode == "mid-tool":
        # the policy's call is recorded; the tool half-ran before the crash and left junk behind
        assert isinstance(events[-1], Step) and events[-1].tool_calls
        with open(work / "notes.txt", "a") as fh:
            fh.write("half-written li")
        (work / "scratch.tmp").write_text("junk")
    if mode == "torn":
        with open(path, "ab") as fh:
            fh.write(b'{"kind":"step","seq":')
    return path, work


def continue_from(path: Path, work: Path, n_turns: int):
    state = resume(path, targets={"workdir": work})
    driver = Driver(n_turns=n_turns, seed=state.seed, workdir=work, episode_id=state.episode_id)
    log = EventLog.open(path)
    for result in state.unsnapshotted_results:  # re-apply effects the restored snapshot does not hold
        call = next(tc for e in log.events() if isinstance(e, Step) for tc in e.tool_calls if tc.id == result.tool_call_id)
        args = json.loads(call.arguments)
        with open(work / args["file"], "a", encoding="utf-8") as fh:
            fh.write(args["text"] + "\n")
    if state.unsnapshotted_results:
        driver.snapshot(log)
    for call in state.pending_tool_calls:
        driver.run_tool(log, call)
    assert sum(isinstance(e, Step) for e in log.events()) == state.next_step
    driver.run(log, state.builder)
    return state, log.events(), (work / "notes.txt").read_text()


def check(tmp: Path, compressor: str, n_turns: int, units: int, mode: str):
    full_events, full_text = uninterrupted(tmp, compressor, n_turns)
    path, work = interrupted(tmp, compressor, n_turns, units, mode)
    state, events, text = continue_from(path, work, n_turns)
    assert step_hashes(events) == step_hashes(full_events)
    assert normalized(events) == normalized(full_events)
    assert text == full_text
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]
    return state, full_events


@pytest.mark.parametrize("compressor", sorted(SETUPS))
def test_resume_at_every_cut_point(tmp_path, compressor):
    n_turns = 5
    total = 1 + n_turns + (n_turns - 1) + 1
    for units in range(1, total):
        sub = tmp_path / f"cut{units}"
        sub.mkdir()
        state, full = check(sub, compressor, n_turns, units, "plain")
        assert state.repaired is None and state.seed == 11
    if compressor != "keep-all":
        assert any(e.kind == "compaction" for e in full), "no compaction: the sweep would not cover one"


def test_resume_mid_tool_call_restores_and_reruns_the_call(tmp_path):
    state, _ = check(tmp_path, "mask-observations", 5, units=4, mode="mid-tool")  # start, s0, tool0, s1
    assert [tc.id for tc in state.pending_tool_calls] == ["call_0001"]
    assert state.next_step == 2 and state.restored["workdir"].removed >= 1  # the junk file is gone


def test_resume_repairs_a_torn_tail(tmp_path):
    state, _ = check(tmp_path, "keep-all", 4, units=5, mode="torn")
    assert state.repaired is not None and state.repaired.removed_bytes == len(b'{"kind":"step","seq":')


def test_resume_after_crash_between_result_and_snapshot(tmp_path):
    state, _ = check(tmp_path, "keep-all", 4, units=3, mode="before-snapshot")
    assert [r.tool_call_id for r in state.unsnapshotted_results] == ["call_0000"]
    assert not state.pending_tool_calls


def test_resume_reports_pins_sampler_and_end(tmp_path):
    events, _ = uninterrupted(tmp_path, "keep-all", 3)
    shutil.copytree(tmp_path / "work-full", tmp_path / "target")
    state = resume(tmp_path / "full.jsonl", targets={"workdir": tmp_path / "target"})
    assert isinstance(state.ended, EpisodeEnd) and state.next_step == 3
    assert [p.text for p in state.pins] == ["Do not delete notes.txt."]
    assert state.sampler == {"seed": 11, "temperature": 0.7, "top_p": 0.95}
    assert state.builder.describe() == next(e for e in events if e.kind == "episode_start").context
    with pytest.raises(ConfigError, match=r"pass targets= for the directory state\(s\) \['workdir'\]"):
        resume(tmp_path / "full.jsonl")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    compressor=st.sampled_from(sorted(SETUPS)),
    n_turns=st.integers(2, 6),
    cut=st.floats(0.0, 1.0),
    mode=st.sampled_from(["plain", "torn", "mid-tool", "before-snapshot"]),
)
def test_resume_property(tmp_path_factory, compressor, n_turns, cut, mode):
    tmp = tmp_path_factory.mktemp("prop")
    total = 1 + n_turns + (n_turns - 1) + 1
    if mode == "mid-tool":
        units = 2 * (1 + int(cut * (n_turns - 2)))  # right after a step that calls the tool
    elif mode == "before-snapshot":
        units = 3 + 2 * int(cut * (n_turns - 2))  # the crash hits the tool unit's snapshot
    else:
        units = 1 + int(cut * (total - 2))
    check(tmp, compressor, n_turns, units, mode)
