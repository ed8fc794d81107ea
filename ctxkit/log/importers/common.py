"""Shared parts of the trajectory importers: the `ImportedEpisode` record, the `Importer` spec, and the one
path from OpenAI-shaped messages to ctxkit events.

Every importer reduces its source episode to OpenAI-shaped message dicts, then calls `episode_events`,
which runs them through `conversation.import_conversation` (the one content rule and pairing check), turns
the tool messages the source marks as failed into `ToolResult(status="error")`, and sets the `EpisodeStart`
provenance and the `EpisodeEnd` outcome.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ctxkit.log.conversation import import_conversation
from ctxkit.errors import ImportFormatError, MessageFormatError
from ctxkit.events import EpisodeEnd, Event, Message, ToolResult


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
    line: int | None = None
    """1-based line of the episode in a JSONL file; None in a JSON file."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able record kept in `EpisodeStart.metadata["import"]`: `path` as UTF-8 text, the bytes of a
        file name that is not UTF-8 (surrogate-escaped) written as `\\xNN`, so the log's header always writes;
        `line` only for a JSONL file."""
        out = {**dataclasses.asdict(self), "path": utf8_path(self.path)}
        if self.line is None:
            del out["line"]
        return out


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
    """One source format (an entry of `IMPORTERS`): how to recognise a file, list its episodes, name and read each.

    A file is read episode by episode, so one malformed episode can be skipped (or named, with `strict`)
    without losing the rest, and `--select` picks episodes before any is read."""

    name: str
    """Format name, as given to `--format`."""
    description: str
    """One line: what the format is."""
    matches: Callable[[Any], bool]
    """True when a parsed document (a JSONL file: the list of its rows) has this format's shape (`--format auto`)."""
    entries: Callable[[Any], Sequence[Any]]
    """The document's episodes as raw source items, in file order (a one-episode file: `[document]`)."""
    entry_problem: Callable[[Any], str | None]
    """What is wrong with one raw item's shape (`"no 'messages' list"`), or None when it is this format's episode."""
    entry_id: Callable[[Any, int], str]
    """`entry_id(item, index)`: the episode's id in the source (`""` when it has none); cheap, never raises."""
    read_entry: Callable[..., "ImportedEpisode"]
    """`read_entry(item, source, tools, document) -> ImportedEpisode`: one episode (`tools`, from `--tools`,
    replace the source's own when not None); a malformed episode raises `ImportFormatError`."""


@dataclass(frozen=True)
class SkippedEntry:
    """A source episode left out of an import because it is malformed (reported, never silent)."""

    index: int
    """0-based position of the episode in the file."""
    entry_id: str
    """Its id in the source, or `""`."""
    reason: str
    """The `ImportFormatError` text: file (and line), episode, turn, and what is wrong."""


@dataclass(frozen=True)
class ImportResult:
    """What a trajectory file gave: the episodes read, and the ones skipped with why."""

    episodes: tuple[ImportedEpisode, ...]
    """The episodes read, in file order."""
    skipped: tuple[SkippedEntry, ...] = ()
    """Malformed episodes left out (empty under `strict`, which raises instead)."""


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
                   end: Ending | None = None, statuses: Mapping[int, str] | None = None) -> ImportedEpisode:
    """An `ImportedEpisode` from OpenAI-shaped `messages`: `EpisodeStart` (tools, task, provenance in
    `metadata["import"]`, source fields in `metadata["source"]`), one `Message` per message, and an
    `EpisodeEnd` when `end` is given. `statuses` maps the index of a tool message the source marks as failed
    to `error` or `timeout`: that message becomes a `ToolResult` with that status (its other source keys,
    which a `ToolResult` has no field for, go to `metadata["source"]["tool_result_extra"][str(index)]`).
    A message the conversation rules refuse is an `ImportFormatError` naming the file, the episode and the turn."""
    try:
        events = import_conversation({"messages": list(messages), "tools": list(tools)}, episode_id=source.entry_id)
    except MessageFormatError as exc:
        text = str(exc)
        turn = None
        if text.startswith("messages["):
            head, _, rest = text.partition("]")
            if head[9:].isdigit():
                turn, text = int(head[9:]), rest.lstrip(": ")
        raise ImportFormatError(text, path=source.path, episode=episode_label(source), turn=turn, line=source.line) from None
    meta: dict[str, Any] = {"import": source.to_dict()}
    if metadata:
        meta["source"] = dict(metadata)
    kept = _tool_results(events, statuses or {}, source)
    if kept:
        meta.setdefault("source", {})["tool_result_extra"] = kept
    events[0] = dataclasses.replace(events[0], task=dict(task or {}), metadata=meta)
    if end is not None:
        events.append(EpisodeEnd(outcome=end.outcome, cause=end.cause, reward=end.reward,  # type: ignore[arg-type]
                                 reward_kind=end.reward_kind, scores=dict(end.scores)))  # type: ignore[arg-type]
    return ImportedEpisode(entry_id=source.entry_id, events=tuple(events), source=source)


def _tool_results(events: list[Event], statuses: Mapping[int, str], source: SourceInfo) -> dict[str, Any]:
    """Replace the tool messages named in `statuses` (message index -> status) by `ToolResult`s in place;
    their `extra` keys by message index (the `ToolResult` record has no field for them)."""
    first = next(i for i, e in enumerate(events) if isinstance(e, Message)) if statuses else 0
    kept: dict[str, Any] = {}
    for index, status in sorted(statuses.items()):
        msg = events[first + index]
        require(isinstance(msg, Message) and msg.role == "tool", f"message {index} is marked {status!r} but is "
                "not a tool message", source, turn=index)
        events[first + index] = ToolResult(tool_call_id=msg.tool_call_id or "", name=msg.name, content=msg.content,
                                           status=status)  # type: ignore[arg-type]
        if msg.extra:
            kept[str(index)] = dict(msg.extra)
    return kept


def episode_label(source: SourceInfo) -> str:
    """How errors name an episode: `<entry id> (#<index>)`, or `#<index>` when it has no id."""
    return f"{source.entry_id} (#{source.index})" if source.entry_id else f"#{source.index}"


def require(condition: bool, message: str, source: SourceInfo | None = None, *, path: str = "",
            turn: int | None = None) -> None:
    """`ImportFormatError(message)` naming the file (and the episode and turn when known) unless `condition`."""
    if not condition:
        raise ImportFormatError(message, path=source.path if source else path,
                                episode=episode_label(source) if source else None, turn=turn,
                                line=source.line if source else None)


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


def legacy_function_calls(messages: Sequence[Mapping[str, Any]], source: SourceInfo) -> list[dict[str, Any]]:
    """Legacy OpenAI function calling in today's shape: an assistant `function_call` `{name, arguments}`
    becomes one tool call with id `call_<turn>`; the next `function` message (role `function`, `name`)
    becomes the tool message answering it (`name` kept). An assistant text turn directly followed by an
    assistant call with empty content (one model response the source split in two) becomes one message, the
    text as its content, `extra["source_split"]` holding the call turn's own content; two assistant
    messages in a row are not a turn most templates can render token-exactly. A `function` message with no
    call before it, a name that differs from the call's, or a call followed by another turn is an
    `ImportFormatError`."""
    out: list[dict[str, Any]] = []
    pending: tuple[str, str] | None = None
    for turn, msg in enumerate(messages):
        split = _split_text(out, msg) if pending is None and isinstance(msg, Mapping) else None
        if split is not None:
            msg = {**out.pop(), **{k: v for k, v in msg.items() if k != "content"}, "source_split": split}
        require(isinstance(msg, Mapping), "a message is not an object", source, turn=turn)
        role, call = msg.get("role"), msg.get("function_call")
        if role == "function":
            require(pending is not None, "a 'function' result answers no function_call", source, turn=turn)
            call_id, name = pending or ("", "")
            require(msg.get("name") in (None, name), f"a 'function' result named {msg.get('name')!r} answers a "
                                                     f"call of {name!r}", source, turn=turn)
            out.append({**{k: v for k, v in msg.items() if k != "role"}, "role": "tool", "tool_call_id": call_id,
                        "name": name})
            pending = None
            continue
        require(pending is None, f"function_call {pending[1] if pending else ''!r} of the turn before has no "
                                 "'function' result", source, turn=turn)
        if role == "assistant" and call is not None:
            require(isinstance(call, Mapping) and isinstance(call.get("name"), str),
                    "field 'function_call' needs a string 'name'", source, turn=turn)
            pending = (f"call_{turn}", call["name"])
            item = {k: v for k, v in msg.items() if k != "function_call"}
            item["tool_calls"] = [{"id": pending[0], "type": "function",
                                   "function": {"name": call["name"], "arguments": call.get("arguments", "{}")}}]
            out.append(item)
        else:
            out.append(dict(msg))
    return out


def _split_text(out: Sequence[Mapping[str, Any]], msg: Mapping[str, Any]) -> Any:
    """The content of `msg` when it is a call-only assistant turn right after an assistant text turn with no
    call (the two halves of one response), else None."""
    prev = out[-1] if out else None
    if prev is None or prev.get("role") != "assistant" or prev.get("tool_calls") or prev.get("function_call"):
        return None
    if msg.get("role") != "assistant" or msg.get("function_call") is None or msg.get("content") not in ("", None):
        return None
    return {"content": msg.get("content")}


def id_field(key: str) -> Callable[[Any, int], str]:
    """An `Importer.entry_id` that reads an entry's `key` field (empty where the entry is not a mapping or lacks it)."""
    return lambda item, index: str(item.get(key) or "") if isinstance(item, Mapping) else ""
