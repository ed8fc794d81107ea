"""Trajectory importers: other agents' recorded episodes -> ctxkit events.

`IMPORTERS` is the explicit registry (format name -> `Importer`); `import_file(path, format="auto")` reads a
file (JSON, or JSONL line by line) episode by episode into `ImportedEpisode` records (entry id, events,
source info) and reports the malformed episodes it skipped; `read_episodes` is its strict form. All format
knowledge lives in this package; the mappings are documented in docs/IMPORTERS.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from ctxkit.log.conversation import load_conversation
from ctxkit.errors import ConfigError, ImportFormatError
from ctxkit.log.importers import (adp, adp_standardized, mini_swe_agent, openai_chat, openhands, sharegpt, swe_agent,
                                  tau2, tau_bench)
from ctxkit.log.importers.common import (ImportedEpisode, Importer, ImportResult, SkippedEntry, SourceInfo,
                                         episode_label, load_tools)
from ctxkit.log.importers.source_file import BadLine, load_source

IMPORTERS: dict[str, Importer] = {
    "openai": openai_chat.IMPORTER,
    "swe-agent": swe_agent.IMPORTER,
    "tau-bench": tau_bench.IMPORTER,
    "adp": adp.IMPORTER,
    "mini-swe-agent": mini_swe_agent.IMPORTER,
    "openhands": openhands.IMPORTER,
    "tau2": tau2.IMPORTER,
    "sharegpt": sharegpt.IMPORTER,
    "adp-std": adp_standardized.IMPORTER,
}
"""Format name -> importer (an explicit dict; nothing registers itself)."""

FORMATS: tuple[str, ...] = ("auto", *IMPORTERS)
"""The values `--format` accepts."""

__all__ = ["FORMATS", "IMPORTERS", "ImportResult", "ImportedEpisode", "Importer", "SkippedEntry", "SourceInfo",
           "detect_format", "import_file", "read_episodes", "read_tools", "select_episodes", "select_indexes"]


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
                  tools: Sequence[Any] | None = None, *, strict: bool = True) -> list[ImportedEpisode]:
    """Every episode of a trajectory file (or those `select` names, see `select_episodes`), as events.
    `format` is a key of `IMPORTERS` or `"auto"`; `tools` replace the file's tool schemas when given.
    Strict by default: a malformed episode is an `ImportFormatError` (`import_file` skips and reports it)."""
    return list(import_file(path, format, select=select, tools=tools, strict=strict).episodes)


def import_file(path: str | Path, format: str = "auto", select: str | None = None,
                tools: Sequence[Any] | None = None, *, strict: bool = False) -> ImportResult:
    """The episodes of a trajectory file, read one by one: `select` picks them before any is read; a
    malformed episode (a bad JSONL line, a turn that breaks its format) is skipped and reported in
    `ImportResult.skipped`, or with `strict` raised. An entry without its format's shape (a file that
    mixes or breaks formats), repeated entry ids, or a file whose every chosen episode is malformed is an
    `ImportFormatError` naming the file, the entry and what is wrong."""
    if format not in FORMATS:
        raise ConfigError(f"format {format!r}: expected one of {list(FORMATS)}")
    path = str(path)
    doc = load_source(path)
    probe = [row for row in doc.value if not isinstance(row, BadLine)] if doc.lines is not None else doc.value
    name = detect_format(probe, path) if format == "auto" else format
    importer = IMPORTERS[name]
    if format != "auto" and not importer.matches(probe):
        raise ImportFormatError(f"not a {name} file ({importer.description})", path=path)
    items = list(importer.entries(doc.value))
    rows = doc.lines is not None and len(items) == len(doc.lines) and all(a is b for a, b in zip(items, doc.value))
    lines = doc.lines if rows else None  # each JSONL row is an episode: name its line
    ids = [importer.entry_id(item, i) if not isinstance(item, BadLine) else "" for i, item in enumerate(items)]
    _check_unique(ids, lines, path)
    chosen = range(len(items)) if select is None else select_indexes(ids, select)
    episodes: list[ImportedEpisode] = []
    skipped: list[SkippedEntry] = []
    errors: list[ImportFormatError] = []
    for i in chosen:
        source = SourceInfo(path=path, format=name, entry_id=ids[i], index=i, line=lines[i] if lines else None)
        try:
            episodes.append(_read_one(importer, items[i], source, tools, doc.value))
        except _Malformed as exc:
            if strict:
                raise exc.error from None
            skipped.append(SkippedEntry(index=i, entry_id=ids[i], reason=str(exc.error)))
            errors.append(exc.error)
    if len(errors) == 1 and not episodes:
        raise errors[0]
    if not episodes:
        raise ImportFormatError(f"no episode could be read; {len(skipped)} malformed, the first: {skipped[0].reason}",
                                path=path)
    return ImportResult(episodes=tuple(episodes), skipped=tuple(skipped))


class _Malformed(Exception):
    """An episode's own content is bad (skippable); wraps its `ImportFormatError`."""

    def __init__(self, error: ImportFormatError):
        super().__init__(str(error))
        self.error = error


def _read_one(importer: Importer, item: Any, source: SourceInfo, tools, document) -> ImportedEpisode:
    label = episode_label(source)
    if isinstance(item, BadLine):
        raise _Malformed(ImportFormatError(item.message, path=source.path, line=item.line, episode=label))
    problem = importer.entry_problem(item)
    if problem is not None:  # the file mixes or breaks formats: not skippable
        other = next((n for n, imp in IMPORTERS.items() if n != importer.name and imp.entry_problem(item) is None), None)
        mixed = f"; it is a {other} entry in a {importer.name} file (the file mixes formats)" if other else ""
        raise ImportFormatError(f"not a {importer.name} entry: {problem}{mixed}", path=source.path, line=source.line,
                                episode=label)
    try:
        return importer.read_entry(item, source, None if tools is None else list(tools), document)
    except ImportFormatError as exc:
        raise _Malformed(exc) from None


def _check_unique(ids: Sequence[str], lines, path: str) -> None:
    first: dict[str, int] = {}
    for i, entry in enumerate(ids):
        if entry and entry in first:
            raise ImportFormatError(f"entry id {entry!r} repeats (entries #{first[entry]} and #{i})", path=path,
                                    line=lines[i] if lines else None)
        first.setdefault(entry, i)


_RANGE = re.compile(r"^(\d*):(\d*)$")


def select_episodes(episodes: Sequence[ImportedEpisode], select: str) -> list[ImportedEpisode]:
    """The episodes named by `select` (see `select_indexes`), in file order, each once."""
    return [episodes[i] for i in select_indexes([e.entry_id for e in episodes], select)]


def select_indexes(ids: Sequence[str], select: str) -> list[int]:
    """Indexes named by `select`: comma-separated items, each an entry id, an index `N`, or an index range
    `A:B` (half-open, either end may be left out). An id wins over an index of the same spelling. Sorted,
    each once; an item naming nothing is a `ConfigError`."""
    by_id = {entry: i for i, entry in enumerate(ids) if entry}
    chosen: set[int] = set()
    for item in (s.strip() for s in select.split(",")):
        if not item:
            raise ConfigError(f"--select {select!r}: empty item")
        if item in by_id:
            chosen.add(by_id[item])
        elif item.isdigit():
            if int(item) >= len(ids):
                raise ConfigError(f"--select {item}: index out of range (the file has {len(ids)} episodes)")
            chosen.add(int(item))
        elif _RANGE.match(item):
            a, b = _RANGE.match(item).groups()  # type: ignore[union-attr]
            picked = range(len(ids))[slice(int(a) if a else None, int(b) if b else None)]
            if not picked:
                raise ConfigError(f"--select {item}: empty range (the file has {len(ids)} episodes)")
            chosen.update(picked)
        else:
            sample = ", ".join(list(by_id)[:3]) or "(the episodes have no ids)"
            raise ConfigError(f"--select {item!r}: no episode has this id, and it is not an index or A:B range "
                              f"(ids look like: {sample})")
    return sorted(chosen)
