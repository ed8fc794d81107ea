"""Fork safety of open logs: a handle inherited through `os.fork` stays its opener's. In the child it writes
nothing (its buffer is dropped there, the parent writes it once), appends raise `LogForkedError`, and its
close releases nothing the parent holds; a log opened anew in the child is excluded from the parent's writes
and appends after the parent's lines with a valid chain. Real forks; the child's exit code is the result."""

from __future__ import annotations

import gc
import os
import pickle
import select
import signal
import sys
import traceback

import pytest

from ctxkit.errors import LogForkedError, LogLockedError
from ctxkit.events import Message
from ctxkit.log.event_log import EventLog, read_events, verify
from ctxkit.log.locks import WriterLock, lock_path

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")

MODES = [(d, lock) for d in ("always", "batch", "none") for lock in ("append", "writer")]


def _msg(text: str) -> Message:
    return Message(role="user", content=text, ts=1.0)


def _check(ok: bool, code: int) -> None:
    if not ok:
        os._exit(code)


def _child(path, log: EventLog, durability: str, lock: str, ready_w: int, closed_r: int) -> int:
    """Runs in the forked child; returns the exit code (0 when every check holds)."""
    size = path.stat().st_size
    held = lock == "writer" or durability == "none"  # the parent holds the writers' lock at the fork
    for attempt, code in ((lambda: log.append(_msg("inherited")), 10), (lambda: log.extend([_msg("x")]), 11),
                          (log.flush, 12), (log.refresh, 13)):
        try:
            attempt()
        except LogForkedError as exc:
            _check(f"pid {os.getppid()}" in str(exc) and "open the log again" in str(exc), code + 10)
            _check(exc.path == str(path) and exc.holder == f"pid {os.getppid()}", code + 20)
        else:
            return code
    _check(path.stat().st_size == size, 40)  # the inherited handle wrote nothing
    _check([e.content for e in log.events()] == ["a0", "a1", "b0"], 41)  # what the parent had recorded
    if held:  # real exclusion: a description of the child's own cannot take the parent's lock
        _check(not WriterLock(path).acquire(blocking=False), 42)
        if lock == "writer":
            try:
                EventLog.open(path, lock="writer")
            except LogForkedError:
                return 43
            except LogLockedError:
                pass
            else:
                return 44
    log.close()  # the inherited handle: releases nothing, writes nothing
    del log
    gc.collect()
    _check(path.stat().st_size == size, 45)
    if held:
        _check(not WriterLock(path).acquire(blocking=False), 46)
    if lock == "writer":
        _check(lock_path(path).read_bytes() != b"", 47)  # the parent's holder record is kept
    os.write(ready_w, b"r")
    _check(os.read(closed_r, 1) == b"c", 48)  # the parent appended once more and closed its handle
    with EventLog.open(path, durability=durability, lock=lock) as fresh:
        _check([e.content for e in fresh.events()] == ["a0", "a1", "b0", "b1"], 49)
        _check(fresh.append(_msg("c0")).seq == 4, 50)
    return 0


def _fork_child(target) -> int:
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = target()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _wait(pid: int, fd: int) -> bytes:
    """Read one byte from the child, or kill it after 30 s (a hang is a failure, never a timed assertion)."""
    if not select.select([fd], [], [], 30.0)[0]:
        os.kill(pid, signal.SIGKILL)
        return b""
    return os.read(fd, 1)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX fork")
@pytest.mark.parametrize("durability,lock", MODES)
def test_forked_child_writes_nothing_through_the_inherited_handle(tmp_path, durability, lock):
    path = tmp_path / "ep.jsonl"
    log = EventLog.create(path, episode_id="ep", durability=durability, lock=lock)
    log.extend([_msg("a0"), _msg("a1")])
    log.append(_msg("b0"))  # durability none: still buffered at the fork
    ready_r, ready_w = os.pipe()
    closed_r, closed_w = os.pipe()
    pid = _fork_child(lambda: _child(path, log, durability, lock, ready_w, closed_r))
    os.close(ready_w)
    os.close(closed_r)
    try:
        if _wait(pid, ready_r) == b"r":  # else the child failed a check (its exit code says which)
            log.append(_msg("b1"))
            assert log.lock == lock and log.close() is None
            os.write(closed_w, b"c")
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(closed_w)
    assert os.waitstatus_to_exitcode(status) == 0
    events = read_events(path)
    assert [e.content for e in events] == ["a0", "a1", "b0", "b1", "c0"]  # the parent's buffer appears once
    assert [e.seq for e in events] == [0, 1, 2, 3, 4]
    report = verify(path)
    assert report.ok and report.n_events == 5


@pytest.mark.parametrize("durability,lock", MODES)
def test_parent_keeps_writing_after_a_child_exits(tmp_path, durability, lock):
    """A child that drops the inherited handle and exits normally (running `__del__` and atexit) takes
    nothing from the parent: the parent's lock, buffer and appends go on."""
    path = tmp_path / "ep.jsonl"
    log = EventLog.create(path, episode_id="ep", durability=durability, lock=lock)
    log.append(_msg("p0"))

    def child() -> int:
        nonlocal log
        log = None
        gc.collect()
        return 0

    pid = _fork_child(child)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    if lock == "writer" or durability == "none":
        assert not WriterLock(path).acquire(blocking=False)
    log.append(_msg("p1"))
    log.close()
    assert [e.content for e in read_events(path)] == ["p0", "p1"]
    assert verify(path).ok


def test_log_forked_error_is_a_log_locked_error_and_pickles():
    exc = LogForkedError("open the log again", path="/x/ep.jsonl", holder="pid 7")
    assert isinstance(exc, LogLockedError) and str(exc) == "/x/ep.jsonl: open the log again"
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is LogForkedError and str(back) == str(exc) and (back.path, back.holder) == (exc.path, exc.holder)


_INHERITED: dict[str, EventLog] = {}


def _rollout_worker(path: str, durability: str, lock: str) -> None:
    """A multiprocessing worker (start method `fork`): the inherited log refuses, a fresh one appends."""
    try:
        _INHERITED["log"].append(_msg("inherited"))
    except LogForkedError:
        pass
    else:
        os._exit(3)
    with EventLog.open(path, durability=durability, lock=lock, lock_timeout=30.0) as log:
        log.append(_msg(f"worker {os.getpid()}"))


@pytest.mark.parametrize("durability,lock", [("none", "append"), ("batch", "append"), ("batch", "writer")])
def test_multiprocessing_fork_workers_open_their_own_log(tmp_path, durability, lock):
    """The RL rollout case: workers forked with an open log. Each worker's events land once, after the
    parent's (which are written once, by the parent), in a valid chain."""
    import multiprocessing

    path = tmp_path / "ep.jsonl"
    log = _INHERITED["log"] = EventLog.create(path, episode_id="ep", durability=durability, lock=lock)
    try:
        log.extend([_msg("p0"), _msg("p1")])
        ctx = multiprocessing.get_context("fork")
        workers = [ctx.Process(target=_rollout_worker, args=(str(path), durability, lock)) for _ in range(3)]
        for w in workers:
            w.start()
        log.close()  # lock="writer": the workers wait for it (lock_timeout); durability none: writes p0, p1
        for w in workers:
            w.join(60)
        assert [w.exitcode for w in workers] == [0, 0, 0]
    finally:
        _INHERITED.clear()
    contents = [e.content for e in read_events(path)]
    assert contents[:2] == ["p0", "p1"] and sorted(contents[2:]) == sorted(f"worker {w.pid}" for w in workers)
    assert verify(path).ok
