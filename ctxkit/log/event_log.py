"""The episode log: append-only JSONL (orjson), hash-chained, crash-safe, shared safely between processes.

`EventLog` writes a file; `MemoryLog` is the same log kept in memory (what-if builds, generated episodes).
Both number and name events with one sequencer (`stamp`), so the same events get the same `seq`, ids and
recorded copies in either. `ctxkit.log.file_format` defines the file format (a header line, then one hash-chained
line per event) and the whole-file tools `verify`, `repair`, `read_events`, `iter_events` (streams, in constant
memory), `read_header`;
`ctxkit.log.conversation` converts OpenAI conversations. Both are re-exported here, so `ctxkit.log.event_log` is the one
place to import from.

Ids. An event's id is `e<seq>-<8 hex>` of its own content and position (`events.event_id`), measured times
(`ts`, step timings, tool durations) left out. It is not chained to the events before it: a chained id
would take in every earlier event's wall-clock `ts` (the line hash covers it), so a re-run, a resumed
episode or an in-memory what-if build could never reproduce it, and placeholders that name event ids
(masked tool output) would render to other tokens. Order and integrity are the file's hash chain's job.

Writes and durability. Lines are written whole, with one `write` per append (or per `extend`, or per
buffer) on an O_APPEND descriptor, so a crash can only leave a torn last line, detected on open and fixed
by `repair`. What a crash loses, by mode:
- `always`: each append is written and fsynced before it returns. Nothing acknowledged is lost, even to a
  power failure or an OS crash.
- `batch` (default): each append is written to the OS before it returns; `extend`, `flush` and `close`
  fsync. A killed process loses nothing acknowledged; a power failure or OS crash loses what was appended
  since the last fsync.
- `none`: appends are kept in an in-memory buffer and written in one `write` at `flush`, `close`,
  `refresh`, when the buffer reaches `BUFFER_BYTES`, or when another handle of this process wants to write;
  nothing is fsynced unless `flush` is called. A killed process loses the buffered events (at most
  `BUFFER_BYTES` of lines, all of them after the file's last complete line: never a gap, never a torn
  chain); an OS crash also loses what the OS had not yet written. `events()` of the same object includes
  buffered events; other readers of the file see them after the buffer is written.

Concurrency: the `lock` mode of a handle (`ctxkit.log.locks`). With `lock="append"` (the default) writers in
several processes take turns on one log: each write takes an exclusive `flock` on `<log>.lock` (a descriptor
opened at the first write and kept), first reading the lines others appended since our last read (checking
their chain), so `seq` stays dense, the chain valid, and lines of different writers never interleave. One
`always`/`batch` append costs the stamp (`ctxkit.log.sequencer.stamp_line`) and four system calls: `flock`,
`lseek` (did the file grow?), `write`, `flock` to release. A `none` handle takes the lock at its first
buffered append and holds it until its buffer is written. Opening, reading and refreshing create no `.lock`.
With `lock="writer"` one handle owns the log from open (or create) to close: it locks the log file and
`<log>.lock` once (a second writer, in this process or another, gets `LogLockedError` naming the holder; a
`writer` open waits up to `lock_timeout` seconds first), so an `always`/`batch` append is the stamp and one
`write` (plus the fsync of `always`) and `none` buffers as above. Closing, dropping the handle, exiting or a
SIGKILL release it (the kernel drops flocks). Readers never wait on a writer for more than a line in flight
(`ctxkit.log.locks.wait_in_flight`), in either mode.

Fork (`os.fork`, a multiprocessing worker started by `fork`): an open handle stays its opener's. In the forked
child an inherited handle writes nothing: its buffered lines are dropped there (the parent writes them), its
descriptors are closed without unlocking what the parent holds, and `append`, `extend`, `flush` and
`refresh` raise `LogForkedError` (a `LogLockedError`) saying to open the log again in the child; `events()`
still gives the events the parent had recorded at the fork, and `close` is a no-op. A log opened anew in the
child is an ordinary writer, excluded from the parent's writes by the locks above.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from ctxkit.log.conversation import export_conversation, export_messages, import_conversation, load_conversation
from ctxkit.errors import ConfigError, LogForkedError
from ctxkit.events import Event
from ctxkit.log.file_format import (
    HEADER_KEY,
    Problem,
    RepairReport,
    Scan,
    VerifyReport,
    checked_scan,
    iter_events,
    read_events,
    read_header,
    repair,
    repair_tail,
    torn_problem,
    verify,
)
from ctxkit.log.locks import LOCK_MODES, WriterLock, guard_fork, unguard_fork, wait_in_flight, write_lock
from ctxkit.log.sequencer import stamp, stamp_line, stamp_lines
from ctxkit.log.file_writes import create_file, read_appended, write_all

DURABILITY_MODES: tuple[str, ...] = ("always", "batch", "none")
"""`always`: write and fsync every append. `batch`: write every append, fsync per `extend`/`flush` and at
close. `none`: buffer appends in memory (written at `flush`/`close`/`refresh` or every `BUFFER_BYTES`), never
fsync unless `flush` is called. See the module docstring for what a crash loses in each."""

BUFFER_BYTES = 1 << 20
"""Durability `none` writes its buffered lines once they reach this many bytes."""

_now = time.time
_SEEK_END = os.SEEK_END
_lseek, _write_fd = os.lseek, os.write
try:
    from fcntl import LOCK_EX, LOCK_NB, LOCK_UN, flock as _flock
    _EX_NB = LOCK_EX | LOCK_NB
except ImportError:  # pragma: no cover - not POSIX: `WriterLock` falls back to filelock
    _flock, _EX_NB, LOCK_UN = None, 0, 0  # type: ignore[assignment]
_HOLDERS: dict[str, "weakref.ref[EventLog]"] = {}  # lock file -> this process's handle buffering under it

__all__ = ["DURABILITY_MODES", "HEADER_KEY", "LOCK_MODES", "EventLog", "MemoryLog", "Problem", "RepairReport", "VerifyReport",
           "export_conversation", "export_messages", "import_conversation", "iter_events", "load_conversation",
           "read_events", "read_header", "repair", "stamp", "verify"]


# ---------------------------------------------------------------------------------------------- the logs


class MemoryLog:
    """A log kept in memory, with `EventLog`'s reading and appending face (`events`, `append`, `extend`,
    `len`, iteration) and its sequencer (`stamp`): the same events get the same seq, ids and recorded copies
    as in a file log, so a what-if build (`ctxkit build` without `--write`) renders what a recorded one
    does. For builds that must not touch a user's log, and for generated episodes. `ts` is 0.0 unless an
    event gives one (no wall clock: two identical runs give identical logs; ids ignore `ts` anyway)."""

    def __init__(self, events: Iterable[Event] = ()) -> None:
        """Start from already recorded `events` (kept as they are), or empty."""
        self._events: list[Event] = list(events)
        self._cache: tuple[Event, ...] | None = None

    def events(self) -> tuple[Event, ...]:
        """Every event, in order."""
        if self._cache is None:
            self._cache = tuple(self._events)
        return self._cache

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def __repr__(self) -> str:
        return f"MemoryLog(events={len(self._events)})"

    def adopt(self, events: Iterable[Event]) -> None:
        """Add events recorded elsewhere, keeping their ids (seq renumbered to the position here), e.g. a
        file log's events without its compactions, for a what-if build."""
        for event in events:
            self._events.append(dataclasses.replace(event, seq=len(self._events)))
        self._cache = None

    def append(self, event: Event) -> Event:
        """Record one event (fills seq, id, ts) and return the recorded copy."""
        return self.extend([event])[0]

    def extend(self, events: Iterable[Event]) -> list[Event]:
        """Record several events (all or none); returns the recorded copies."""
        recorded = [r for r, _, _ in stamp(events, len(self._events), 0.0)]
        self._events.extend(recorded)
        self._cache = None
        return recorded



class EventLog:
    """An open episode log: appends events and keeps every event in memory (reading is free)."""

    def __init__(self, path: Path, header: dict[str, Any], scan: Scan, durability: str, repair: bool = False,
                 held: tuple[int, WriterLock] | None = None):
        """Use `EventLog.create` or `EventLog.open`."""
        self.path: Path = path
        """The log file."""
        self.durability: str = durability
        """`always`, `batch` or `none` (see `DURABILITY_MODES`)."""
        self.lock: str = "writer" if held else "append"
        """`append` or `writer` (see `LOCK_MODES`)."""
        self._header = header
        self._events: list[Event] = list(scan.events)
        self._cache: tuple[Event, ...] | None = None
        self._last_hash: str = scan.last_hash  # type: ignore[assignment]
        self._offset = scan.good_len
        self._owner = held is not None  # lock="writer": the lock is ours from open to close
        self._lock = held[1] if held else WriterLock(path)
        self._mutex = threading.RLock()
        self._repair = repair
        self._buffer = bytearray()  # durability "none": lines written at flush/close/refresh (lock held)
        self._unbuffered: tuple[int, str] = (len(self._events), self._last_hash)
        self._fd: int | None = held[0] if held else os.open(path, os.O_RDWR | os.O_APPEND)
        self._lock_fd: int | None = None  # lock="append": `<log>.lock`'s descriptor once a write opened it
        self._forked_from: int | None = None  # in a forked child: the parent's pid (the handle is the parent's)
        guard_fork(self, EventLog._in_forked_child)

    @staticmethod
    def _check_modes(durability: str, lock: str) -> None:
        if durability not in DURABILITY_MODES:
            raise ConfigError(f"durability={durability!r}; expected one of {list(DURABILITY_MODES)}")
        if lock not in LOCK_MODES:
            raise ConfigError(f"lock={lock!r}; expected one of {list(LOCK_MODES)}")

    @classmethod
    def create(cls, path, *, episode_id: str | None = None, durability: str = "batch",
               metadata: Mapping[str, Any] | None = None, lock: str = "append",
               lock_timeout: float = 0.0) -> "EventLog":
        """Create a new, empty log (the header only), and its folder if needed. Refuses to overwrite a file.
        `lock` and `lock_timeout` as in `open`."""
        cls._check_modes(durability, lock)
        path = Path(path)
        scan = create_file(path, episode_id=episode_id, durability=durability, metadata=metadata)
        if lock == "writer":  # read again under the locks: another writer may have appended since the link
            return cls._open_held(path, durability, False, lock_timeout)
        return cls(path, scan.header, scan, durability)  # type: ignore[arg-type]

    @classmethod
    def open(cls, path, *, durability: str = "batch", repair: bool = False, lock: str = "append",
             lock_timeout: float = 0.0) -> "EventLog":
        """Open an existing log, verifying every line. A torn last line is a `TornLineError` unless
        `repair=True`, which repairs it first (see `repair`), and also repairs a torn tail that another,
        crashed writer leaves before one of our appends. `lock="writer"` holds the log until `close` (appends
        take no lock; any other writer is refused): it waits up to `lock_timeout` seconds for other writers
        to let go, then raises `LogLockedError` naming the holder."""
        cls._check_modes(durability, lock)
        path = Path(path)
        if lock == "writer":
            return cls._open_held(path, durability, repair, lock_timeout)
        scan = checked_scan(path)
        if scan.torn:
            if not repair:
                raise torn_problem(scan, path).error(path)
            with write_lock(path):  # repairing writes: the writers' lock
                scan = checked_scan(path, settle=False)
                if scan.torn:
                    repair_tail(path, scan)
                    scan = checked_scan(path, settle=False)
        return cls(path, scan.header, scan, durability, repair)  # type: ignore[arg-type]

    @classmethod
    def _open_held(cls, path: Path, durability: str, repair: bool, timeout: float) -> "EventLog":
        """`open` with `lock="writer"`: take the log, then read it (no one else writes it any more)."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
        except OSError:
            checked_scan(path)  # the typed error of a missing file or a folder
            raise
        lock = WriterLock(path)
        try:
            buffering = _HOLDERS.get(lock.key)  # a handle of this process holding the lock over its buffer
            if buffering is not None and buffering() is not None:
                buffering()._write_buffer()  # type: ignore[union-attr]
            lock.hold(fd, timeout)
            scan = checked_scan(path, settle=False)
            if scan.torn:
                if not repair:
                    raise torn_problem(scan, path).error(path)
                repair_tail(path, scan)
                scan = checked_scan(path, settle=False)
        except BaseException:
            lock.close()
            os.close(fd)
            raise
        return cls(path, scan.header, scan, durability, repair, held=(fd, lock))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ reading

    @property
    def header(self) -> dict[str, Any]:
        """The header: schema version (`ctxkit_log`), `episode_id`, `created`, `metadata`."""
        return dict(self._header)

    @property
    def episode_id(self) -> str:
        """The episode id from the header."""
        return self._header["episode_id"]

    def events(self) -> tuple[Event, ...]:
        """Every event, in order (as recorded; kept in memory)."""
        with self._mutex:
            if self._cache is None:
                self._cache = tuple(self._events)
            return self._cache

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def refresh(self) -> tuple[Event, ...]:
        """Read events other processes appended since our last read; returns all events."""
        self._check_open()
        with self._mutex:
            self._write_buffer()
            if not self._owner and self._sync_tail(torn_ok=True):  # a line in flight, or a crashed writer's torn line
                held = wait_in_flight(self.path, lambda: not self._sync_tail(torn_ok=True))
                if held:  # a writer still holds the lock after the wait: report, never wait on it
                    size = os.fstat(self._fd).st_size  # type: ignore[arg-type]
                    torn = Scan(n_lines=len(self._events) + 1, torn=bytes(size - self._offset), in_flight=held)
                    raise torn_problem(torn, self.path).error(self.path)
                if held == "":  # no writer mid-line: raise it, or repair it (a write, under the writers' lock)
                    self._acquire()
                    try:
                        self._sync_tail()
                    finally:
                        self._lock.release()
        return self.events()

    # ------------------------------------------------------------------ writing

    def append(self, event: Event) -> Event:
        """Append one event; fills `seq`, `id` and `ts` (unless given) and returns the recorded copy."""
        with self._mutex:
            if self._buffer:  # durability "none" with lines pending: the lock is held and the tail read
                recorded, line, digest = stamp_line(event, len(self._events), time.time(), self._last_hash)
                self._buffer += line
                self._events.append(recorded)
                self._last_hash = digest
                self._cache = None
                if len(self._buffer) >= BUFFER_BYTES:
                    self._write_buffer()
                return recorded
            fd = self._fd
            if fd is None or self.durability == "none":
                return self._write([event], sync=False)[0]
            owner = self._owner  # lock="writer": the log is ours alone, our offset is its end: no lock
            lfd = self._lock_fd  # lock="append": `always` and `batch` write one event under the lock
            if lfd is None and not owner:
                lfd = self._lock_fd = self._lock.descriptor()
                if lfd is None:  # pragma: no cover - no fcntl: the general path
                    return self._write([event], sync=self.durability == "always")[0]
            if not owner:  # the `WriterLock`'s flock, taken and released inline (the hot path)
                try:
                    _flock(lfd, _EX_NB)
                except BlockingIOError:
                    self._wait_for_lock()
            try:
                if not owner and _lseek(fd, 0, _SEEK_END) != self._offset:
                    self._sync_tail()  # another process appended (or left a torn tail)
                recorded, line, digest = stamp_line(event, len(self._events), _now(), self._last_hash)
                if _write_fd(fd, line) != len(line):  # a short write (a signal, a full disk): the rest, or undo
                    self._write_rest(line)
                if self.durability == "always":
                    os.fsync(fd)
                self._offset += len(line)
                self._events.append(recorded)
                self._last_hash = digest
                self._cache = None
                return recorded
            finally:
                if not owner:
                    _flock(lfd, LOCK_UN)

    def extend(self, events: Iterable[Event]) -> list[Event]:
        """Append several events in one write, never split by another writer (and one fsync in `always` and
        `batch` modes)."""
        events = list(events)
        if not events:
            return []
        return self._write(events, sync=self.durability != "none")

    def flush(self) -> None:
        """Write any buffered events (durability `none`) and fsync the log now, in every mode."""
        with self._mutex:
            self._check_open()
            self._write_buffer()
            os.fsync(self._fd)  # type: ignore[arg-type]

    def close(self) -> None:
        """Close the log: write any buffered events, fsync in `always`/`batch` mode, close the lock file's
        descriptor (a `writer` handle lets go of the log). Closing twice is fine."""
        with self._mutex:
            if self._fd is None:
                return
            try:
                self._write_buffer()
                if self.durability != "none":
                    os.fsync(self._fd)
            finally:
                unguard_fork(self)
                self._lock_fd = None
                self._lock.close()
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:
        try:  # like an io.BufferedWriter: a log dropped without close still writes what it buffered
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventLog({str(self.path)!r}, events={len(self._events)}, durability={self.durability!r}, lock={self.lock!r})"

    def _check_open(self) -> None:
        if self._fd is None:
            if self._forked_from is not None:
                raise LogForkedError(f"this handle was inherited from pid {self._forked_from} through a fork "
                                     f"and stays that process's (its lock and buffered events): it writes nothing "
                                     f"in process {os.getpid()}; open the log again here (EventLog.open)",
                                     path=str(self.path), holder=f"pid {self._forked_from}")
            raise ConfigError(f"{self.path}: the log is closed")

    def _in_forked_child(self) -> None:
        """In a forked child (`guard_fork`): drop the buffer, close our descriptor copies (no unlock), refuse writes."""
        self._mutex = threading.RLock()  # another thread of the parent may have held it at the fork
        self._forked_from = os.getppid()
        self._buffer = bytearray()
        holder = _HOLDERS.get(self._lock.key)
        if holder is not None and holder() is self:
            del _HOLDERS[self._lock.key]
        self._lock_fd = None
        self._lock.drop_inherited()
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def _acquire(self) -> None:
        """Take the writers' lock. A handle of this process holding it with buffered lines is made to write
        them and let go (it would otherwise wait for us forever); another process's writer is waited for."""
        if not self._lock.acquire(blocking=False):
            self._wait_for_lock()

    def _wait_for_lock(self) -> None:
        """`_acquire` when the lock is taken: free it from a buffering handle of this process, or wait."""
        holder = _HOLDERS.get(self._lock.key)
        holder = holder() if holder is not None else None
        if holder is not None and holder is not self:
            holder._write_buffer()
        self._lock.wait(self._fd)  # `LogLockedError` when a lock="writer" handle owns the log

    def _write(self, events: list[Event], *, sync: bool) -> list[Event]:
        with self._mutex:
            fd = self._fd
            if fd is None:
                self._check_open()
            held = self._owner or bool(self._buffer)  # a buffer is only ever pending under the lock, tail read
            if not held and not self._lock.acquire(blocking=False):
                self._wait_for_lock()
            try:
                if not held and os.lseek(fd, 0, os.SEEK_END) != self._offset:  # type: ignore[arg-type]
                    self._sync_tail()  # another process appended (or left a torn tail)
                if len(events) == 1:
                    first, payload, prev = stamp_line(events[0], len(self._events), time.time(), self._last_hash)
                    recorded = [first]
                else:
                    recorded, payload, prev = stamp_lines(events, len(self._events), time.time(), self._last_hash)
                if self.durability == "none":
                    if not self._buffer:
                        self._unbuffered = (len(self._events), self._last_hash)
                        if not self._owner:
                            _HOLDERS[self._lock.key] = weakref.ref(self)
                    self._buffer += payload
                else:
                    write_all(self._fd, payload, self._offset)  # type: ignore[arg-type]
                    if sync:
                        os.fsync(fd)  # type: ignore[arg-type]
                    self._offset += len(payload)
                self._events.extend(recorded)
                self._last_hash = prev
                self._cache = None
            finally:
                if not self._buffer and not self._owner:
                    self._lock.release()
            if len(self._buffer) >= BUFFER_BYTES:
                self._write_buffer()
        return recorded

    def _write_buffer(self) -> None:
        """Write the buffered lines (durability `none`) in one write and release the lock held since the
        first of them. If the write fails, the buffered events are dropped from this handle too."""
        with self._mutex:
            if not self._buffer:
                return
            payload, self._buffer = self._buffer, bytearray()
            key = self._lock.key
            if key in _HOLDERS and _HOLDERS[key]() is self:
                del _HOLDERS[key]
            try:
                write_all(self._fd, payload, self._offset)  # type: ignore[arg-type]
                self._offset += len(payload)
            except BaseException:
                n, self._last_hash = self._unbuffered
                del self._events[n:]
                self._cache = None
                raise
            finally:
                if not self._owner:
                    self._lock.release()

    def _write_rest(self, line: bytes) -> None:
        """After a short first `write` of one line at `self._offset`: write the rest, or cut what was written."""
        try:
            os.ftruncate(self._fd, self._offset)  # type: ignore[arg-type]
        except OSError:
            pass
        write_all(self._fd, line, self._offset)  # type: ignore[arg-type]

    def _sync_tail(self, *, torn_ok: bool = False) -> bool:
        """Take in lines appended by other processes since our last read (called under the lock, or with
        `torn_ok`). A tail without a newline raises (or is repaired), unless `torn_ok`: then it is left
        unread and True is returned."""
        new, prev, complete, tail = read_appended(self._fd, self._offset, len(self._events) + 2,  # type: ignore[arg-type]
                                                  self._last_hash, self.path)
        self._events.extend(new)
        self._last_hash = prev
        self._offset += complete
        self._cache = None
        if tail:  # another writer mid-line, or one that died there
            if torn_ok:
                return True
            scan = Scan(n_lines=len(self._events) + 1, torn=tail, last_hash=prev, good_len=self._offset)
            if not self._repair:
                raise torn_problem(scan, self.path).error(self.path)
            repair_tail(self.path, scan)
            self._sync_tail()  # a tail that only lacked its newline is now a line to read
        return False
