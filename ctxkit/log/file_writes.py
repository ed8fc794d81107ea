"""File-level steps of an `EventLog`'s writes: creating a log file atomically, writing a payload whole, and
reading the lines another writer appended.

`ctxkit.log.event_log.EventLog` keeps the state (offset, last hash, events) and the locking; these functions do the
system calls and checks on one descriptor, so the two stay small.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
import uuid
from pathlib import Path
from typing import Any, Mapping

from ctxkit.errors import ConfigError, LogFormatError
from ctxkit.events import SCHEMA_VERSION, Event
from ctxkit.log.file_format import HEADER_KEY, LineProblem, Scan, check_line, dumps_checked, fsync_dir

__all__ = ["create_file", "read_appended", "write_all"]


def create_file(path: Path, *, episode_id: str | None, durability: str, metadata: Mapping[str, Any] | None) -> Scan:
    """Create a log holding only its header (and its folder if needed), atomically: the header is written (and
    fsynced unless `durability` is `none`) to a temporary file, then linked into place. `ConfigError` when the
    file exists or the folder cannot be made. Returns the scan of the new file."""
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
    return Scan(header=header, last_hash=digest, n_lines=1, good_len=len(line))


def write_all(fd: int, payload: bytes, start: int) -> None:
    """Write `payload` at the end of the file (an O_APPEND descriptor whose end is `start`), in one `write`
    when the OS takes it all; on any failure cut the file back to `start`, so no partial line is left (the
    caller holds the log)."""
    try:
        written = os.write(fd, payload)
        if written == len(payload):  # one write: the usual case
            return
        view = memoryview(payload)[written:]
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass
        raise


def read_appended(fd: int, offset: int, first_line: int, prev: str, path: Path) -> tuple[list[Event], str, int, bytes]:
    """Read and check the lines appended after `offset` (line number `first_line` onwards, chained to `prev`):
    returns `(events, last hash, bytes of complete lines, the tail without a newline)`. `LogFormatError` when
    the file shrank or a line is bad."""
    size = os.lseek(fd, 0, os.SEEK_END)  # writes append; reads use pread
    if size == offset:
        return [], prev, 0, b""
    if size < offset:
        raise LogFormatError(f"log shrank from {offset} to {size} bytes while open", path=str(path))
    chunks, pos = [], offset
    while pos < size:
        chunk = os.pread(fd, size - pos, pos)
        if not chunk:
            break
        chunks.append(chunk)
        pos += len(chunk)
    data = b"".join(chunks)
    complete = data.rfind(b"\n") + 1
    new = []
    for i, raw in enumerate(data[: max(complete - 1, 0)].split(b"\n") if complete else ()):
        try:
            event, prev = check_line(raw, first_line + i, prev)
        except LineProblem as bad:
            raise bad.error(path) from None
        new.append(event)
    return new, prev, complete, data[complete:]
