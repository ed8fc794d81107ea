"""The log at disk speed: the fast sequencer gives exactly what the slow one did, durability `none` buffers
under the writers' lock, and a killed writer loses exactly what its mode says (see `ctxkit.log.event_log`)."""

from __future__ import annotations

import signal
import subprocess
import sys

import orjson
import pytest

from ctxkit.benchmarks.log_bench import bench_events, run, table
from ctxkit.events import (EpisodeEnd, EpisodeStart, Message, Step, ToolCall, ToolResult, event_from_dict, event_id,
                           event_to_dict)
from ctxkit.log.event_log import EventLog, read_events, verify
from ctxkit.log.locks import WriterLock
from ctxkit.log.sequencer import event_dict, stamp

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and flock")

EVENTS = [
    EpisodeStart(episode_id="x", tools=({"type": "function", "function": {"name": "f"}},), task={"seed": 3}),
    Message(role="system", content="be brief"),
    Message(role="user", content=({"type": "text", "text": "a"}, {"type": "text", "text": "b"})),
    Message(role="assistant", content=None, tool_calls=(ToolCall(id="c1", name="f", arguments="{}"),), extra={"k": [1]}),
    ToolResult(tool_call_id="c1", content="out", duration_s=0.5),
    Step(token_ids=(1, 2, 3), logprobs=(-0.5, -0.25, 0.0), timings={"decode": 1.0}),
    Step(),
    Message(role="user", content="given ts", ts=7.0),
    EpisodeEnd(outcome="terminated", reward=1.0, reward_kind="scored", scores={"q": 0.5}),
]


def test_fast_event_dict_is_event_to_dict():
    for event in EVENTS:
        assert event_dict(event) == event_to_dict(event)
        assert list(event_dict(event)) == list(event_to_dict(event))  # same key order: the line keeps it


def test_stamp_gives_the_ids_and_recorded_copies_of_the_slow_path():
    for (recorded, as_dict, body), event in zip(stamp(EVENTS, 10, 3.5), EVENTS):
        assert recorded.id == event_id(event, recorded.seq)
        assert recorded == event_from_dict(orjson.loads(body))  # exactly what a reader gets back
        assert type(recorded) is type(event) and as_dict == event_to_dict(recorded)
    assert [r.seq for r, _, _ in stamp(EVENTS, 10, 3.5)] == list(range(10, 19))
    assert [r.ts for r, _, _ in stamp(EVENTS, 0, 3.5)] == [3.5] * 7 + [7.0, 3.5]


def test_none_buffers_until_flush_and_holds_the_lock_meanwhile(tmp_path):
    path = tmp_path / "ep.jsonl"
    log = EventLog.create(path, durability="none")
    size = path.stat().st_size
    first = log.append(Message(role="user", content="one"))
    log.extend([Message(role="user", content="two"), Message(role="user", content="three")])
    assert path.stat().st_size == size and read_events(path) == ()  # nothing written yet
    assert [e.content for e in log.events()] == ["one", "two", "three"]  # the object sees its own events
    other = WriterLock(path)
    assert other.acquire(blocking=False) is False  # the buffer is held under the writers' lock
    log.flush()
    assert read_events(path) == log.events() and read_events(path)[0] == first
    assert other.acquire(blocking=False) is True  # written: the lock is free again
    other.release()
    log.append(Message(role="user", content="four"))
    log.close()
    other.close()
    assert [e.content for e in read_events(path)] == ["one", "two", "three", "four"] and verify(path).ok


def test_refresh_and_close_write_the_buffer(tmp_path):
    path = tmp_path / "ep.jsonl"
    with EventLog.create(path, durability="none") as log:
        log.append(Message(role="user", content="a"))
        assert log.refresh() == read_events(path)
        log.append(Message(role="user", content="b"))
    assert [e.content for e in read_events(path)] == ["a", "b"]


def test_a_second_handle_in_this_process_does_not_wait_on_a_buffering_one(tmp_path):
    path = tmp_path / "ep.jsonl"
    EventLog.create(path).close()
    a = EventLog.open(path, durability="none")
    b = EventLog.open(path)
    a.append(Message(role="user", content="a1"))
    a.append(Message(role="user", content="a2"))
    b.append(Message(role="user", content="b1"))  # makes `a` write its buffer and let go, then appends
    a.append(Message(role="user", content="a3"))  # `a` reads b1 before buffering again
    a.close(), b.close()
    events = read_events(path)
    assert [e.content for e in events] == ["a1", "a2", "b1", "a3"] and [e.seq for e in events] == [0, 1, 2, 3]
    assert verify(path).ok


def test_a_dropped_handle_writes_its_buffer(tmp_path):
    path = tmp_path / "ep.jsonl"
    log = EventLog.create(path, durability="none")
    log.append(Message(role="user", content="kept"))
    del log
    assert [e.content for e in read_events(path)] == ["kept"]


KILLED = r"""
import os, signal, sys
from ctxkit.events import Message
from ctxkit.log.event_log import EventLog
log = EventLog.open(sys.argv[1], durability=sys.argv[2])
for i in range(5):
    log.append(Message(role="user", content=f"m{i}"))
if sys.argv[2] == "none":
    log.flush()
for i in range(5, 8):
    log.append(Message(role="user", content=f"m{i}"))
print("acked", len(log), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("mode, kept", [("none", 5), ("batch", 8), ("always", 8)])
def test_what_a_killed_writer_loses(tmp_path, mode, kept):
    """`none` loses the events after its last flush (never a gap or a broken chain); `batch` and `always`
    lose nothing acknowledged to a killed process."""
    path = tmp_path / "ep.jsonl"
    EventLog.create(path).close()
    proc = subprocess.run([sys.executable, "-c", KILLED, str(path), mode], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "acked 8\n"
    assert verify(path).ok
    assert [e.content for e in read_events(path)] == [f"m{i}" for i in range(kept)]
    with EventLog.open(path) as log:  # the killed writer's lock died with it
        assert log.append(Message(role="user", content="next")).seq == kept


def test_reads_stream_and_count_without_keeping_events(tmp_path):
    path = tmp_path / "ep.jsonl"
    with EventLog.create(path, durability="none") as log:
        log.extend(bench_events(300))
    report = verify(path)
    assert report.ok and report.n_events == 300
    assert [e.tool_call_id for e in read_events(path)] == [f"call_{i:06d}" for i in range(300)]


@pytest.mark.parametrize("rounds", [1, 2])
def test_bench_log_runs_every_arm(tmp_path, rounds):
    result = run(30, fsync_events=4, folder=str(tmp_path), rounds=rounds)
    assert [(a.name, a.events, a.lock) for a in result.arms] == [
        ("append none", 30, "append"), ("append none [writer]", 30, "writer"),
        ("append batch", 30, "append"), ("append batch [writer]", 30, "writer"),
        ("append always", 4, "append"), ("append always [writer]", 4, "writer"),
        ("extend batch", 30, "append"), ("extend batch [writer]", 30, "writer"),
        ("bare chained", 30, ""), ("bare chained write", 30, ""), ("bare write+fsync", 4, "")]
    names = ["always time / bare write+fsync time", "batch / bare chained", "batch / bare chained write", "extend / bare chained",
             "none / bare chained"]
    assert sorted(result.ratios) == sorted(result.cpu_ratios) == sorted(names + [n + " [writer]" for n in names])
    text = table(result)
    assert [line.split()[-2:] for line in text.split("\n") if line.startswith("ratio")] == [["lock=append", "lock=writer"]]
    assert list(tmp_path.iterdir()) == []  # the logs are removed
    assert all(400 <= a.bytes_per_event <= 500 for a in result.arms)  # ~450-byte lines
    assert result.rounds == rounds and all(a.cpu_seconds >= 0 for a in result.arms)
    assert sorted(result.to_dict()) == ["arms", "cpu_ratios", "folder", "ratios", "rounds"]
