"""The writers' lock of an episode log, and the readers' wait on it (Layer L1).

Only writers lock: an append or a repair holds an exclusive `flock` on `<log>.lock` (`WriterLock`; an
`EventLog` opens that file at its first write and keeps the descriptor, so taking the lock costs one system
call). Readers never create that file: a reader that finds a tail without a newline waits on the existing
lock file, if any, with a shared `flock` (`read_lock`) and reads again, so a line in flight is not reported
torn. filelock's `FileLock` is the fallback where `fcntl` is missing; on POSIX it uses `flock` too, so the two
exclude each other.

L1: imports nothing from ctxkit.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: filelock's FileLock instead
    fcntl = None  # type: ignore[assignment]
_EX_NB = fcntl.LOCK_EX | fcntl.LOCK_NB if fcntl is not None else 0

__all__ = ["WriterLock", "lock_path", "read_lock", "write_lock"]


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
        self.path: Path = lock_path(path)
        """The lock file."""
        self.key: str = str(self.path)
        """The lock file's path as a string (a dict key for this process's holders)."""
        self._fd: int | None = None
        self._fallback = None

    def acquire(self, *, blocking: bool = True) -> bool:
        """Take the lock; with `blocking=False` return False at once when another descriptor holds it."""
        if fcntl is None:  # pragma: no cover - not POSIX
            from filelock import FileLock, Timeout

            self._fallback = self._fallback or FileLock(str(self.path))
            try:
                self._fallback.acquire(timeout=-1 if blocking else 0)
            except Timeout:
                return False
            return True
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def try_acquire_fast(self) -> bool:
        """`acquire(blocking=False)` in one system call once the descriptor is open (the append hot path)."""
        if self._fd is None or fcntl is None:
            return self.acquire(blocking=False)
        try:
            fcntl.flock(self._fd, _EX_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        """Release the lock (the descriptor stays open for the next `acquire`)."""
        if self._fallback is not None:  # pragma: no cover - not POSIX
            self._fallback.release()
        elif self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the descriptor (which releases the lock if held). Closing twice is fine."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@contextmanager
def write_lock(path: Path):
    """Hold the log's exclusive writer lock (creating `<log>.lock` if needed) for one operation (a repair)."""
    lock = WriterLock(path)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()
        lock.close()


@contextmanager
def read_lock(path: Path):
    """Wait for any writer in the middle of an append, without creating anything: a shared `flock` on the
    existing `<log>.lock`. No lock file (no writer ever appended), a lock file we cannot open (a read-only
    place, another user's file) or a platform without `fcntl` means nothing to wait for."""
    if fcntl is None:  # pragma: no cover - not POSIX
        yield
        return
    try:
        fd = os.open(lock_path(path), os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock
