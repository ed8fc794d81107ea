"""The writers' locks of an episode log, and how readers wait for a line in flight.

Two lock modes (`LOCK_MODES`, chosen per `EventLog` handle):
- `append` (default): writers take turns. An append or a repair holds an exclusive `flock` on `<log>.lock`
  for that one write (`WriterLock`; an `EventLog` opens that file at its first write and keeps the
  descriptor, so taking the lock costs one system call), so several processes can append to one log.
- `writer`: one handle owns the log from open to close. It takes an exclusive `flock` on the log file itself
  (the *owner* flag, which nothing else takes exclusively) and then on `<log>.lock` (`WriterLock.hold`), and
  writes who it is (`pid`, host, since when) into `<log>.lock`. Its appends then take no lock at all. Any
  other writer, in this process or another, is refused with `LogLockedError` naming the log and the holder:
  another `writer` open (after waiting up to its `lock_timeout`), an `append` writer that finds `<log>.lock`
  taken (it checks the owner flag before it would wait), and a repair. Closing the handle, dropping it, its
  process exiting or being SIGKILLed releases both locks (the kernel drops flocks with the descriptors).

Readers never lock for long and never create a lock file: a reader that finds a tail without a newline calls
`wait_in_flight`, which re-reads the tail until it is complete, or until no writer holds `<log>.lock` (a
shared `flock`, taken without blocking: the tail is then read once more and is torn for sure), or until
`IN_FLIGHT_WAIT_S` passed with a writer still holding it (reported as "in flight or torn", naming the
holder). So a reader never hangs behind an idle writer: a `writer` handle, or an `append` handle of
durability `none` holding the lock over its buffer. filelock's `FileLock` is the fallback where `fcntl` is
missing (on POSIX it uses `flock` too, so the two exclude each other).
"""

from __future__ import annotations

import os
import socket
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable
from filelock import FileLock, Timeout

import orjson

from ctxkit.errors import LogLockedError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: filelock's FileLock instead
    fcntl = None  # type: ignore[assignment]
_EX_NB = fcntl.LOCK_EX | fcntl.LOCK_NB if fcntl is not None else 0
_SH_NB = fcntl.LOCK_SH | fcntl.LOCK_NB if fcntl is not None else 0

LOCK_MODES: tuple[str, ...] = ("append", "writer")
"""`append`: lock `<log>.lock` for each write, so writers in several processes take turns. `writer`: one handle
holds the log from open to close, appends take no lock, every other writer is refused (`LogLockedError`)."""

IN_FLIGHT_WAIT_S = 2.0
"""How long a reader re-reads a tail without a newline while a writer holds the lock, before it reports the
tail as in flight or torn."""

__all__ = ["IN_FLIGHT_WAIT_S", "LOCK_MODES", "WriterLock", "guard_fork", "in_flight_wait_s", "lock_path",
           "unguard_fork", "wait_in_flight", "write_lock"]

_FORK_GUARDS: "weakref.WeakKeyDictionary[Any, Callable[[Any], None]]" = weakref.WeakKeyDictionary()


def guard_fork(handle: Any, in_child: Callable[[Any], None]) -> None:
    """Call `in_child(handle)` in every process forked from this one while `handle` is alive and not
    `unguard_fork`ed (weakly held: the registry keeps no handle alive). `in_child` must not lock or write what
    the parent still owns; it runs in the child right after the fork, with only that thread running."""
    _FORK_GUARDS[handle] = in_child


def unguard_fork(handle: Any) -> None:
    """Stop `guard_fork`ing `handle` (at close). Fine for a handle never guarded."""
    _FORK_GUARDS.pop(handle, None)


def _after_fork_in_child() -> None:
    guards = list(_FORK_GUARDS.items())
    _FORK_GUARDS.clear()  # the child's own handles register anew
    for handle, in_child in guards:
        in_child(handle)


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def in_flight_wait_s() -> float:
    """`IN_FLIGHT_WAIT_S` as it is now (read at each call, so a test or a program may change it)."""
    return IN_FLIGHT_WAIT_S


def lock_path(path: Path) -> Path:
    """The writers' lock file of a log: `<log>.lock`, created by the first append (`filelock`)."""
    return Path(str(path) + ".lock")


class WriterLock:
    """The writers' exclusive lock on a log: an `fcntl.flock` on `<log>.lock`, whose descriptor is opened at the
    first `acquire` (creating the file) and kept until `close`, so taking and releasing it costs one system
    call each. `filelock.FileLock` on the same file is the fallback where `fcntl` is missing (and the two
    exclude each other on POSIX, where filelock uses `flock` too). A killed process releases it."""

    def __init__(self, path: Path) -> None:
        """The lock of the log at `path` (nothing is opened or created yet)."""
        self.log: Path = Path(path)
        """The log file."""
        self.path: Path = lock_path(path)
        """The lock file."""
        self.key: str = str(self.path)
        """The lock file's path as a string (a dict key for this process's holders)."""
        self._fd: int | None = None
        self._fallback = None
        self._marked = False

    def acquire(self, *, blocking: bool = True) -> bool:
        """Take the lock; with `blocking=False` return False at once when another descriptor holds it."""
        if fcntl is None:  # pragma: no cover - not POSIX

            self._fallback = self._fallback or FileLock(str(self.path))
            try:
                self._fallback.acquire(timeout=-1 if blocking else 0)
            except Timeout:
                return False
            return True
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX if blocking else _EX_NB)
        except BlockingIOError:
            return False
        return True

    def descriptor(self) -> int | None:
        """The lock file's descriptor, opened (creating the file) if needed and kept until `close`, for a caller
        that `flock`s it directly on its hot path; None where `fcntl` is missing (use `acquire`/`release`)."""
        if fcntl is None:  # pragma: no cover - not POSIX
            return None
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd

    def wait(self, log_fd: int | None) -> None:
        """Take the lock for an `append` writer, waiting for other `append` writers (each holds it for one
        write). `LogLockedError` at once instead when a `writer` handle owns the log: `log_fd` (a descriptor
        of the log itself) takes a shared lock on the owner flag first, held only while waiting."""
        if fcntl is None or log_fd is None:  # pragma: no cover - not POSIX
            self.acquire()
            return
        try:
            fcntl.flock(log_fd, _SH_NB)
        except BlockingIOError:
            holder = self.holder()
            raise LogLockedError(f"a handle opened with lock='writer' holds this log until it closes "
                                 f"({holder or 'holder unknown'}); other writers are refused meanwhile",
                                 path=str(self.log), holder=holder) from None
        try:
            self.acquire()
        finally:
            fcntl.flock(log_fd, fcntl.LOCK_UN)

    def hold(self, log_fd: int, timeout: float) -> None:
        """Take the log for a `writer` handle: the owner flag on `log_fd` (a descriptor of the log itself),
        then this lock, retrying for up to `timeout` seconds, then `LogLockedError` naming the holder. Records
        this process as the holder in the lock file. Released by `close` (and by the process ending)."""
        deadline, delay = time.monotonic() + max(timeout, 0.0), 0.001
        while not self._try_hold(log_fd):
            left = deadline - time.monotonic()
            if left <= 0:
                holder = self.holder()
                raise LogLockedError(f"another writer holds this log ({holder or 'holder unknown'}); lock='writer' "
                                     f"needs it alone (waited {timeout:g} s)", path=str(self.log), holder=holder)
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
        if self._fd is not None:
            mark = {"pid": os.getpid(), "host": socket.gethostname(), "lock": "writer", "since": time.time()}
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, orjson.dumps(mark) + b"\n", 0)
            self._marked = True

    def _try_hold(self, log_fd: int) -> bool:
        if fcntl is None:  # pragma: no cover - not POSIX
            return self.acquire(blocking=False)
        try:
            fcntl.flock(log_fd, _EX_NB)
        except BlockingIOError:
            return False
        if self.acquire(blocking=False):
            return True
        fcntl.flock(log_fd, fcntl.LOCK_UN)
        return False

    def holder(self) -> str | None:
        """Who holds the log, as recorded in the lock file by a `writer` handle (`"pid 123 on host, since
        ..."`); None when nothing is recorded or the recorded process is gone."""
        return holder_of(self.path)

    def release(self) -> None:
        """Release the lock (the descriptor stays open for the next `acquire`)."""
        if self._fallback is not None:  # pragma: no cover - not POSIX
            self._fallback.release()
        elif self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def drop_inherited(self) -> None:
        """In a forked child: close the child's copy of the descriptor, with no `LOCK_UN` and without clearing
        the holder record, since the description (and its lock) is the parent's too. Later `acquire`s open
        the lock file anew: a description of the child's own, which excludes the parent."""
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd, self._marked, self._fallback = None, False, None

    def close(self) -> None:
        """Close the descriptor (which releases the lock if held), clearing a `writer` handle's record of
        itself first. Closing twice is fine."""
        if self._fd is not None:
            try:
                if self._marked:
                    os.ftruncate(self._fd, 0)
            except OSError:
                pass
            finally:
                os.close(self._fd)
                self._fd = None
                self._marked = False


def holder_of(lock_file: Path, fd: int | None = None) -> str | None:
    """The holder a `writer` handle recorded in `lock_file` (read through `fd` when given), or None when none is
    recorded or the recorded process (on this host) is gone."""
    try:
        if fd is None:
            with open(lock_file, "rb") as fh:
                raw = fh.read(4096)
        else:
            raw = os.pread(fd, 4096, 0)
        mark = orjson.loads(raw)
        pid, host, since = int(mark["pid"]), str(mark["host"]), float(mark["since"])
    except (OSError, ValueError, TypeError, KeyError, orjson.JSONDecodeError):
        return None
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
    return f"pid {pid} on {host}, lock='writer' since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}"


@contextmanager
def write_lock(path: Path):
    """Hold the log's exclusive writer lock (creating `<log>.lock` if needed) for one operation (a repair),
    waiting for `append` writers; `LogLockedError` when a `writer` handle owns the log."""
    lock = WriterLock(path)
    try:
        log_fd: int | None = os.open(path, os.O_RDONLY)
    except OSError:
        log_fd = None
    try:
        lock.wait(log_fd)
        try:
            yield
        finally:
            lock.release()
    finally:
        lock.close()
        if log_fd is not None:
            os.close(log_fd)


def wait_in_flight(path: Path, complete: Callable[[], bool], *, timeout: float | None = None) -> str | None:
    """For a reader that found a tail without a newline: call `complete()` (read the tail again; True once it
    ends in a newline) until it is True, or until no writer holds `<log>.lock` (taken shared without blocking,
    then `complete()` once more: no writer is mid-line, so a tail still without a newline is torn), or until
    `timeout` seconds (default `IN_FLIGHT_WAIT_S`) passed with a writer holding it. Returns None when the tail
    completed, `""` when it is torn, else the holder (`"pid ..."`, or `"a writer"` when unknown): the tail may
    be in flight or torn. Never blocks on a lock and creates nothing (no lock file: no writer to wait for)."""
    if fcntl is None:  # pragma: no cover - not POSIX
        return None if complete() else ""
    try:
        fd = os.open(lock_path(path), os.O_RDONLY)
    except OSError:
        return None if complete() else ""
    try:
        deadline, delay = time.monotonic() + (in_flight_wait_s() if timeout is None else timeout), 0.0005
        while True:
            try:
                fcntl.flock(fd, _SH_NB)
            except BlockingIOError:
                pass
            else:  # no writer mid-line; closing the descriptor releases the shared lock
                return None if complete() else ""
            if complete():
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return holder_of(lock_path(path), fd) or "a writer"
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.02)
    finally:
        os.close(fd)
