"""Fault injection on the episode log: SIGKILLed writers, torn lines, concurrent appenders, corrupted lines."""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
import time

import orjson
import pytest

from ctxkit.cli.parser import main
from ctxkit.errors import LogFormatError, SchemaVersionError, TornLineError
from ctxkit.events import Message
from ctxkit.log.event_log import EventLog, read_events, repair, verify
from log_killer import body, kill_mid_append, writer_script

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and O_APPEND semantics")

WRITER = writer_script('durability="always"')
_body = body



@pytest.mark.slow
def test_sigkill_mid_append_loses_no_acknowledged_event(tmp_path, capsys):
    """30 writers killed at random times; odd rounds kill the moment the file grows, i.e. inside the
    `write` of a multi-megabyte line. Every acknowledged event survives and `verify --repair` restores a
    valid log each time. A fresh log every 5 rounds keeps the files small."""
    rng = random.Random(1234)
    torn_rounds = kept_total = acked_total = 0
    for round_no in range(30):
        if round_no % 5 == 0:
            path = tmp_path / f"ep{round_no // 5}.jsonl"
            EventLog.create(path, durability="always").close()
            acked: set[int] = set()
        acked.update(kill_mid_append([sys.executable, "-c", WRITER, str(path)], path,
                                     pause_s=rng.uniform(0.0, 0.05 if round_no % 2 else 0.1),
                                     wait_for_growth=bool(round_no % 2)))
        report = verify(path)
        assert report.ok or [p.code for p in report.problems] == ["torn"], report.problems
        torn_rounds += report.torn_tail
        assert main(["log", "verify", str(path), "--repair"]) == 0
        assert verify(path).ok
        events = read_events(path)
        assert [e.seq for e in events] == list(range(len(events)))
        assert acked <= {e.seq for e in events}, f"acknowledged events lost: {sorted(acked - {e.seq for e in events})}"
        if round_no % 5 == 4:
            for e in events:  # every surviving event is exactly what was written
                assert (e.tool_call_id, e.content, e.duration_s) == (f"c{e.seq}", _body(e.seq), e.seq / 3)
            kept_total += len(events)
            acked_total += len(acked)
    assert acked_total >= 5  # the writers made real progress between kills (not a vacuous check)
    with capsys.disabled():
        print(f"\n[sigkill] {acked_total} acknowledged events, {kept_total} kept, "
              f"{torn_rounds}/30 rounds left a torn tail (repaired)")


def _log_with(tmp_path, n, name="ep.jsonl"):
    path = tmp_path / name
    with EventLog.create(path, episode_id="ep") as log:
        log.extend(Message(role="user", content=f"msg-{i} é") for i in range(n))
    return path


def test_half_line_is_detected_and_repaired(tmp_path):
    path = _log_with(tmp_path, 6)
    original = path.read_bytes()
    lines = original.split(b"\n")[:-1]
    intact = b"".join(line + b"\n" for line in lines[:-1])  # header + 5 events
    half = lines[-1][: len(lines[-1]) // 2]
    path.write_bytes(intact + half)

    with pytest.raises(TornLineError) as info:
        EventLog.open(path)
    assert info.value.line == 7 and f"{path}:7:" in str(info.value)
    with pytest.raises(TornLineError):
        read_events(path)
    assert [e.content for e in read_events(path, allow_torn=True)] == [f"msg-{i} é" for i in range(5)]
    report = verify(path)
    assert (report.ok, report.torn_tail, report.torn_bytes, report.n_events) == (False, True, len(half), 5)
    assert [(p.line, p.code) for p in report.problems] == [(7, "torn")]

    fixed = repair(path)
    assert (fixed.removed_bytes, fixed.completed_line, fixed.n_events) == (len(half), False, 5)
    assert path.read_bytes() == intact
    assert (tmp_path / "ep.jsonl.torn").read_bytes() == half  # nothing is lost
    assert verify(path).ok
    with EventLog.open(path) as log:
        assert log.append(Message(role="user", content="after")).seq == 5
    assert verify(path).ok


def test_tail_missing_only_its_newline_is_completed_not_dropped(tmp_path):
    path = _log_with(tmp_path, 4)
    original = path.read_bytes()
    path.write_bytes(original[:-1])
    fixed = repair(path)
    assert (fixed.removed_bytes, fixed.completed_line, fixed.side_file, fixed.n_events) == (0, True, None, 4)
    assert path.read_bytes() == original


def test_open_with_repair_and_repeated_side_files(tmp_path):
    path = _log_with(tmp_path, 2)
    with open(path, "ab") as fh:
        fh.write(b'{"kind": "message", "con')
    with EventLog.open(path, repair=True) as log:
        assert len(log) == 2
        log.append(Message(role="user", content="x"))
    with open(path, "ab") as fh:
        fh.write(b"\x00\x00garbage")
    assert repair(path).side_file == str(tmp_path / "ep.jsonl.torn.1")
    assert (tmp_path / "ep.jsonl.torn").read_bytes() == b'{"kind": "message", "con'
    assert (tmp_path / "ep.jsonl.torn.1").read_bytes() == b"\x00\x00garbage"
    assert len(read_events(path)) == 3 and verify(path).ok


def test_torn_header(tmp_path):
    path = tmp_path / "ep.jsonl"
    path.write_bytes(b'{"ctxkit_log": 1, "episo')
    assert [(p.line, p.code) for p in verify(path).problems] == [(1, "torn")]
    assert repair(path).removed_bytes == 24
    with pytest.raises(LogFormatError, match=r"ep\.jsonl:1: empty log: no header line"):
        EventLog.open(path)


def test_append_after_another_writer_tore_the_tail(tmp_path):
    path = _log_with(tmp_path, 3)
    log = EventLog.open(path)
    other = EventLog.open(path)
    other.append(Message(role="user", content="from other"))
    with open(path, "ab") as fh:  # another writer died mid-line
        fh.write(b'{"content":"half')
    with pytest.raises(TornLineError) as info:
        log.append(Message(role="user", content="mine"))
    assert info.value.line == 6
    repair(path)
    assert log.append(Message(role="user", content="mine")).seq == 4
    assert [e.content for e in read_events(path)][-2:] == ["from other", "mine"]
    log.close(), other.close()


def test_handle_opened_with_repair_fixes_a_tail_torn_by_another_writer(tmp_path):
    path = _log_with(tmp_path, 2)
    log = EventLog.open(path, repair=True)
    with EventLog.open(path) as other:
        other.append(Message(role="user", content="from other"))
    with open(path, "ab") as fh:
        fh.write(b'{"content":"half')
    assert log.append(Message(role="user", content="mine")).seq == 3
    assert (tmp_path / "ep.jsonl.torn").read_bytes() == b'{"content":"half'
    with EventLog.open(path) as other:  # a tail lacking only its newline is completed and read, not dropped
        whole = other.append(Message(role="user", content="whole"))
    path.write_bytes(path.read_bytes()[:-1])
    assert log.append(Message(role="user", content="next")).seq == 5
    assert log.events()[4] == whole
    assert [e.content for e in read_events(path)] == ["msg-0 é", "msg-1 é", "from other", "mine", "whole", "next"]
    log.close()


FSIZE_WRITER = r"""
import resource, signal, sys, os
from ctxkit.events import Message
from ctxkit.log.event_log import EventLog
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
log = EventLog.open(sys.argv[1], durability="always")
size = os.path.getsize(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 1000, resource.RLIM_INFINITY))
try:
    log.append(Message(role="user", content="x" * 5000))
except OSError as exc:
    print("failed", exc.errno, flush=True)
print("size", os.path.getsize(sys.argv[1]) - size, flush=True)
log.append(Message(role="user", content="small"))
print("ok", len(log), flush=True)
"""


def test_failed_write_leaves_no_partial_line(tmp_path):
    """A real short write (file-size limit hit mid-line) is rolled back, so the log stays valid."""
    path = _log_with(tmp_path, 2)
    out = subprocess.run([sys.executable, "-c", FSIZE_WRITER, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["failed 27", "size 0", "ok 3"]
    assert verify(path).ok
    assert [e.content for e in read_events(path)] == ["msg-0 é", "msg-1 é", "small"]


APPENDER = r"""
import os, sys, time
from ctxkit.events import Message
from ctxkit.log.event_log import EventLog
path, k, n, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
log = EventLog.open(path)
while not os.path.exists(go):
    time.sleep(0.001)
i = 0
while i < n:
    if i % 10 == 8:
        log.extend([Message(role="user", content=f"w{k}-{i}"), Message(role="user", content=f"w{k}-{i + 1}")])
        i += 2
    else:
        log.append(Message(role="user", content=f"w{k}-{i}"))
        i += 1
log.close()
"""


@pytest.mark.parametrize("writers", [2, 4])
def test_concurrent_appenders_keep_a_dense_valid_chain(tmp_path, writers):
    n = 150
    path = tmp_path / "ep.jsonl"
    EventLog.create(path).close()
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(path), str(k), str(n), str(go)]) for k in range(writers)]
    time.sleep(1.0)
    go.touch()
    assert [p.wait(timeout=120) for p in procs] == [0] * writers
    assert verify(path).ok
    events = read_events(path)
    assert [e.seq for e in events] == list(range(writers * n))
    contents = [e.content for e in events]
    for k in range(writers):
        mine = [c for c in contents if c.startswith(f"w{k}-")]
        assert mine == [f"w{k}-{i}" for i in range(n)]
    for k in range(writers):  # a batch is never split by another writer's lines
        for i in range(8, n, 10):
            j = contents.index(f"w{k}-{i}")
            assert contents[j + 1] == f"w{k}-{i + 1}"
    interleaved = sum(1 for a, b in zip(contents, contents[1:]) if a.split("-")[0] != b.split("-")[0])
    assert interleaved > 0  # the writers really ran side by side


# ------------------------------------------------------------------------------------------- corrupted lines


def _lines(path):
    return path.read_bytes().split(b"\n")[:-1]


def _write_lines(path, lines):
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def _rehash_header(obj):
    obj.pop("hash", None)
    digest = hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return orjson.dumps({**obj, "hash": digest})


def _first_error(path):
    with pytest.raises(LogFormatError) as info:
        EventLog.open(path)
    with pytest.raises(LogFormatError) as again:
        read_events(path)
    assert str(again.value) == str(info.value)
    return info.value


def _problems(path):
    return [(p.line, p.code) for p in verify(path).problems]


def test_edited_byte_names_its_line(tmp_path):
    path = _log_with(tmp_path, 10)
    lines = _lines(path)
    lines[5] = lines[5].replace(b"msg-4", b"msg-X")  # line 6 holds seq 4
    _write_lines(path, lines)
    err = _first_error(path)
    assert (err.line, err.path) == (6, str(path)) and "edited" in str(err)
    assert _problems(path) == [(6, "hash")]
    before = path.read_bytes()
    with pytest.raises(LogFormatError, match=r":6: .*repair only fixes a torn last line"):
        repair(path)
    assert path.read_bytes() == before
    assert main(["log", "verify", str(path), "--repair"]) == 1


def test_deleted_line_breaks_the_chain_there(tmp_path):
    path = _log_with(tmp_path, 10)
    lines = _lines(path)
    del lines[5]
    _write_lines(path, lines)
    err = _first_error(path)
    assert err.line == 6 and "hash chain broken" in str(err)
    assert _problems(path)[0] == (6, "chain")


def test_swapped_lines(tmp_path):
    path = _log_with(tmp_path, 10)
    lines = _lines(path)
    lines[4], lines[5] = lines[5], lines[4]
    _write_lines(path, lines)
    assert _first_error(path).line == 5
    assert _problems(path) == [(5, "chain"), (6, "chain"), (7, "chain")]


def test_duplicated_and_blank_lines(tmp_path):
    path = _log_with(tmp_path, 6)
    lines = _lines(path)
    _write_lines(path, lines[:4] + [lines[3]] + lines[4:])
    assert _first_error(path).line == 5
    _write_lines(path, lines[:4] + [b""] + lines[4:])
    assert _first_error(path).line == 5 and _problems(path)[0] == (5, "empty")


def test_bad_json_mid_file(tmp_path):
    path = _log_with(tmp_path, 10)
    lines = _lines(path)
    lines[3] = lines[3][:40]
    _write_lines(path, lines)
    err = _first_error(path)
    assert err.line == 4 and "invalid JSON" in str(err)
    assert _problems(path) == [(4, "json")]
    lines[3] = b"[1, 2]"
    _write_lines(path, lines)
    assert "expected a JSON object, got list" in str(_first_error(path))


def _rechain(lines, start):
    """Recompute `prev`/`hash` from line index `start` on, as a writer of these lines would have."""
    prev = orjson.loads(lines[start - 1])["hash"]
    for i in range(start, len(lines)):
        obj = orjson.loads(lines[i])
        obj.pop("prev"), obj.pop("hash")
        body = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
        prev = hashlib.sha256(prev.encode() + body).hexdigest()
        lines[i] = orjson.dumps({**obj, "prev": orjson.loads(lines[i - 1])["hash"], "hash": prev})


def test_unknown_kind_with_a_valid_chain(tmp_path):
    """A line from a newer writer (a kind this version does not know) is named, though its chain is intact."""
    path = _log_with(tmp_path, 4)
    lines = _lines(path)
    lines[2] = orjson.dumps({**orjson.loads(lines[2]), "kind": "telepathy"})
    _rechain(lines, 2)
    _write_lines(path, lines)
    err = _first_error(path)
    assert err.line == 3 and "unknown event kind 'telepathy'" in str(err)
    assert _problems(path) == [(3, "event")]


@pytest.mark.parametrize("version", [99, 0, "1", True])
def test_wrong_schema_version(tmp_path, version):
    path = _log_with(tmp_path, 3)
    lines = _lines(path)
    lines[0] = _rehash_header({**orjson.loads(lines[0]), "ctxkit_log": version})
    _write_lines(path, lines)
    with pytest.raises(SchemaVersionError) as info:
        EventLog.open(path)
    assert info.value.line == 1 and f"schema version {version!r}; this ctxkit reads version 1" in str(info.value)
    assert _problems(path)[0] == (1, "schema")


def test_edited_header_and_foreign_files(tmp_path):
    path = _log_with(tmp_path, 3)
    lines = _lines(path)
    lines[0] = lines[0].replace(b'"episode_id":"ep"', b'"episode_id":"eq"')
    _write_lines(path, lines)
    err = _first_error(path)
    assert err.line == 1 and "header does not match its hash" in str(err)
    assert _problems(path) == [(1, "hash")]  # later lines still chain to the recorded header hash

    other = tmp_path / "other.jsonl"
    other.write_bytes(b'{"a": 1}\n')
    assert "not a ctxkit log" in str(_first_error(other))
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert _first_error(empty).line == 1
    assert _problems(empty) == [(1, "empty")]


def test_an_empty_log_file_says_so_everywhere(tmp_path):
    from ctxkit.log.event_log import iter_events, read_header

    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    message = rf"{empty}:1: empty log: no header line"
    for read in (read_header, read_events, lambda p: list(iter_events(p)), EventLog.open, repair,
                 lambda p: EventLog.open(p, lock="writer")):
        with pytest.raises(LogFormatError, match=message) as info:
            read(empty)
        assert type(info.value) is LogFormatError and info.value.path == str(empty) and info.value.line == 1
    assert [(p.line, p.code, p.message.split(" (")[0]) for p in verify(empty).problems] == [(1, "empty", "empty log: no header line")]
