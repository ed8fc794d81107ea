"""Reading a trajectory file: one JSON document, or JSON Lines (one document per line) read line by line.

A JSONL file is read as the list of its rows, so the importers see the same shape either way; a line that
is not JSON does not stop the others: it stays in the list as a `BadLine` (its number and the parser's
message), which the import reports as a skipped episode, or refuses with `strict`. A file is JSONL when its
name ends in `.jsonl`, or when it is not one JSON document but its first line is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ctxkit.errors import LogFormatError


@dataclass(frozen=True)
class BadLine:
    """A JSONL line that does not parse (kept in the row list in its place)."""

    line: int
    """1-based line number."""
    message: str
    """What the JSON parser says, with the column."""


@dataclass(frozen=True)
class SourceDocument:
    """A parsed trajectory file."""

    value: Any
    """The JSON document, or a JSONL file's rows (a list; an unparsable line is a `BadLine`)."""
    lines: tuple[int, ...] | None = None
    """For a JSONL file, the 1-based line of each row of `value`; None for a JSON file."""


def load_source(path: str | Path) -> SourceDocument:
    """The file parsed (see the module docstring); unreadable, or neither JSON nor JSONL, is a
    `LogFormatError` naming the file, line and column."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LogFormatError(f"cannot read: {exc.strerror}", path=str(path)) from None
    if path.suffix == ".jsonl":
        return _json_lines(data)
    try:
        return SourceDocument(orjson.loads(data))
    except orjson.JSONDecodeError as exc:
        if _first_line_parses(data):
            return _json_lines(data)
        raise LogFormatError(f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}, byte {exc.pos})",
                             path=str(path), line=exc.lineno) from None


def _first_line_parses(data: bytes) -> bool:
    first = data.lstrip().split(b"\n", 1)[0]
    try:
        return isinstance(orjson.loads(first), dict)
    except orjson.JSONDecodeError:
        return False


def _json_lines(data: bytes) -> SourceDocument:
    rows: list[Any] = []
    lines: list[int] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            rows.append(orjson.loads(raw))
        except orjson.JSONDecodeError as exc:
            rows.append(BadLine(number, f"invalid JSON: {exc.msg} (column {exc.colno})"))
        lines.append(number)
    return SourceDocument(rows, tuple(lines))
