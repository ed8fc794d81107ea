"""Reading a log streams: `iter_events` and `verify` hold one line at a time, not the file (a tracemalloc
bound on a many-megabyte log), and `iter_events` checks every line and the chain as `read_events` does."""

from __future__ import annotations

import tracemalloc

import pytest

from ctxkit.errors import LogFormatError, TornLineError
from ctxkit.events import Message, ToolResult
from ctxkit.log.event_log import EventLog, iter_events, read_events, verify

N_EVENTS = 4000
CONTENT = 2000  # characters of tool output per event: ~2.2 KB lines, ~9 MB of log


@pytest.fixture(scope="module")
def big_log(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "ep.jsonl"
    with EventLog.create(path, durability="none") as log:
        for start in range(0, N_EVENTS, 500):
            log.extend(ToolResult(tool_call_id=f"c{i}", content=f"{i:08d}" + "x" * (CONTENT - 8)) for i in range(start, start + 500))
    return path


def _peak(fn):
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_iterating_a_big_log_holds_one_line_not_the_file(big_log):
    size = big_log.stat().st_size
    assert size > 8_000_000

    def walk():
        n = 0
        for n, event in enumerate(iter_events(big_log), 1):
            assert event.tool_call_id == f"c{n - 1}"
        return n

    n, peak = _peak(walk)
    assert n == N_EVENTS
    assert peak < 1_000_000, f"streaming {size} bytes peaked at {peak} bytes"


def test_verifying_a_big_log_holds_one_line_not_the_file(big_log):
    report, peak = _peak(lambda: verify(big_log))
    assert report.ok and report.n_events == N_EVENTS
    assert peak < 1_000_000, f"verifying {big_log.stat().st_size} bytes peaked at {peak} bytes"


def test_reading_every_event_keeps_them_all(big_log):
    # the contrast: read_events returns every event, so its memory grows with the file
    events, peak = _peak(lambda: read_events(big_log))
    assert len(events) == N_EVENTS and peak > N_EVENTS * CONTENT


def _small_log(tmp_path, n=5):
    path = tmp_path / "ep.jsonl"
    with EventLog.create(path) as log:
        log.extend(Message(role="user", content=f"m{i}") for i in range(n))
    return path


def test_iter_events_is_read_events_one_at_a_time(tmp_path):
    path = _small_log(tmp_path)
    assert tuple(iter_events(path)) == read_events(path)
    assert [e.content for e in iter_events(path)] == [f"m{i}" for i in range(5)]


def test_iter_events_raises_where_the_problem_is(tmp_path):
    path = _small_log(tmp_path)
    lines = path.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b'"m2"', b'"mX"')  # line 4 holds event 2
    path.write_bytes(b"\n".join(lines))
    stream = iter_events(path)
    assert [e.content for e in (next(stream), next(stream))] == ["m0", "m1"]
    with pytest.raises(LogFormatError, match=r"ep.jsonl:4: ") as info:
        next(stream)
    assert "edited" in str(info.value)


def test_iter_events_and_a_torn_tail(tmp_path):
    path = _small_log(tmp_path, 3)
    with open(path, "ab") as fh:
        fh.write(b'{"seq":3,"kind":"mess')
    with pytest.raises(TornLineError, match=r"ep.jsonl:5: last line is incomplete"):
        list(iter_events(path))
    assert [e.content for e in iter_events(path, allow_torn=True)] == ["m0", "m1", "m2"]


def test_iter_events_of_files_that_are_not_logs(tmp_path):
    with pytest.raises(LogFormatError, match="no such log file"):
        list(iter_events(tmp_path / "missing.jsonl"))
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(LogFormatError, match="empty log: no header line"):
        list(iter_events(tmp_path / "empty.jsonl"))
    (tmp_path / "half.jsonl").write_bytes(b'{"ctxkit_log": 1')
    with pytest.raises(TornLineError, match="header line is incomplete"):
        list(iter_events(tmp_path / "half.jsonl"))
