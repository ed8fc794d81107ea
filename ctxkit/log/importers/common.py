"""Shared parts of the trajectory importers: the `ImportedEpisode` record, the `Importer` spec, and the one
path from OpenAI-shaped messages to ctxkit events.

Every importer reduces its source episode to OpenAI-shaped message dicts, then calls `episode_events`,
which runs them through `conversation.import_conversation` (the one content rule and pairing check) and
sets the `EpisodeStart` provenance and the `EpisodeEnd` outcome.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ctxkit.log.conversation import import_conversation
from ctxkit.errors import ImportFormatError, MessageFormatError
from ctxkit.events import EpisodeEnd, Event


@dataclass(frozen=True)
class SourceInfo:
    """Where an episode comes from: the file, the format, and the episode's place in the file."""

    path: str
    """The source file as given."""
    format: str
    """The importer's name (a key of `IMPORTERS`)."""
    entry_id: str
    """The episode's id in the source (e.g. `task-3-trial-1`), or `""` when the source names none."""
    index: int
    """0-based position of the episode in the file."""
    variant: str = ""
    """The format's variant, e.g. `function-calling` or `text-calls` (empty when the format has one)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able record kept in `EpisodeStart.metadata["import"]`: `path` as UTF-8 text, the bytes of a
        file name that is not UTF-8 (surrogate-escaped) written as `\\xNN`, so the log's header always writes."""
        return {**dataclasses.asdict(self), "path": utf8_path(self.path)}


def utf8_path(path: str) -> str:
    """`path` as valid UTF-8 text: `os.fsencode(path).decode("utf-8", "backslashreplace")` (`traj-\\xff.json`)."""
    try:
        return os.fsencode(path).decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that is no escaped byte
        return path.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True)
class ImportedEpisode:
    """One source episode turned into ctxkit events (unrecorded: no seq/id/ts yet)."""

    entry_id: str
    """The episode's id in the source (`""` when it has none)."""
    events: tuple[Event, ...]
    """`EpisodeStart`, the messages, and (for recorded trajectories) an `EpisodeEnd`."""
    source: SourceInfo
    """File, format, variant and position of the episode."""


@dataclass(frozen=True)
class Importer:
    """One source format: a shape test and a reader (entries of `IMPORTERS`)."""

    name: str
    """Format name, as given to `--format`."""
    description: str
    """One line: what the format is."""
    matches: Callable[[Any], bool]
    """True when a parsed JSON document has this format's shape (used by `--format auto`)."""
    read: Callable[..., list[ImportedEpisode]]
    """`read(obj, path, tools=None) -> list[ImportedEpisode]`, one per episode, in file order."""


@dataclass(frozen=True)
class Ending:
    """How a source episode ended, as the importer reads it (becomes the `EpisodeEnd`)."""

    outcome: str
    cause: str
    reward: float | None = None
    reward_kind: str = "unscored"
    scores: Mapping[str, Any] = field(default_factory=dict)


def ending(*, reward: float | None = None, cause: str | None = None, truncated: bool = False,
           scores: Mapping[str, Any] | None = None) -> Ending:
    """The honest end of a recorded episode: a source reward or resolved flag means the task was run to its
    end and scored (`terminated`, `scored`); no reward but a source-given cause keeps that cause; nothing at
    all is an episode that simply stops in the file (`truncated`, `source_ended`, `unscored`)."""
    if reward is not None:
        return Ending("truncated" if truncated else "terminated", cause or "scored_by_source", float(reward),
                      "scored", dict(scores or {}))
    if cause is not None:
        return Ending("truncated" if truncated else "terminated", cause, None, "unscored", dict(scores or {}))
    return Ending("truncated", "source_ended", None, "unscored", dict(scores or {}))


def drop_nulls(obj: Any) -> Any:
    """`obj` with every null-valued key removed, recursively (ADP pads absent keys with null)."""
    if isinstance(obj, Mapping):
        return {k: drop_nulls(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [drop_nulls(v) for v in obj]
    return obj


def episode_events(messages: Sequence[Mapping[str, Any]], *, source: SourceInfo, tools: Sequence[Any] = (),
                   task: Mapping[str, Any] | None = None, metadata: Mapping[str, Any] | None = None,
                   end: Ending | None = None) -> ImportedEpisode:
    """An `ImportedEpisode` from OpenAI-shaped `messages`: `EpisodeStart` (tools, task, provenance in
    `metadata["import"]`, source fields in `metadata["source"]`), one `Message` per message, and an
    `EpisodeEnd` when `end` is given. A message the conversation rules refuse is an `ImportFormatError`
    naming the file, the episode and the turn."""
    try:
        events = import_conversation({"messages": list(messages), "tools": list(tools)}, episode_id=source.entry_id)
    except MessageFormatError as exc:
        text = str(exc)
        turn = None
        if text.startswith("messages["):
            head, _, rest = text.partition("]")
            if head[9:].isdigit():
                turn, text = int(head[9:]), rest.lstrip(": ")
        raise ImportFormatError(text, path=source.path, episode=episode_label(source), turn=turn) from None
    meta: dict[str, Any] = {"import": source.to_dict()}
    if metadata:
        meta["source"] = dict(metadata)
    events[0] = dataclasses.replace(events[0], task=dict(task or {}), metadata=meta)
    if end is not None:
        events.append(EpisodeEnd(outcome=end.outcome, cause=end.cause, reward=end.reward,  # type: ignore[arg-type]
                                 reward_kind=end.reward_kind, scores=dict(end.scores)))  # type: ignore[arg-type]
    return ImportedEpisode(entry_id=source.entry_id, events=tuple(events), source=source)


def episode_label(source: SourceInfo) -> str:
    """How errors name an episode: `<entry id> (#<index>)`, or `#<index>` when it has no id."""
    return f"{source.entry_id} (#{source.index})" if source.entry_id else f"#{source.index}"


def require(condition: bool, message: str, source: SourceInfo | None = None, *, path: str = "",
            turn: int | None = None) -> None:
    """`ImportFormatError(message)` naming the file (and the episode and turn when known) unless `condition`."""
    if not condition:
        raise ImportFormatError(message, path=source.path if source else path,
                                episode=episode_label(source) if source else None, turn=turn)


def load_tools(obj: Any, path: str) -> list[dict[str, Any]]:
    """A tools file's content checked: a list of OpenAI tool schemas (`{"type": "function", "function":
    {"name", ...}}`) or bare function objects (`{"name", "parameters"}`, wrapped)."""
    if isinstance(obj, Mapping) and isinstance(obj.get("tools"), list):
        obj = obj["tools"]
    require(isinstance(obj, list), f"a tools file holds a list of tool schemas, not {type(obj).__name__}", path=path)
    out = []
    for i, tool in enumerate(obj):
        if isinstance(tool, Mapping) and "function" not in tool and isinstance(tool.get("name"), str):
            tool = {"type": "function", "function": dict(tool)}
        ok = isinstance(tool, Mapping) and isinstance(tool.get("function"), Mapping) \
            and isinstance(tool["function"].get("name"), str)
        require(ok, f"tools[{i}] is not a tool schema {{'type': 'function', 'function': {{'name', ...}}}}", path=path)
        out.append(dict(tool))
    return out
