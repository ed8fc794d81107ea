"""Agent Data Protocol raw samples: a list of episodes `{messages, ...}` with an `id`, `instance_id`,
`traj_id` or `resolved`, in three variants told apart per episode.

- function calling (OpenHands via SWE-Gym): OpenAI messages whose absent keys are padded with null
  (`function_call`, `name`, `tool_call_id`, `tool_calls`, a tool call's `index`); nulls are dropped, parallel
  calls kept as they are, the episode's `tools` used unless `tools` is given.
- text calls (SWE-smith): calls written in the assistant text (grammar: `ctxkit.log.importers.text_calls`),
  results as the next user turn (`OBSERVATION:` prefix removed and kept in the tool message's `extra`
  as `source_prefix`). A turn whose text the canonical writer does not reproduce keeps it as
  `extra["source_text"]`, so `to_source_messages` gives the file's messages back exactly.
- legacy function calling (Toucan): an assistant `function_call` and a `function` result become one tool
  call (`call_<turn>`) and its tool message (`common.legacy_function_calls`).

`resolved` becomes a `scored` `EpisodeEnd` with reward 1.0 or 0.0; no flag is `unscored`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

from ctxkit.errors import ImportFormatError
from ctxkit.log.importers.common import (ImportedEpisode, Importer, SourceInfo, drop_nulls, ending, episode_events,
                                         episode_label, legacy_function_calls, require)
from ctxkit.log.importers.text_calls import CALL_OPEN, TextCallError, format_text_call, parse_text_call, split_observation

_ID_KEYS = ("id", "instance_id", "traj_id")
_SOURCE_KEYS = ("source_text", "source_prefix")


def entry_problem(item: Any) -> str | None:
    """What keeps `item` from being an ADP raw episode (`{messages, id|instance_id|traj_id|resolved, ...}`), or None."""
    if not isinstance(item, Mapping):
        return f"an ADP episode is an object, not {type(item).__name__}"
    if not isinstance(item.get("messages"), list):
        return "field 'messages' is missing or not a list"
    if not any(k in item for k in (*_ID_KEYS, "resolved")):
        return f"none of the fields {[*_ID_KEYS, 'resolved']}"
    return None


def matches(obj: Any) -> bool:
    """A non-empty list whose first item has a `messages` list and an `id`, `instance_id`, `traj_id` or `resolved`."""
    return isinstance(obj, list) and bool(obj) and entry_problem(obj[0]) is None


def _text_calls(messages: Sequence[Mapping[str, Any]], source: SourceInfo) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: tuple[str, str] | None = None
    for turn, msg in enumerate(messages):
        require(isinstance(msg, Mapping) and isinstance(msg.get("content"), str),
                "a text-call turn needs string content", source, turn=turn)
        role, content = msg.get("role"), msg["content"]
        extra = {k: v for k, v in msg.items() if k not in ("role", "content")}
        if role == "assistant":
            require(pending is None, f"call {pending[1] if pending else ''!r} of the turn before has no result "
                                     "(the next turn is not a user turn)", source, turn=turn)
            try:
                parsed = parse_text_call(content)
            except TextCallError as exc:
                raise ImportFormatError(str(exc), path=source.path, episode=episode_label(source), turn=turn,
                                        line=source.line) from None
            item: dict[str, Any] = {"role": "assistant", "content": parsed.thought, **extra}
            if parsed.name is not None:
                pending = (f"call_{turn}", parsed.name)
                item["tool_calls"] = [{"id": pending[0], "type": "function",
                                       "function": {"name": parsed.name, "arguments": parsed.arguments_json()}}]
            if format_text_call(parsed.thought, parsed.name, parsed.arguments) != content:
                item["source_text"] = content
            out.append(item)
        elif role == "user" and pending is not None:
            prefix, output = split_observation(content)
            item = {"role": "tool", "tool_call_id": pending[0], "name": pending[1], "content": output, **extra}
            if prefix:
                item["source_prefix"] = prefix
            out.append(item)
            pending = None
        else:
            out.append(dict(msg))
    return out


def to_source_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The text-call form of exported messages (`export_messages` of a SWE-smith import): each call written
    back into its assistant text, each tool message back to a user turn with its prefix; other messages
    unchanged. Lossless for episodes imported by this module."""
    out = []
    for msg in messages:
        msg = dict(msg)
        if msg.get("role") == "assistant" and "source_text" in msg:
            out.append({"role": "assistant", "content": msg.pop("source_text"),
                        **{k: v for k, v in msg.items() if k not in ("role", "content", "tool_calls")}})
        elif msg.get("role") == "assistant" and msg.get("tool_calls"):
            call = msg["tool_calls"][0]["function"]
            args = call["arguments"] if isinstance(call["arguments"], Mapping) else json.loads(call["arguments"])
            text = format_text_call(msg.get("content") or "", call["name"], args)
            out.append({"role": "assistant", "content": text,
                        **{k: v for k, v in msg.items() if k not in ("role", "content", "tool_calls")}})
        elif msg.get("role") == "tool":
            prefix = msg.pop("source_prefix", "")
            out.append({"role": "user", "content": prefix + (msg.get("content") or ""),
                        **{k: v for k, v in msg.items() if k not in ("role", "content", "tool_call_id", "name")}})
        else:
            out.append(msg)
    return out


def _entry_id(item: Mapping[str, Any], index: int) -> str:
    return next((str(item[k]) for k in _ID_KEYS if isinstance(item.get(k), (str, int)) and str(item[k])), "")


def _variant(messages: Sequence[Any]) -> str:
    dicts = [m for m in messages if isinstance(m, Mapping)]
    if any(m.get("tool_calls") for m in dicts):
        return "function-calling"
    if any(m.get("function_call") is not None or m.get("role") == "function" for m in dicts):
        return "legacy-function-call"
    if any(m.get("role") == "assistant" and isinstance(m.get("content"), str) and CALL_OPEN in m["content"]
           for m in dicts):
        return "text-calls"
    return "plain"


def read_entry(item: Mapping[str, Any], source: SourceInfo, tools: Sequence[Any] | None = None,
               document: Any = None) -> ImportedEpisode:
    """One sample as an episode, its variant chosen by its messages."""
    messages = [drop_nulls(m) if isinstance(m, Mapping) else m for m in item["messages"]]
    variant = _variant(messages)
    source = dataclasses.replace(source, variant=variant)
    if variant == "text-calls":
        messages = _text_calls(messages, source)
    elif variant == "legacy-function-call":
        messages = legacy_function_calls(messages, source)
    own_tools = drop_nulls(item.get("tools")) if isinstance(item.get("tools"), list) else []
    resolved = item.get("resolved")
    require(resolved is None or isinstance(resolved, bool), f"field 'resolved': {resolved!r} is not true/false", source)
    end = ending(reward=float(resolved), scores={"resolved": resolved}) if resolved is not None else ending()
    metadata = {k: v for k, v in item.items() if k not in ("messages", "tools", "resolved")}
    task = {"name": "adp", "instance_id": item.get("instance_id")}
    return episode_events(messages, source=source, tools=own_tools if tools is None else tools, task=task,
                          metadata=metadata, end=end)


IMPORTER = Importer(name="adp", description="Agent Data Protocol raw samples: a list of {messages, id|instance_id|"
                                            "traj_id|resolved, ...} (function calling, legacy function_call, or "
                                            "<function=...> text calls)",
                    matches=matches, entries=lambda doc: doc, entry_problem=entry_problem,
                    entry_id=lambda item, index: _entry_id(item, index) if isinstance(item, Mapping) else "",
                    read_entry=read_entry)
"""The `adp` entry of `IMPORTERS`."""
