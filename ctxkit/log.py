"""The episode log: append-only JSONL (orjson), hash-chained, crash-safe, shared safely between processes.

Format. Line 1 is a header `{"ctxkit_log": SCHEMA_VERSION, "episode_id", "created", "metadata", "hash"}`
where `hash` is the sha256 of the header's other keys as canonical JSON (sorted keys). Every other line
is one event: the event's dict (`events.event_to_dict`) plus `prev` (the hash of the line before) and
`hash` = sha256(prev + canonical event bytes). Editing, deleting, inserting or reordering a line breaks
the chain at that line. A crash mid-append can leave only a torn last line (lines are written whole, by
one `write` on an O_APPEND descriptor); it is detected on open and `repair` removes it, keeping the
removed bytes in a `.torn` side file, or completes it when only its newline is missing.

Concurrency. Every append takes `filelock.FileLock(<path>.lock)` and first reads the lines other
processes appended since our last read, so `seq` stays dense and the chain valid.

Import/export of OpenAI conversations lives in `ctxkit.conversation` and is re-exported here.

L1: imports L0 (`events`, `errors`) and `conversation`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import secrets
import threading
import time
import uuid
from collections import abc
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import orjson

from ctxkit.errors import ConfigError, LogFormatError, MessageFormatError, SchemaVersionError, TornLineError
from ctxkit.conversation import export_conversation, export_messages, import_conversation, load_conversation
from ctxkit.events import EVENT_TYPES, SCHEMA_VERSION, Event, event_from_dict, event_to_dict

DURABILITY_MODES: tuple[str, ...] = ("always", "batch", "none")
"""`always`: fsync after every append. `batch`: fsync per `extend`/`flush` and at close. `none`: never."""
HEADER_KEY = "ctxkit_log"
"""Header key holding the schema version; its presence marks a file as a ctxkit log."""

_EVENT_CLASSES = tuple(EVENT_TYPES.values())
__all__ = ["DURABILITY_MODES", "EventLog", "Problem", "RepairReport", "VerifyReport", "export_conversation",
           "export_messages", "import_conversation", "load_conversation", "read_events", "read_header",
           "repair", "verify"]


# ---------------------------------------------------------------------------------------------- reports


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a log file."""

    line: int
    """1-based line number (the header is line 1)."""
    code: str
    """`json`, `header`, `schema`, `hash`, `chain`, `seq`, `event`, `empty` or `torn`."""
    message: str
    """What is wrong, in words."""


@dataclass(frozen=True)
class VerifyReport:
    """Result of `verify(path)`."""

    path: str
    """The log checked."""
    ok: bool
    """True only for an intact log: valid header, every line chained, no torn tail."""
    n_events: int
    """Number of complete event lines (valid or not)."""
    problems: tuple[Problem, ...]
    """Every problem found, in line order (a torn tail included)."""
    torn_tail: bool
    """True when the last line is incomplete (a crash mid-append)."""
    torn_bytes: int = 0
    """Size of the torn tail."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (for `ctxkit log verify --json`)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RepairReport:
    """Result of `repair(path)`."""

    path: str
    """The log repaired."""
    removed_bytes: int
    """Bytes of torn tail removed from the log (0 when nothing was removed)."""
    completed_line: bool
    """True when the tail was a complete, valid line missing only its newline, which was added instead."""
    side_file: str | None
    """File keeping the removed bytes, so nothing is lost; None when nothing was removed."""
    n_events: int
    """Number of events in the log after repair."""


# ---------------------------------------------------------------------------------------------- encoding


def _canonical(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def _line_hash(prev: str, canonical: bytes) -> str:
    return hashlib.sha256(prev.encode("utf-8") + canonical).hexdigest()


def _check_finite(value: Any, where: str) -> None:
    """orjson writes NaN and infinities as null; refuse them rather than lose them silently."""
    kind = type(value)
    if kind in _LEAVES:
        return
    if kind is float:
        if not math.isfinite(value):
            raise ConfigError(f"{where} is {value!r}; a log holds only finite numbers (JSON has no NaN/inf)")
    elif isinstance(value, (list, tuple)):
        try:  # fast path (in C) for numeric sequences: token ids, log-probs
            if math.isfinite(math.fsum(value)):
                return
        except (TypeError, OverflowError):
            pass
        for i, item in enumerate(value):
            _check_finite(item, f"{where}[{i}]")
    elif isinstance(value, (dict, abc.Mapping)):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, float):
        _check_finite(float(value), where)


_LEAVES = frozenset({str, int, bool, type(None)})


def _dumps_checked(obj: Any, where: str) -> bytes:
    try:
        data = _canonical(obj)
    except orjson.JSONEncodeError as exc:
        raise ConfigError(f"{where} is not JSON-serializable: {exc}") from None
    _check_finite(obj, where)
    return data


class _Bad(Exception):
    """Internal: one problem at one line (converted to a `Problem` or a typed error)."""

    def __init__(self, line: int, code: str, message: str):
        super().__init__(message)
        self.line, self.code, self.message = line, code, message

    def error(self, path: Path) -> LogFormatError:
        cls = {"schema": SchemaVersionError, "torn": TornLineError}.get(self.code, LogFormatError)
        return cls(self.message, path=str(path), line=self.line)


def _loads(raw: bytes, line: int) -> dict[str, Any]:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _Bad(line, "json", f"invalid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(obj, dict):
        raise _Bad(line, "json", f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _check_header(raw: bytes) -> tuple[dict[str, Any], str]:
    obj = _loads(raw, 1)
    if HEADER_KEY not in obj:
        raise _Bad(1, "header", f"not a ctxkit log: the header has no {HEADER_KEY!r} key")
    version = obj[HEADER_KEY]
    if type(version) is not int or version != SCHEMA_VERSION:
        raise _Bad(1, "schema", f"schema version {version!r}; this ctxkit reads version {SCHEMA_VERSION}")
    recorded = obj.pop("hash", None)
    digest = hashlib.sha256(_canonical(obj)).hexdigest()
    if recorded != digest:
        raise _Bad(1, "hash", "header does not match its hash (edited)")
    return obj, digest


def _check_line(raw: bytes, line: int, prev: str | None) -> tuple[Event, str]:
    """Parse and check one event line; `prev` None means the previous line's hash is unknown."""
    if not raw:
        raise _Bad(line, "empty", "empty line")
    obj = _loads(raw, line)
    rec_prev, rec_hash = obj.pop("prev", None), obj.pop("hash", None)
    if not isinstance(rec_prev, str) or not isinstance(rec_hash, str):
        raise _Bad(line, "hash", "line has no 'prev'/'hash' strings")
    if _line_hash(rec_prev, _canonical(obj)) != rec_hash:
        raise _Bad(line, "hash", "event does not match its hash (the line was edited)")
    if prev is not None and rec_prev != prev:
        raise _Bad(line, "chain", f"hash chain broken: 'prev' is not the hash of line {line - 1} "
                                  "(a line was deleted, inserted or reordered)")
    seq = line - 2
    if obj.get("seq") != seq:
        raise _Bad(line, "seq", f"seq is {obj.get('seq')!r}, expected {seq}")
    try:
        event = event_from_dict(obj, where="event")
    except (LogFormatError, MessageFormatError) as exc:
        raise _Bad(line, "event", str(exc)) from None
    return event, rec_hash


@dataclass
class _Scan:
    header: dict[str, Any] | None = None
    events: list = field(default_factory=list)
    last_hash: str | None = None
    n_lines: int = 0
    problems: list = field(default_factory=list)
    good_len: int = 0
    torn: bytes = b""


def _scan(data: bytes, *, collect: bool) -> _Scan:
    """Check a whole log. `collect=False` raises the first problem (a `_Bad`); torn tails are only noted."""
    scan = _Scan()
    scan.good_len = data.rfind(b"\n") + 1
    scan.torn = data[scan.good_len:]
    lines = data[: scan.good_len].split(b"\n")[:-1] if scan.good_len else []
    scan.n_lines = len(lines)
    if not lines:
        return scan
    try:
        scan.header, scan.last_hash = _check_header(lines[0])
    except _Bad as bad:
        if not collect:
            raise
        scan.problems.append(bad)
    for i, raw in enumerate(lines[1:]):
        line = i + 2
        try:
            event, digest = _check_line(raw, line, scan.last_hash)
        except _Bad as bad:
            if not collect:
                raise
            scan.problems.append(bad)
            try:  # keep checking the chain from the recorded hash when the line still parses
                digest = orjson.loads(raw).get("hash")
            except Exception:
                digest = None
            scan.last_hash = digest if isinstance(digest, str) else None
            continue
        scan.events.append(event)
        scan.last_hash = digest
    return scan


def _torn_problem(scan: _Scan, path: Path) -> _Bad:
    line = scan.n_lines + 1
    return _Bad(line, "torn", f"last line is incomplete ({len(scan.torn)} bytes without a newline: a crash "
                              f"mid-append); run `ctxkit log verify {path} --repair` or open with repair=True")


@contextmanager
def _maybe_locked(path: Path):
    """Hold the log's lock when the log exists and the lock file can be created (read-only folders are
    read unlocked; a missing log gets no stray lock file)."""
    from filelock import FileLock

    lock = FileLock(str(path) + ".lock")
    try:
        if not path.is_file():
            raise FileNotFoundError(path)
        lock.acquire()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        lock.release()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise LogFormatError("no such log file", path=str(path)) from None
    except IsADirectoryError:
        raise LogFormatError("is a directory, not a log file", path=str(path)) from None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------- the log


class EventLog:
    """An open episode log: appends events and keeps every event in memory (reading is free)."""

    def __init__(self, path: Path, header: dict[str, Any], scan: _Scan, durability: str, repair: bool = False):
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
        """Create a new, empty log (the header only). Refuses to overwrite an existing file."""
        cls._check_durability(durability)
        path = Path(path)
        header = {
            HEADER_KEY: SCHEMA_VERSION,
            "episode_id": episode_id if episode_id is not None else f"ep-{uuid.uuid4().hex[:12]}",
            "created": time.time(),
            "metadata": dict(metadata or {}),
        }
        body = _dumps_checked(header, "log header")
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
            _fsync_dir(path)
        return cls(path, header, _Scan(header=header, last_hash=digest, n_lines=1, good_len=len(line)), durability)

    @classmethod
    def open(cls, path, *, durability: str = "batch", repair: bool = False) -> "EventLog":
        """Open an existing log, verifying every line. A torn last line is a `TornLineError` unless
        `repair=True`, which repairs it first (see `repair`), and also repairs a torn tail that another,
        crashed writer leaves before one of our appends."""
        cls._check_durability(durability)
        path = Path(path)
        with _maybe_locked(path):
            scan = _checked_scan(path, _read(path))
            if scan.torn:
                if not repair:
                    raise _torn_problem(scan, path).error(path)
                _repair_tail(path, scan)
                scan = _checked_scan(path, _read(path))
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
        with self._mutex, self._lock:
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
        for i, event in enumerate(events):
            if not isinstance(event, _EVENT_CLASSES):
                raise ConfigError(f"event {i}: {type(event).__name__} is not an event type {sorted(EVENT_TYPES)}")
            if event.seq is not None or event.id is not None:
                raise ConfigError(f"event {i} ({event.kind}) already has seq={event.seq!r}, id={event.id!r}; "
                                  "append events you built (seq and id None), not recorded ones")
        with self._mutex, self._lock:
            self._sync_tail()
            seq, prev, now = len(self._events), self._last_hash, time.time()
            lines, recorded = [], []
            for event in events:
                filled = dataclasses.replace(event, seq=seq, id=f"e{seq}-{secrets.token_hex(4)}",
                                             ts=event.ts if event.ts is not None else now)
                body = _dumps_checked(event_to_dict(filled), f"event {seq} ({event.kind})")
                digest = _line_hash(prev, body)
                lines.append(body[:-1] + b',"prev":"' + prev.encode() + b'","hash":"' + digest.encode() + b'"}\n')
                recorded.append(event_from_dict(orjson.loads(body)))  # exactly what a reader gets back
                seq, prev = seq + 1, digest
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

    def _sync_tail(self) -> None:
        """Take in lines appended by other processes since our last read (called under the lock)."""
        size = os.fstat(self._fd).st_size  # type: ignore[arg-type]
        if size == self._offset:
            return
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
                event, prev = _check_line(raw, first + i, prev)
            except _Bad as bad:
                raise bad.error(self.path) from None
            new.append(event)
        self._events.extend(new)
        self._last_hash = prev
        self._offset += complete
        self._cache = None
        if complete != len(data):  # another writer died mid-line
            scan = _Scan(n_lines=len(self._events) + 1, torn=data[complete:], last_hash=prev, good_len=self._offset)
            if not self._repair:
                raise _torn_problem(scan, self.path).error(self.path)
            _repair_tail(self.path, scan)
            self._sync_tail()  # a tail that only lacked its newline is now a line to read


def _checked_scan(path: Path, data: bytes) -> _Scan:
    try:
        scan = _scan(data, collect=False)
    except _Bad as bad:
        raise bad.error(path) from None
    if scan.header is None and not scan.torn:
        raise LogFormatError("empty file: not a ctxkit log (no header)", path=str(path), line=1)
    return scan


# ---------------------------------------------------------------------------------------------- whole-file tools


def read_events(path, *, allow_torn: bool = False) -> tuple[Event, ...]:
    """Read and verify a log without opening it for writing. A torn tail raises `TornLineError` unless
    `allow_torn` (then it is ignored: it holds no complete event)."""
    path = Path(path)
    with _maybe_locked(path):
        data = _read(path)
    scan = _checked_scan(path, data)
    if scan.torn and not allow_torn:
        raise _torn_problem(scan, path).error(path)
    if scan.header is None:
        raise LogFormatError("no complete header line", path=str(path), line=1)
    return tuple(scan.events)


def read_header(path) -> dict[str, Any]:
    """The verified header of a log (schema version, episode id, created, metadata)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            first = fh.readline()
    except OSError as exc:
        raise LogFormatError(f"cannot read: {exc.strerror}", path=str(path)) from None
    if not first.endswith(b"\n"):
        raise TornLineError("the header line is incomplete", path=str(path), line=1)
    try:
        return _check_header(first[:-1])[0]
    except _Bad as bad:
        raise bad.error(path) from None


def verify(path) -> VerifyReport:
    """Check every line of a log; reports all problems (with 1-based line numbers) instead of raising."""
    path = Path(path)
    with _maybe_locked(path):
        data = _read(path)
    scan = _scan(data, collect=True)
    problems = [Problem(b.line, b.code, b.message) for b in scan.problems]
    if scan.n_lines == 0 and not scan.torn:
        problems.append(Problem(1, "empty", "empty file: not a ctxkit log (no header)"))
    if scan.torn:
        bad = _torn_problem(scan, path)
        problems.append(Problem(bad.line, bad.code, bad.message))
    return VerifyReport(path=str(path), ok=not problems, n_events=max(scan.n_lines - 1, 0),
                        problems=tuple(problems), torn_tail=bool(scan.torn), torn_bytes=len(scan.torn))


def repair(path) -> RepairReport:
    """Fix a torn last line: complete it when only the newline is missing, else truncate it after saving the
    removed bytes to a `.torn` side file. Never touches a complete line; any other corruption is refused
    (`LogFormatError` naming the line)."""
    path = Path(path)
    with _maybe_locked(path):
        scan = _scan(_read(path), collect=True)
        if scan.problems:
            bad = scan.problems[0]
            raise LogFormatError(f"{bad.message}; repair only fixes a torn last line", path=str(path), line=bad.line)
        removed, completed, side = _repair_tail(path, scan) if scan.torn else (0, False, None)
        n_events = len(_scan(_read(path), collect=False).events)
    return RepairReport(path=str(path), removed_bytes=removed, completed_line=completed,
                        side_file=side, n_events=n_events)


def _repair_tail(path: Path, scan: _Scan) -> tuple[int, bool, str | None]:
    """Called under the lock with a scan whose only problem is its torn tail."""
    try:  # a complete, valid line missing only its newline: keep it
        if scan.n_lines == 0:
            _check_header(scan.torn)
        else:
            _check_line(scan.torn, scan.n_lines + 1, scan.last_hash)
        complete = True
    except _Bad:
        complete = False
    if complete:
        with open(path, "ab") as fh:
            fh.write(b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        return 0, True, None
    side = path.with_name(path.name + ".torn")
    n = 1
    while side.exists():
        side = path.with_name(f"{path.name}.torn.{n}")
        n += 1
    with open(side, "xb") as fh:  # keep the bytes first, then cut them
        fh.write(scan.torn)
        fh.flush()
        os.fsync(fh.fileno())
    os.truncate(path, scan.good_len)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(path)
    return len(scan.torn), False, str(side)
