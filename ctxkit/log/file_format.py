"""The episode log's file format: line encoding, hash-chain checks, `verify`, `repair`, `read_events`, `iter_events`.

Line 1 is a header `{"ctxkit_log": SCHEMA_VERSION, "episode_id", "created", "metadata", "hash"}` where
`hash` is the sha256 of the header's other keys as canonical JSON (orjson, sorted keys). Every other line
is one event: the event's dict (`events.event_to_dict`) plus `prev` (the hash of the line before) and
`hash` = sha256(prev + canonical event bytes). Editing, deleting, inserting or reordering a line breaks
the chain at that line. A crash mid-append can leave only a torn last line (`EventLog` writes whole lines
with one `write` on an O_APPEND descriptor); `repair` removes it, keeping the removed bytes in a `.torn`
side file, or completes it when only its newline is missing.

Locks (`ctxkit.log.locks`). Only writers lock: an append or a repair holds an exclusive `flock` on
`<log>.lock` (a `lock="writer"` handle holds it from open to close). Readers (`read_events`, `iter_events`,
`verify`, a `repair` with nothing to repair) never create that file, so reading a log leaves its folder as it
was; a reader that finds a tail without a newline re-reads it while a writer holds the lock
(`wait_in_flight`), so a line in flight is not reported torn, and it never hangs: after `IN_FLIGHT_WAIT_S`
with the writer still holding the lock the tail is reported as in flight or torn, naming the writer.

The helpers without a leading underscore that are not in `__all__` (`check_line`, `scan_log`, ...) are
shared with `ctxkit.log.event_log`'s writer; they are not part of the public API.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import orjson

from ctxkit.errors import ConfigError, LogFormatError, MessageFormatError, SchemaVersionError, TornLineError
from ctxkit.events import SCHEMA_VERSION, Event, event_from_dict
from ctxkit.log.locks import in_flight_wait_s, wait_in_flight, write_lock

HEADER_KEY = "ctxkit_log"
"""Header key holding the schema version; its presence marks a file as a ctxkit log."""

EMPTY_LOG = "empty log: no header line (a ctxkit log starts with its header; was the file truncated or never written?)"
"""What every reader says of a log file with no bytes at all (a `LogFormatError` naming the file, line 1)."""

__all__ = ["HEADER_KEY", "Problem", "RepairReport", "VerifyReport", "iter_events", "read_events", "read_header", "repair",
           "verify"]


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


def canonical(obj: Any) -> bytes:
    """Canonical JSON bytes (orjson, sorted keys): what line hashes are computed over."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def line_hash(prev: str, body: bytes) -> str:
    """The hash of an event line: sha256 over the previous line's hash and the canonical event bytes."""
    return hashlib.sha256(prev.encode("utf-8") + body).hexdigest()


def check_finite(value: Any, where: str) -> None:
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
            check_finite(item, f"{where}[{i}]")
    elif isinstance(value, (dict, abc.Mapping)):
        for key, item in value.items():
            check_finite(item, f"{where}.{key}")
    elif isinstance(value, float):
        check_finite(float(value), where)


_LEAVES = frozenset({str, int, bool, type(None)})


def not_utf8(value: Any, where: str = "") -> tuple[str, str] | None:
    """`(place, text)` of the first string (key or value) in `value` that is not valid UTF-8 (surrogates, e.g.
    the escaped bytes of a file name that is not UTF-8), `place` dotted from `where` (`.key[0]`), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where, value
        return None
    items = value.items() if isinstance(value, (dict, abc.Mapping)) else (
        ((f"[{i}]", v) for i, v in enumerate(value)) if isinstance(value, (list, tuple)) else ())
    for key, item in items:
        place = key if isinstance(value, (list, tuple)) else f".{key}"
        found = not_utf8(key, f"{where}[key]") if isinstance(key, str) and place[0] == "." else None
        found = found or not_utf8(item, where + place)
        if found is not None:
            return found
    return None


def json_error(obj: Any, where: str, exc: Exception) -> ConfigError:
    """The `ConfigError` for `obj` failing to serialize as JSON (`exc`): names the field whose text is not
    UTF-8 when that is the cause, else `where` and orjson's reason."""
    found = not_utf8(obj) if "surrogates not allowed" in str(exc) else None
    if found is not None:
        return ConfigError(f"{where}: {found[0].lstrip('.') or 'the value'} is not UTF-8 text ({found[1]!r}); a log "
                           "holds only UTF-8 JSON (record a file name as os.fsencode(path).decode('utf-8', "
                           "'backslashreplace'))")
    return ConfigError(f"{where} is not JSON-serializable: {exc}")


def dumps_checked(obj: Any, where: str) -> bytes:
    """Canonical bytes of `obj`; `ConfigError` naming `where` when it is not JSON (naming the field whose
    text is not UTF-8) or holds NaN/inf."""
    try:
        data = canonical(obj)
    except orjson.JSONEncodeError as exc:
        raise json_error(obj, where, exc) from None
    check_finite(obj, where)
    return data


class LineProblem(Exception):
    """Internal: one problem at one line (converted to a `Problem` or a typed error)."""

    def __init__(self, line: int, code: str, message: str):
        super().__init__(message)
        self.line, self.code, self.message = line, code, message

    def error(self, path: Path) -> LogFormatError:
        """The typed error for this problem in `path`."""
        cls = {"schema": SchemaVersionError, "torn": TornLineError}.get(self.code, LogFormatError)
        return cls(self.message, path=str(path), line=self.line)


def _loads(raw: bytes, line: int) -> dict[str, Any]:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise LineProblem(line, "json", f"invalid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(obj, dict):
        raise LineProblem(line, "json", f"expected a JSON object, got {type(obj).__name__}")
    return obj


def check_header(raw: bytes) -> tuple[dict[str, Any], str]:
    """`(header without its hash, header hash)` of line 1, or `LineProblem`."""
    obj = _loads(raw, 1)
    if HEADER_KEY not in obj:
        raise LineProblem(1, "header", f"not a ctxkit log: the header has no {HEADER_KEY!r} key")
    version = obj[HEADER_KEY]
    if type(version) is not int or version != SCHEMA_VERSION:
        raise LineProblem(1, "schema", f"schema version {version!r}; this ctxkit reads version {SCHEMA_VERSION}")
    recorded = obj.pop("hash", None)
    digest = hashlib.sha256(canonical(obj)).hexdigest()
    if recorded != digest:
        raise LineProblem(1, "hash", "header does not match its hash (edited)")
    return obj, digest


def check_line(raw: bytes, line: int, prev: str | None) -> tuple[Event, str]:
    """Parse and check one event line; `prev` None means the previous line's hash is unknown."""
    if not raw:
        raise LineProblem(line, "empty", "empty line")
    obj = _loads(raw, line)
    rec_prev, rec_hash = obj.pop("prev", None), obj.pop("hash", None)
    if not isinstance(rec_prev, str) or not isinstance(rec_hash, str):
        raise LineProblem(line, "hash", "line has no 'prev'/'hash' strings")
    if line_hash(rec_prev, canonical(obj)) != rec_hash:
        raise LineProblem(line, "hash", "event does not match its hash (the line was edited)")
    if prev is not None and rec_prev != prev:
        raise LineProblem(line, "chain", f"hash chain broken: 'prev' is not the hash of line {line - 1} "
                                  "(a line was deleted, inserted or reordered)")
    seq = line - 2
    if obj.get("seq") != seq:
        raise LineProblem(line, "seq", f"seq is {obj.get('seq')!r}, expected {seq}")
    try:
        event = event_from_dict(obj, where="event")
    except (LogFormatError, MessageFormatError) as exc:
        raise LineProblem(line, "event", str(exc)) from None
    return event, rec_hash


@dataclass
class Scan:
    """What a pass over a log's bytes found (internal record shared with `ctxkit.log.event_log`)."""

    header: dict[str, Any] | None = None
    events: list = field(default_factory=list)
    last_hash: str | None = None
    n_lines: int = 0
    problems: list = field(default_factory=list)
    good_len: int = 0
    torn: bytes = b""
    in_flight: str | None = None  # the torn tail's writer still held the lock after IN_FLIGHT_WAIT_S (who)


def scan_lines(lines: Iterable[bytes], *, collect: bool, keep_events: bool = True, scan: Scan | None = None) -> Scan:
    """Check a log's lines (each with its newline; a last one without is its torn tail), one at a time, so
    a file streams through in constant memory (`keep_events=False` keeps no events either). `collect=False`
    raises the first problem (a `LineProblem`); a torn tail is only noted. Continues `scan` when given."""
    scan = scan if scan is not None else Scan()
    for raw in lines:
        if not raw.endswith(b"\n"):
            scan.torn = raw
            break
        scan.good_len += len(raw)
        scan.n_lines += 1
        line, raw = scan.n_lines, raw[:-1]
        if line == 1:
            try:
                scan.header, scan.last_hash = check_header(raw)
            except LineProblem as bad:
                if not collect:
                    raise
                scan.problems.append(bad)
            continue
        try:
            event, digest = check_line(raw, line, scan.last_hash)
        except LineProblem as bad:
            if not collect:
                raise
            scan.problems.append(bad)
            try:  # keep checking the chain from the recorded hash when the line still parses
                digest = orjson.loads(raw).get("hash")
            except Exception:
                digest = None
            scan.last_hash = digest if isinstance(digest, str) else None
            continue
        if keep_events:
            scan.events.append(event)
        scan.last_hash = digest
    return scan


def scan_log(path: Path, *, collect: bool, keep_events: bool = True, settle: bool = True) -> Scan:
    """Stream a log file through `scan_lines` without taking the writers' lock. A writer holds the lock
    while a line is being written, so a tail without a newline is either that line in flight or a crashed
    writer's torn line: with `settle`, only then re-read on from there until it is complete or known torn
    (`wait_in_flight`; `Scan.in_flight` names a writer that still held the lock when the wait ended).
    Reading never creates a `.lock` file. `LogFormatError` when the file is missing or a folder."""
    with open_log(path) as fh:
        scan = scan_lines(fh, collect=collect, keep_events=keep_events)
        if scan.torn and settle:
            def read_on() -> bool:
                fh.seek(scan.good_len)
                scan.torn = b""
                scan_lines(fh, collect=collect, keep_events=keep_events, scan=scan)
                return not scan.torn

            scan.in_flight = wait_in_flight(path, read_on) or None
    return scan


def open_log(path: Path):
    """The log file opened for reading (binary); `LogFormatError` when it is missing or a folder."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise LogFormatError("no such log file", path=str(path)) from None
    except IsADirectoryError:
        raise LogFormatError("is a directory, not a log file", path=str(path)) from None


def torn_problem(scan: Scan, path: Path) -> LineProblem:
    """The problem describing a scan's torn tail."""
    line = scan.n_lines + 1
    if scan.in_flight:
        return LineProblem(line, "torn", f"last line is incomplete ({len(scan.torn)} bytes without a newline) and "
                                  f"a writer still held the log after {in_flight_wait_s():g} s ({scan.in_flight}): a "
                                  "line being written, or one that writer tore; read again, or pass allow_torn=True")
    return LineProblem(line, "torn", f"last line is incomplete ({len(scan.torn)} bytes without a newline: a crash "
                              f"mid-append); run `ctxkit log verify {path} --repair` or open with repair=True")


def fsync_dir(path: Path) -> None:
    """fsync the folder holding `path` (so a created or renamed entry survives a power loss); best effort."""
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


def checked_scan(path: Path, *, settle: bool = True) -> Scan:
    """Stream a whole log (`scan_log`), raising the typed error of its first problem (a torn tail is only
    noted)."""
    try:
        scan = scan_log(path, collect=False, settle=settle)
    except LineProblem as bad:
        raise bad.error(path) from None
    if scan.header is None and not scan.torn:
        raise LogFormatError(EMPTY_LOG, path=str(path), line=1)
    return scan


# ---------------------------------------------------------------------------------------------- whole-file tools


def read_events(path, *, allow_torn: bool = False) -> tuple[Event, ...]:
    """Read and verify a log without opening it for writing. A torn tail raises `TornLineError` unless
    `allow_torn` (then it is ignored: it holds no complete event)."""
    path = Path(path)
    scan = checked_scan(path)
    if scan.torn and not allow_torn:
        raise torn_problem(scan, path).error(path)
    if scan.header is None:
        raise LogFormatError("no complete header line", path=str(path), line=1)
    return tuple(scan.events)


def iter_events(path, *, allow_torn: bool = False) -> Iterator[Event]:
    """Stream a log's events one at a time, each line and the chain checked as it is read, holding one line in
    memory (not the file): for logs too large to keep, or to stop early. The first problem raises its typed
    error when the stream reaches it, after the events before it were yielded. A tail without a newline is
    re-read like `read_events` does (a line in flight; never a hang behind an idle writer), then a
    `TornLineError` unless `allow_torn` (then it ends the stream: it holds no complete event). The file stays
    open until the stream ends or is closed."""
    path = Path(path)
    with open_log(path) as fh:
        line, pos, prev = 0, 0, ""
        while raw := fh.readline():
            if not raw.endswith(b"\n"):  # a line in flight (read it again while its writer holds the lock) or torn
                def read_again() -> bool:
                    nonlocal raw
                    fh.seek(pos)
                    raw = fh.readline()
                    return raw.endswith(b"\n")

                held = wait_in_flight(path, read_again)
                if not raw.endswith(b"\n"):
                    if line == 0:
                        raise TornLineError("the header line is incomplete", path=str(path), line=1)
                    if allow_torn:
                        return
                    raise torn_problem(Scan(n_lines=line, torn=raw, in_flight=held or None), path).error(path)
            pos += len(raw)
            line += 1
            try:
                if line == 1:
                    prev = check_header(raw[:-1])[1]
                    continue
                event, prev = check_line(raw[:-1], line, prev)
            except LineProblem as bad:
                raise bad.error(path) from None
            yield event
        if line == 0:
            raise LogFormatError(EMPTY_LOG, path=str(path), line=1)


def read_header(path) -> dict[str, Any]:
    """The verified header of a log (schema version, episode id, created, metadata)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            first = fh.readline()
    except OSError as exc:
        raise LogFormatError(f"cannot read: {exc.strerror}", path=str(path)) from None
    if not first:
        raise LogFormatError(EMPTY_LOG, path=str(path), line=1)
    if not first.endswith(b"\n"):
        raise TornLineError("the header line is incomplete", path=str(path), line=1)
    try:
        return check_header(first[:-1])[0]
    except LineProblem as bad:
        raise bad.error(path) from None


def verify(path) -> VerifyReport:
    """Check every line of a log; reports all problems (with 1-based line numbers) instead of raising."""
    path = Path(path)
    scan = scan_log(path, collect=True, keep_events=False)
    problems = [Problem(b.line, b.code, b.message) for b in scan.problems]
    if scan.n_lines == 0 and not scan.torn:
        problems.append(Problem(1, "empty", EMPTY_LOG))
    if scan.torn:
        bad = torn_problem(scan, path)
        problems.append(Problem(bad.line, bad.code, bad.message))
    return VerifyReport(path=str(path), ok=not problems, n_events=max(scan.n_lines - 1, 0),
                        problems=tuple(problems), torn_tail=bool(scan.torn), torn_bytes=len(scan.torn))


def repair(path) -> RepairReport:
    """Fix a torn last line: complete it when only the newline is missing, else truncate it after saving the
    removed bytes to a `.torn` side file. Never touches a complete line; any other corruption is refused
    (`LogFormatError` naming the line)."""
    path = Path(path)
    scan = _repairable(path, settle=True)
    if scan.n_lines == 0 and not scan.torn:  # no bytes at all: nothing a repair could keep
        raise LogFormatError(EMPTY_LOG, path=str(path), line=1)
    if not scan.torn:  # nothing to write, so no lock taken
        return RepairReport(path=str(path), removed_bytes=0, completed_line=False, side_file=None,
                            n_events=max(scan.n_lines - 1, 0))
    with write_lock(path):
        scan = _repairable(path, settle=False)
        removed, completed, side = repair_tail(path, scan) if scan.torn else (0, False, None)
        n_events = max(scan_log(path, collect=False, keep_events=False, settle=False).n_lines - 1, 0)
    return RepairReport(path=str(path), removed_bytes=removed, completed_line=completed,
                        side_file=side, n_events=n_events)


def _repairable(path: Path, *, settle: bool) -> Scan:
    scan = scan_log(path, collect=True, keep_events=False, settle=settle)
    if scan.problems:
        bad = scan.problems[0]
        raise LogFormatError(f"{bad.message}; repair only fixes a torn last line", path=str(path), line=bad.line)
    return scan


def repair_tail(path: Path, scan: Scan) -> tuple[int, bool, str | None]:
    """Called under the lock with a scan whose only problem is its torn tail."""
    try:  # a complete, valid line missing only its newline: keep it
        if scan.n_lines == 0:
            check_header(scan.torn)
        else:
            check_line(scan.torn, scan.n_lines + 1, scan.last_hash)
        complete = True
    except LineProblem:
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
    fsync_dir(path)
    return len(scan.torn), False, str(side)
