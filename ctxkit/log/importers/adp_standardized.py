"""Agent Data Protocol *standardized* files (`sample_std.json`): a list of `{schema_version?, id, content:
[action | observation], details}`, one episode each; every item is tagged by `class_`.

| item | becomes |
|---|---|
| `text_observation`, `source: "user"` | user message |
| `text_observation`, `source: "environment"` answering a call (`tool_call_id`, else the oldest unanswered call) | tool message |
| `text_observation`, `source: "environment"` with no call to answer | user message (the environment speaking, e.g. a task) |
| `text_observation`, `source: "agent"` | assistant message |
| `api_action` (`function`, `kwargs`, `description`) | assistant message: content = `description`, one call `function(kwargs)` (arguments an object) |
| `code_action` (`language`, `content`, `description`) | assistant message: content = `description`, one call named by the language, `{"code": content}` |
| `message_action` (`content`, `description`) | assistant message with `content`; `description` kept in `extra` |

Call ids: the item's `tool_call_id`, else `call_<index>`. `reasoning_content` becomes the message's; `reward`,
`name` and other fields stay in `extra`. Other classes (`web_observation`, images) are an `ImportFormatError`
naming the item. The file records no end or score: `truncated`, `source_ended`, `unscored`; `details` and
`schema_version` go to `metadata["source"]`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ctxkit.log.importers.common import (ImportedEpisode, Importer, SourceInfo, drop_nulls, ending, episode_events,
                                         id_field, require)

CLASSES = ("text_observation", "api_action", "code_action", "message_action")
"""The item classes this importer reads."""
_OWN = ("class_", "content", "description", "tool_call_id", "reasoning_content", "source", "function", "kwargs",
        "language")


def entry_problem(item: Any) -> str | None:
    """What keeps `item` from being an ADP standardized trajectory, or None."""
    if not isinstance(item, Mapping):
        return f"an ADP standardized trajectory is an object, not {type(item).__name__}"
    content = item.get("content")
    if not isinstance(content, list) or not content:
        return "field 'content' is missing, empty or not a list"
    bad = next((i for i, x in enumerate(content) if not (isinstance(x, Mapping) and "class_" in x)), None)
    return None if bad is None else f"content[{bad}] has no 'class_'"


def matches(obj: Any) -> bool:
    """A non-empty list whose first item has a `content` list of `class_`-tagged items."""
    return isinstance(obj, list) and bool(obj) and entry_problem(obj[0]) is None


def _assistant(item: Mapping[str, Any], content: Any, extra: Mapping[str, Any]) -> dict[str, Any]:
    msg = {"role": "assistant", "content": content, **extra}
    if item.get("reasoning_content"):
        msg["reasoning_content"] = item["reasoning_content"]
    return msg


def _messages(items: Sequence[Mapping[str, Any]], source: SourceInfo) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []
    for turn, raw in enumerate(items):
        item = drop_nulls(dict(raw))
        kind = item.get("class_")
        require(kind in CLASSES, f"class_ {kind!r} is not one of {list(CLASSES)}", source, turn=turn)
        extra = {k: v for k, v in item.items() if k not in _OWN}
        if kind in ("api_action", "code_action"):
            call_id = str(item.get("tool_call_id") or f"call_{turn}")
            if kind == "api_action":
                require(isinstance(item.get("function"), str), "an api_action needs a string 'function'", source, turn=turn)
                name, args = item["function"], item.get("kwargs") or {}
            else:
                require(isinstance(item.get("language"), str) and isinstance(item.get("content"), str),
                        "a code_action needs string 'language' and 'content'", source, turn=turn)
                name, args = item["language"], {"code": item["content"]}
            msg = _assistant(item, item.get("description", ""), extra)
            msg["tool_calls"] = [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]
            out.append(msg)
            pending.append((call_id, name))
        elif kind == "message_action":
            described = {"description": item["description"]} if "description" in item else {}
            out.append(_assistant(item, item.get("content", ""), {**extra, **described}))
        elif item.get("source") == "agent":
            out.append(_assistant(item, item.get("content", ""), extra))
        elif item.get("source") == "environment" and pending:
            wanted = item.get("tool_call_id")
            match = next((i for i, (cid, _) in enumerate(pending) if cid == wanted), 0 if wanted is None else None)
            require(match is not None, f"an observation answers tool_call_id {wanted!r}, which no unanswered "
                                       "action called", source, turn=turn)
            call_id, name = pending.pop(match)  # type: ignore[arg-type]
            if "name" in extra:  # the observation's participant name; the tool message's name is the call's
                extra["observation_name"] = extra.pop("name")
            out.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": item.get("content", ""),
                        **extra})
        else:
            out.append({"role": "user", "content": item.get("content", ""), **extra,
                        **({"source": item["source"]} if item.get("source") not in (None, "user") else {})})
    return out


def read_entry(item: Mapping[str, Any], source: SourceInfo, tools: Sequence[Any] | None = None,
               document: Any = None) -> ImportedEpisode:
    """One trajectory as an episode."""
    messages = _messages(item["content"], source)
    metadata = {k: v for k, v in item.items() if k != "content"}
    return episode_events(messages, source=source, tools=tools or (), task={"name": "adp"}, metadata=metadata,
                          end=ending())


IMPORTER = Importer(name="adp-std", description="Agent Data Protocol standardized: a list of {id, content: "
                                                "[{class_: text_observation|api_action|code_action|message_action}]}",
                    matches=matches, entries=lambda doc: doc, entry_problem=entry_problem,
                    entry_id=id_field("id"),
                    read_entry=read_entry)
"""The `adp-std` entry of `IMPORTERS`."""
