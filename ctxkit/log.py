"""The episode log: append-only JSONL (orjson), hash-chained, crash-safe, shared safely between processes.

`EventLog` writes a file; `MemoryLog` is the same log kept in memory (what-if builds, generated episodes).
Both number and name events with one sequencer (`stamp`), so the same events get the same `seq`, ids and
recorded copies in either. `ctxkit.logfile` defines the file format (a header line, then one hash-chained
line per event) and the whole-file tools `verify`, `repair`, `read_events`, `read_header`;
`ctxkit.conversation` converts OpenAI conversations. Both are re-exported here, so `ctxkit.log` is the one
place to import from.

Ids. An event's id is `e<seq>-<8 hex>` of its own content and position (`events.event_id`), measured times
(`ts`, step timings, tool durations) left out. It is not chained to the events before it: a chained id
would take in every earlier event's wall-clock `ts` (the line hash covers it), so a re-run, a resumed
episode or an in-memory what-if build could never reproduce it, and placeholders that name event ids
(masked tool output) would render to other tokens. Order and integrity are the file's hash chain's job.

Writes. Each append is one `write` of whole lines on an O_APPEND descriptor; a crash can only leave a torn
last line, detected on open. Durability: `always` fsyncs every append, `batch` every `extend`/`flush` and
the close, `none` never.

Concurrency. Every append takes `filelock.FileLock(<path>.lock)` and first reads the lines other
processes appended since our last read (checking their chain), so `seq` stays dense and the chain valid.
Only writing takes that lock: opening, reading and refreshing create no `.lock` file (see `ctxkit.logfile`).

L1: imports L0 (`events`, `errors`), `logfile` and `conversation`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import orjson

from ctxkit.conversation import export_conversation, export_messages, import_conversation, load_conversation
from ctxkit.errors import ConfigError, LogFormatError
from ctxkit.events import EVENT_TYPES, SCHEMA_VERSION, Event, event_from_dict, event_id, event_to_dict
from ctxkit.logfile import (
    HEADER_KEY,
    LineProblem,
    Problem,
    RepairReport,
    Scan,
    VerifyReport,
    checked_scan,
    dumps_checked,
    canonical,
    check_line,
    fsync_dir,
    line_hash,
    read_events,
    read_header,
    read_lock,
    read_log_bytes,
    read_settled,
    repair,
    repair_tail,
    torn_problem,
    verify,
    write_lock,
)

DURABILITY_MODES: tuple[str, ...] = ("always", "batch", "none")
"""`always`: fsync after every append. `batch`: fsync per `extend`/`flush` and at close. `none`: never."""

_EVENT_CLASSES = tuple(EVENT_TYPES.values())
__all__ = ["DURABILITY_MODES", "HEADER_KEY", "EventLog", "MemoryLog", "Problem", "RepairReport", "VerifyReport",
           "export_conversation", "export_messages", "import_conversation", "load_conversation", "read_events",
           "read_header", "repair", "stamp", "verify"]


# ---------------------------------------------------------------------------------------------- sequencing


def stamp(events: Iterable[Event], first_seq: int, ts: float) -> list[tuple[Event, dict[str, Any], bytes]]:
    """The one sequencer of `EventLog` and `MemoryLog`: check each new event (an event type, `seq` and `id`
    still None, JSON-able and finite), give it `seq` (from `first_seq`), its id (`events.event_id`) and `ts`
    (unless it has one). Returns `(recorded copy, its dict, its JSON line body)` per event; the recorded copy
    is the JSON round trip, exactly what a reader of the file gets back. `ConfigError` names the event."""
    out = []
    for i, event in enumerate(events):
        if not isinstance(event, _EVENT_CLASSES):
            raise ConfigError(f"event {i}: {type(event).__name__} is not an event type {sorted(EVENT_TYPES)}")
        if event.seq is not None or event.id is not None:
            raise ConfigError(f"event {i} ({event.kind}) already has seq={event.seq!r}, id={event.id!r}; "
                              "append events you built (seq and id None), not recorded ones")
        seq = first_seq + len(out)
        dumps_checked(event_to_dict(event), f"event {seq} ({event.kind})")  # typed error before hashing
        filled = dataclasses.replace(event, seq=seq, id=event_id(event, seq),
                                     ts=event.ts if event.ts is not None else ts)
        as_dict = event_to_dict(filled)
        body = orjson.dumps(as_dict)  # the caller's key order (tool schemas render in that order)
        out.append((event_from_dict(orjson.loads(body)), as_dict, body))
    return out


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

    def __init__(self, path: Path, header: dict[str, Any], scan: Scan, durability: str, repair: bool = False):
        """Use `EventLog.create` or `EventLog.open`."""
        from filelock import FileLock

        self.path: Path = path
        """The log file."""
        self.durability: str = durability
        """`always`, `batch` or `none` (see `DURABILITY_MODES`)."""
        self._header = header
        self._events: list[Event] = list(scan.events)
        self._cache: tuple[Event, ...] | None = None
        self._last_hash: str = scan.last_hash  # type: ignore[assignment]
        self._offset = scan.good_len
        self._lock = FileLock(str(path) + ".lock")
        self._mutex = threading.RLock()
        self._repair = repair
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_APPEND)

    @staticmethod
    def _check_durability(durability: str) -> None:
        if durability not in DURABILITY_MODES:
            raise ConfigError(f"durability={durability!r}; expected one of {list(DURABILITY_MODES)}")

    @classmethod
    def create(cls, path, *, episode_id: str | None = None, durability: str = "batch",
               metadata: Mapping[str, Any] | None = None) -> "EventLog":
        """Create a new, empty log (the header only), and its folder if needed. Refuses to overwrite a file."""
        cls._check_durability(durability)
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ConfigError(f"{path}: {path.parent} exists and is not a folder") from None
        header = {
            HEADER_KEY: SCHEMA_VERSION,
            "episode_id": episode_id if episode_id is not None else f"ep-{uuid.uuid4().hex[:12]}",
            "created": time.time(),
            "metadata": dict(metadata or {}),
        }
        body = dumps_checked(header, "log header")
        digest = hashlib.sha256(body).hexdigest()
        line = body[:-1] + b',"hash":"' + digest.encode() + b'"}\n'
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "xb") as fh:  # write and sync the header, then link it into place atomically
                fh.write(line)
                fh.flush()
                if durability != "none":
                    os.fsync(fh.fileno())
            try:
                os.link(tmp, path)
            except (PermissionError, NotImplementedError):  # no hard links here: exclusive create instead
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
        except FileExistsError:
            raise ConfigError(f"{path} already exists; use EventLog.open to append to it") from None
        except FileNotFoundError:
            raise ConfigError(f"{path}: the folder {path.parent} does not exist") from None
        finally:
            tmp.unlink(missing_ok=True)
        if durability != "none":
            fsync_dir(path)
        return cls(path, header, Scan(header=header, last_hash=digest, n_lines=1, good_len=len(line)), durability)

    @classmethod
    def open(cls, path, *, durability: str = "batch", repair: bool = False) -> "EventLog":
        """Open an existing log, verifying every line. A torn last line is a `TornLineError` unless
        `repair=True`, which repairs it first (see `repair`), and also repairs a torn tail that another,
        crashed writer leaves before one of our appends."""
        cls._check_durability(durability)
        path = Path(path)
        scan = checked_scan(path, read_settled(path))
        if scan.torn:
            if not repair:
                raise torn_problem(scan, path).error(path)
            with write_lock(path):  # repairing writes: the writers' lock
                scan = checked_scan(path, read_log_bytes(path))
                if scan.torn:
                    repair_tail(path, scan)
                    scan = checked_scan(path, read_log_bytes(path))
        return cls(path, scan.header, scan, durability, repair)  # type: ignore[arg-type]

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
            if self._sync_tail(torn_ok=True):  # a line in flight, or a crashed writer's torn line
                with read_lock(self.path):
                    torn = self._sync_tail(torn_ok=True)
                if torn:  # no writer mid-line: raise it, or repair it (a write, under the writers' lock)
                    with self._lock:
                        self._sync_tail()
        return self.events()

    # ------------------------------------------------------------------ writing

    def append(self, event: Event) -> Event:
        """Append one event; fills `seq`, `id` and `ts` (unless given) and returns the recorded copy."""
        return self._write([event], sync=self.durability == "always")[0]

    def extend(self, events: Iterable[Event]) -> list[Event]:
        """Append several events in one write (and one fsync unless durability is `none`)."""
        events = list(events)
        if not events:
            return []
        return self._write(events, sync=self.durability != "none")

    def flush(self) -> None:
        """fsync the log now."""
        self._check_open()
        os.fsync(self._fd)  # type: ignore[arg-type]

    def close(self) -> None:
        """Close the log (fsync first in `always`/`batch` mode). Closing twice is fine."""
        with self._mutex:
            if self._fd is None:
                return
            try:
                if self.durability != "none":
                    os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventLog({str(self.path)!r}, events={len(self._events)}, durability={self.durability!r})"

    def _check_open(self) -> None:
        if self._fd is None:
            raise ConfigError(f"{self.path}: the log is closed")

    def _write(self, events: list[Event], *, sync: bool) -> list[Event]:
        self._check_open()
        with self._mutex, self._lock:
            self._sync_tail()
            prev, lines, recorded = self._last_hash, [], []
            for event, as_dict, body in stamp(events, len(self._events), time.time()):
                # The line keeps the caller's key order (tool schemas render in that order); the hash is over
                # the sorted canonical form, so verification does not depend on it.
                digest = line_hash(prev, canonical(as_dict))
                lines.append(body[:-1] + b',"prev":"' + prev.encode() + b'","hash":"' + digest.encode() + b'"}\n')
                recorded.append(event)
                prev = digest
            payload = b"".join(lines)
            self._write_all(payload)
            if sync:
                os.fsync(self._fd)  # type: ignore[arg-type]
            self._offset += len(payload)
            self._events.extend(recorded)
            self._last_hash = prev
            self._cache = None
        return recorded

    def _write_all(self, payload: bytes) -> None:
        start = self._offset
        view = memoryview(payload)
        try:
            while view:
                view = view[os.write(self._fd, view):]  # type: ignore[arg-type]
        except BaseException:
            try:  # never leave a partial line behind a failed write (we hold the lock)
                os.ftruncate(self._fd, start)  # type: ignore[arg-type]
            except OSError:
                pass
            raise

    def _sync_tail(self, *, torn_ok: bool = False) -> bool:
        """Take in lines appended by other processes since our last read (called under the lock, or with
        `torn_ok`). A tail without a newline raises (or is repaired), unless `torn_ok`: then it is left
        unread and True is returned."""
        size = os.fstat(self._fd).st_size  # type: ignore[arg-type]
        if size == self._offset:
            return False
        if size < self._offset:
            raise LogFormatError(f"log shrank from {self._offset} to {size} bytes while open", path=str(self.path))
        chunks, pos = [], self._offset
        while pos < size:
            chunk = os.pread(self._fd, size - pos, pos)  # type: ignore[arg-type]
            if not chunk:
                break
            chunks.append(chunk)
            pos += len(chunk)
        data = b"".join(chunks)
        complete = data.rfind(b"\n") + 1
        first = len(self._events) + 2
        prev, new = self._last_hash, []
        for i, raw in enumerate(data[: max(complete - 1, 0)].split(b"\n") if complete else ()):
            try:
                event, prev = check_line(raw, first + i, prev)
            except LineProblem as bad:
                raise bad.error(self.path) from None
            new.append(event)
        self._events.extend(new)
        self._last_hash = prev
        self._offset += complete
        self._cache = None
        if complete != len(data):  # another writer mid-line, or one that died there
            if torn_ok:
                return True
            scan = Scan(n_lines=len(self._events) + 1, torn=data[complete:], last_hash=prev, good_len=self._offset)
            if not self._repair:
                raise torn_problem(scan, self.path).error(self.path)
            repair_tail(self.path, scan)
            self._sync_tail()  # a tail that only lacked its newline is now a line to read
        return False
