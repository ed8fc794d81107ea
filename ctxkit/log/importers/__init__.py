"""Trajectory importers: other agents' recorded episodes -> ctxkit events.

`IMPORTERS` is the explicit registry (format name -> `Importer`); `read_episodes(path, format="auto")`
reads a file into `ImportedEpisode` records (entry id, events, source info), one per episode. All format
knowledge lives in this package; the mappings are documented in docs/IMPORTERS.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from ctxkit.log.conversation import load_conversation
from ctxkit.errors import ConfigError, ImportFormatError
from ctxkit.log.importers import adp, openai_chat, swe_agent, tau_bench
from ctxkit.log.importers.common import ImportedEpisode, Importer, SourceInfo, load_tools

IMPORTERS: dict[str, Importer] = {
    "openai": openai_chat.IMPORTER,
    "swe-agent": swe_agent.IMPORTER,
    "tau-bench": tau_bench.IMPORTER,
    "adp": adp.IMPORTER,
}
"""Format name -> importer (an explicit dict; nothing registers itself)."""

FORMATS: tuple[str, ...] = ("auto", *IMPORTERS)
"""The values `--format` accepts."""

__all__ = ["FORMATS", "IMPORTERS", "ImportedEpisode", "Importer", "SourceInfo", "detect_format", "read_episodes",
           "read_tools", "select_episodes"]


def detect_format(obj: Any, path: str = "") -> str:
    """The one format whose shape `obj` has; else an `ImportFormatError` listing the formats."""
    found = [name for name, importer in IMPORTERS.items() if importer.matches(obj)]
    if len(found) == 1:
        return found[0]
    known = "; ".join(f"{name}: {imp.description}" for name, imp in IMPORTERS.items())
    if not found:
        shape = f"an object with keys {sorted(obj)[:8]}" if isinstance(obj, dict) else \
            f"a list of {len(obj)}" if isinstance(obj, list) else f"a {type(obj).__name__}"
        raise ImportFormatError(f"no known trajectory format matches {shape}; known formats: {known}", path=path)
    raise ImportFormatError(f"the shape matches several formats {found}; pass --format", path=path)


def read_tools(path: str | Path) -> list[dict[str, Any]]:
    """A tools file (a JSON list of OpenAI tool schemas), checked."""
    return load_tools(load_conversation(path), str(path))


def read_episodes(path: str | Path, format: str = "auto", select: str | None = None,
                  tools: Sequence[Any] | None = None) -> list[ImportedEpisode]:
    """Every episode of a trajectory file (or those `select` names, see `select_episodes`), as events.
    `format` is a key of `IMPORTERS` or `"auto"`; `tools` replace the file's tool schemas when given."""
    if format not in FORMATS:
        raise ConfigError(f"format {format!r}: expected one of {list(FORMATS)}")
    obj = load_conversation(path)
    name = detect_format(obj, str(path)) if format == "auto" else format
    importer = IMPORTERS[name]
    if format != "auto" and not importer.matches(obj):
        raise ImportFormatError(f"not a {name} file ({importer.description})", path=str(path))
    episodes = importer.read(obj, str(path), tools=None if tools is None else list(tools))
    return episodes if select is None else select_episodes(episodes, select)


_RANGE = re.compile(r"^(\d*):(\d*)$")


def select_episodes(episodes: Sequence[ImportedEpisode], select: str) -> list[ImportedEpisode]:
    """The episodes named by `select`: comma-separated items, each an entry id, an index `N`, or an index
    range `A:B` (half-open, either end may be left out). An id wins over an index of the same spelling.
    Kept in file order, each once; an item naming nothing is a `ConfigError`."""
    by_id = {e.entry_id: i for i, e in enumerate(episodes) if e.entry_id}
    chosen: set[int] = set()
    for item in (s.strip() for s in select.split(",")):
        if not item:
            raise ConfigError(f"--select {select!r}: empty item")
        if item in by_id:
            chosen.add(by_id[item])
        elif item.isdigit():
            if int(item) >= len(episodes):
                raise ConfigError(f"--select {item}: index out of range (the file has {len(episodes)} episodes)")
            chosen.add(int(item))
        elif _RANGE.match(item):
            a, b = _RANGE.match(item).groups()  # type: ignore[union-attr]
            picked = range(len(episodes))[slice(int(a) if a else None, int(b) if b else None)]
            if not picked:
                raise ConfigError(f"--select {item}: empty range (the file has {len(episodes)} episodes)")
            chosen.update(picked)
        else:
            sample = ", ".join(list(by_id)[:3]) or "(the episodes have no ids)"
            raise ConfigError(f"--select {item!r}: no episode has this id, and it is not an index or A:B range "
                              f"(ids look like: {sample})")
    return [episodes[i] for i in sorted(chosen)]
