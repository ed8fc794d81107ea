"""Seeded long documents for the tasks: filler log lines and chains of files linked by `next:` pointers.

Every chained file starts with a line `next: <path>` (the last one says `next: none`); `read_file` prefixes
its output with `FILE <path>`, so an agent that has lost sight of earlier files can still tell how far it got from the highest file it
sees. Payload lines (the facts a task needs) are placed at seeded positions among the filler.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["filler_lines", "ChainFile", "make_chain", "write_files"]

_SERVICES = ("ingest", "billing", "search", "auth", "export", "scheduler", "cache", "gateway")
_EVENTS = (
    "processed batch {n} in {ms} ms",
    "retrying upstream call {n} after {ms} ms",
    "flushed {n} records to disk in {ms} ms",
    "rotated segment {n}; compaction took {ms} ms",
    "health check {n} passed ({ms} ms)",
    "queue depth {n}, oldest item waiting {ms} ms",
)
_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARN")


def filler_lines(rng: random.Random, n: int) -> list[str]:
    """`n` plausible, seeded log lines carrying no facts a task asks about."""
    lines = []
    for _ in range(n):
        hh, mm, ss = rng.randrange(24), rng.randrange(60), rng.randrange(60)
        event = rng.choice(_EVENTS).format(n=rng.randrange(1000, 99999), ms=rng.randrange(2, 900))
        lines.append(f"{hh:02d}:{mm:02d}:{ss:02d} {rng.choice(_LEVELS)} {rng.choice(_SERVICES)}-{rng.randrange(1, 9)} {event}")
    return lines


@dataclass(frozen=True)
class ChainFile:
    """One file of a chain."""

    path: str
    """Path relative to the task's working directory."""
    text: str
    """Full file text (header, filler and payload lines)."""


def make_chain(
    rng: random.Random,
    paths: Sequence[str],
    lines_per_file: int,
    payloads: Mapping[int, Sequence[str]] | None = None,
    head_lines: Mapping[int, Sequence[str]] | None = None,
) -> list[ChainFile]:
    """Files `paths[i]` linked in order; `payloads[i]` lines go at seeded positions among the filler,
    `head_lines[i]` right after the header (where a truncating compressor keeps them)."""
    payloads = payloads or {}
    head_lines = head_lines or {}
    files = []
    for i, path in enumerate(paths):
        nxt = paths[i + 1] if i + 1 < len(paths) else "none"
        body = filler_lines(rng, lines_per_file)
        for line in payloads.get(i, ()):
            body.insert(rng.randrange(len(body) + 1), line)
        lines = [f"next: {nxt}", *head_lines.get(i, ()), *body]
        files.append(ChainFile(path, "\n".join(lines) + "\n"))
    return files


def write_files(root: Path, files: Sequence[ChainFile]) -> None:
    """Write `files` under `root` (creating folders)."""
    for f in files:
        target = root / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.text, encoding="utf-8")
