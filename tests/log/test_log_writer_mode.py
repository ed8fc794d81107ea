"""`lock="writer"`: one handle owns a log from open to close. Other writers (in this process or another) are
refused with `LogLockedError` naming the holder, nothing interleaves, a SIGKILLed owner loses nothing
acknowledged and lets go, and readers never hang behind an idle owner (see `ctxkit.log.locks`)."""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import threading
import time

import pytest

from ctxkit.cli.parser import main
from ctxkit.errors import ConfigError, LogFormatError, LogLockedError, TornLineError
from ctxkit.events import Message
from ctxkit.log.event_log import EventLog, iter_events, read_events, repair, verify
from ctxkit.log import locks as log_locks
from ctxkit.log.locks import lock_path
from log_killer import body, kill_mid_append, writer_script

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and flock")


def _msgs(n, tag="m"):
    return [Message(role="user", content=f"{tag}{i}", ts=float(i)) for i in range(n)]


@pytest.mark.parametrize("durability", ["none", "batch", "always"])
def test_writer_mode_records_what_append_mode_records(tmp_path, durability):
    """Same events, same ids, same recorded copies and a valid chain in both lock modes; `extend` too."""
    logs = {}
    for lock in ("append", "writer"):
        path = tmp_path / f"{lock}.jsonl"
        with EventLog.create(path, episode_id="ep", durability=durability, lock=lock) as log:
            assert log.lock == lock and repr(log).endswith(f"lock={lock!r})")
            recorded = [log.append(e) for e in _msgs(5)] + log.extend(_msgs(3, "x"))
            assert list(log.events()) == recorded
        assert verify(path).ok
        logs[lock] = read_events(path)
        assert list(logs[lock]) == recorded
    assert [e.id for e in logs["writer"]] == [e.id for e in logs["append"]]
    assert [e.content for e in logs["writer"]] == [f"m{i}" for i in range(5)] + [f"x{i}" for i in range(3)]


def test_reopening_in_writer_mode_continues_the_chain(tmp_path):
    path = tmp_path / "ep.jsonl"
    with EventLog.create(path, lock="writer") as log:
        log.extend(_msgs(3))
    with EventLog.open(path, lock="writer") as log:
        assert len(log) == 3 and log.append(Message(role="user", content="more")).seq == 3
    assert [e.content for e in read_events(path)] == ["m0", "m1", "m2", "more"]
    assert lock_path(path).read_bytes() == b""  # the holder record is cleared at close


def test_bad_lock_mode_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"lock='exclusive'; expected one of \['append', 'writer'\]"):
        EventLog.create(tmp_path / "ep.jsonl", lock="exclusive")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(LogFormatError, match=r"missing\.jsonl: no such log file"):
        EventLog.open(tmp_path / "missing.jsonl", lock="writer")
    assert list(tmp_path.iterdir()) == []


def test_every_other_writer_in_this_process_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(log_locks, "IN_FLIGHT_WAIT_S", 0.2)
    path = tmp_path / "ep.jsonl"
    owner = EventLog.create(path, lock="writer")
    owner.append(Message(role="user", content="mine"))
    with pytest.raises(LogLockedError) as info:
        EventLog.open(path, lock="writer")
    assert info.value.path == str(path) and info.value.holder.startswith(f"pid {os.getpid()} on ")
    assert str(info.value).startswith(f"{path}: another writer holds this log (pid {os.getpid()} on ")
    other = EventLog.open(path)  # opening to read is fine; appending is refused at once, never a wait
    assert [e.content for e in other.events()] == ["mine"]
    with pytest.raises(LogLockedError, match=r"lock='writer' holds this log until it closes \(pid "):
        other.append(Message(role="user", content="theirs"))
    with pytest.raises(LogLockedError):
        other.extend(_msgs(2))
    with open(path, "ab") as fh:  # a torn tail (written behind the owner's back): repair is refused too
        fh.write(b'{"half')
    with pytest.raises(LogLockedError):
        repair(path)
    with pytest.raises(LogLockedError):
        EventLog.open(path, repair=True)
    os.truncate(path, path.stat().st_size - 6)
    owner.close()
    assert other.append(Message(role="user", content="theirs")).seq == 1  # released at close
    other.close()
    assert [e.content for e in read_events(path)] == ["mine", "theirs"]


def test_a_dropped_owner_lets_go(tmp_path):
    path = tmp_path / "ep.jsonl"
    log = EventLog.create(path, lock="writer", durability="none")
    log.extend(_msgs(2))
    del log
    gc.collect()
    with EventLog.open(path, lock="writer") as again:  # the buffer was written and the lock released
        assert [e.content for e in again.events()] == ["m0", "m1"]


HOLDER = r"""
import sys
from ctxkit.events import Message
from ctxkit.log.event_log import EventLog
log = EventLog.open(sys.argv[1], lock="writer")
log.append(Message(role="user", content="held"))
print("ready", flush=True)
sys.stdin.readline()
log.close()
print("closed", flush=True)
sys.stdin.readline()
"""


def test_another_process_is_refused_then_waits_with_a_timeout(tmp_path):
    path = tmp_path / "ep.jsonl"
    EventLog.create(path).close()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        with pytest.raises(LogLockedError) as info:
            EventLog.open(path, lock="writer")
        assert info.value.holder.startswith(f"pid {proc.pid} on ")
        with EventLog.open(path) as other:
            with pytest.raises(LogLockedError, match=f"pid {proc.pid} on "):
                other.append(Message(role="user", content="no"))
        proc.stdin.write("close\n")
        proc.stdin.flush()
        with EventLog.open(path, lock="writer", lock_timeout=60) as log:  # waits for the holder to close
            assert [e.content for e in log.events()] == ["held"]
            log.append(Message(role="user", content="next"))
        assert proc.stdout.readline() == "closed\n"
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    assert [e.content for e in read_events(path)] == ["held", "next"]


TAKER = r"""
import os, sys, time
from ctxkit.events import Message
from ctxkit.log.event_log import EventLog
path, k, n, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
while not os.path.exists(go):
    time.sleep(0.001)
for turn in range(3):
    with EventLog.open(path, lock="writer", lock_timeout=120) as log:
        for i in range(n):
            if i % 10 == 8:
                log.extend([Message(role="user", content=f"w{k}-{turn}-{i}")])
            else:
                log.append(Message(role="user", content=f"w{k}-{turn}-{i}"))
"""


def test_owners_in_several_processes_take_whole_turns(tmp_path):
    """Writers that each own the log for a while: a dense valid chain, each turn's lines contiguous."""
    path, go = tmp_path / "ep.jsonl", tmp_path / "go"
    EventLog.create(path).close()
    n, writers = 40, 3
    procs = [subprocess.Popen([sys.executable, "-c", TAKER, str(path), str(k), str(n), str(go)]) for k in range(writers)]
    time.sleep(1.0)
    go.touch()
    assert [p.wait(timeout=180) for p in procs] == [0] * writers
    assert verify(path).ok
    contents = [e.content for e in read_events(path)]
    assert len(contents) == writers * 3 * n
    blocks = [contents[i:i + n] for i in range(0, len(contents), n)]
    for block in blocks:  # never interleaved: every block of n lines is one owner's whole turn
        k, turn = block[0].split("-")[:2]
        assert block == [f"{k}-{turn}-{i}" for i in range(n)]
    assert sorted(b[0] for b in blocks) == sorted(f"w{k}-{t}-0" for k in range(writers) for t in range(3))


def test_a_reader_never_hangs_behind_an_idle_owner(tmp_path, monkeypatch):
    """A torn tail while the owner sits idle: read again for a while (`IN_FLIGHT_WAIT_S`), then reported as in
    flight or torn, naming the owner; `allow_torn` reads what is complete."""
    monkeypatch.setattr(log_locks, "IN_FLIGHT_WAIT_S", 0.2)
    path = tmp_path / "ep.jsonl"
    owner = EventLog.create(path, lock="writer")
    owner.extend(_msgs(2))
    with open(path, "ab") as fh:
        fh.write(b'{"content":"half')
    for read in (lambda: read_events(path), lambda: list(iter_events(path))):
        with pytest.raises(TornLineError, match=rf"ep\.jsonl:4: .*a writer still held the log after 0.2 s \(pid {os.getpid()} "):
            read()
    assert [e.content for e in read_events(path, allow_torn=True)] == ["m0", "m1"]
    assert [e.content for e in iter_events(path, allow_torn=True)] == ["m0", "m1"]
    assert [p.code for p in verify(path).problems] == ["torn"]
    with pytest.raises(TornLineError, match="a writer still held the log"):
        EventLog.open(path)
    os.truncate(path, path.stat().st_size - 16)
    owner.close()


def test_a_line_in_flight_under_an_owner_is_read_whole(tmp_path):
    path, other = tmp_path / "ep.jsonl", tmp_path / "other.jsonl"
    with EventLog.create(path, episode_id="ep") as log:
        log.append(Message(role="user", content="one"))
    other.write_bytes(path.read_bytes())
    with EventLog.open(other) as log:
        log.append(Message(role="user", content="two"))
    line = other.read_bytes()[path.stat().st_size:]
    owner = EventLog.open(path, lock="writer")
    with open(path, "ab") as fh:  # the first part of the owner's next line
        fh.write(line[:10])
    got: list = []
    reader = threading.Thread(target=lambda: got.append([e.content for e in iter_events(path)]))
    reader.start()
    reader.join(timeout=0.3)
    with open(path, "ab") as fh:
        fh.write(line[10:])
    reader.join()
    assert got == [["one", "two"]]
    owner.close()


WRITER = writer_script('durability=sys.argv[2], lock="writer", repair=True')
_body = body



@pytest.mark.slow
@pytest.mark.parametrize("durability", ["batch", "always"])
def test_sigkilled_owner_loses_no_acknowledged_event_and_lets_go(tmp_path, durability):
    """10 owners killed at random times (odd rounds the moment the file grows, inside a multi-megabyte
    `write`): every acknowledged event survives, `verify --repair` restores a valid log, and the next owner
    gets the log at once (the kernel dropped the dead one's locks)."""
    rng = random.Random(99)
    path = tmp_path / "ep.jsonl"
    EventLog.create(path).close()
    acked: set[int] = set()
    for round_no in range(10):
        # `ready` at once (lock_timeout 0) means the dead owner let go
        acked.update(kill_mid_append([sys.executable, "-c", WRITER, str(path), durability], path,
                                     pause_s=rng.uniform(0.0, 0.05), wait_for_growth=bool(round_no % 2)))
        report = verify(path)
        assert report.ok or [p.code for p in report.problems] == ["torn"], report.problems
        if round_no % 3 == 0:  # a repair by hand; other rounds the next owner repairs as it opens
            assert main(["log", "verify", str(path), "--repair"]) == 0
            assert verify(path).ok
    with EventLog.open(path, lock="writer", repair=True) as log:
        events = log.events()
    assert verify(path).ok and [e.seq for e in events] == list(range(len(events)))
    assert acked <= {e.seq for e in events}, f"acknowledged events lost: {sorted(acked - {e.seq for e in events})}"
    assert len(acked) >= 5
    for e in events:
        assert (e.tool_call_id, e.content, e.duration_s) == (f"c{e.seq}", _body(e.seq), e.seq / 3)
