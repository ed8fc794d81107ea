"""Agent Data Protocol raw samples: a list of episodes `{messages, ...}` with `resolved`, in two variants
told apart per episode.

- function calling (OpenHands via SWE-Gym): OpenAI messages whose absent keys are padded with null
  (`function_call`, `name`, `tool_call_id`, `tool_calls`, a tool call's `index`); nulls are dropped, parallel
  calls kept as they are, the episode's `tools` used unless `tools` is given.
- text calls (SWE-smith): calls written in the assistant text (grammar: `ctxkit.log.importers.text_calls`),
  results as the next user turn (`OBSERVATION:` prefix removed and kept in the tool message's `extra`
  as `source_prefix`). A turn whose text the canonical writer does not reproduce keeps it as
  `extra["source_text"]`, so `to_source_messages` gives the file's messages back exactly.

`resolved` becomes a `scored` `EpisodeEnd` with reward 1.0 or 0.0; no flag is `unscored`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence
import json

from ctxkit.errors import ImportFormatError
from ctxkit.log.importers.common import (ImportedEpisode, Importer, SourceInfo, drop_nulls, ending, episode_events,
                                     episode_label, require)
from ctxkit.log.importers.text_calls import CALL_OPEN, TextCallError, format_text_call, parse_text_call, split_observation

_ID_KEYS = ("id", "instance_id", "traj_id")
_SOURCE_KEYS = ("source_text", "source_prefix")


def matches(obj: Any) -> bool:
    """A non-empty list whose first item has a `messages` list and an `instance_id`, `traj_id` or `resolved`."""
    return isinstance(obj, list) and bool(obj) and isinstance(obj[0], Mapping) \
        and isinstance(obj[0].get("messages"), list) and any(k in obj[0] for k in ("instance_id", "traj_id", "resolved"))


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
                raise ImportFormatError(str(exc), path=source.path, episode=episode_label(source), turn=turn) from None
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


def read(obj: Any, path: str, tools: Sequence[Any] | None = None) -> list[ImportedEpisode]:
    """One `ImportedEpisode` per sample, in file order."""
    require(isinstance(obj, list), "an ADP raw sample file is a list of episodes", path=path)
    out, seen = [], set()
    for index, item in enumerate(obj):
        require(isinstance(item, Mapping) and isinstance(item.get("messages"), list),
                f"entry #{index}: an ADP episode needs a 'messages' list", path=path)
        entry = _entry_id(item, index)
        source = SourceInfo(path=path, format="adp", entry_id=entry, index=index)
        require(not entry or entry not in seen, f"entry id {entry!r} repeats", source)
        seen.add(entry)
        messages = [drop_nulls(m) if isinstance(m, Mapping) else m for m in item["messages"]]
        calling = any(isinstance(m, Mapping) and m.get("tool_calls") for m in messages)
        texty = not calling and any(isinstance(m, Mapping) and m.get("role") == "assistant"
                                    and isinstance(m.get("content"), str) and CALL_OPEN in m["content"] for m in messages)
        variant = "function-calling" if calling else "text-calls" if texty else "plain"
        source = SourceInfo(path=path, format="adp", entry_id=entry, index=index, variant=variant)
        if texty:
            messages = _text_calls(messages, source)
        own_tools = drop_nulls(item.get("tools")) if isinstance(item.get("tools"), list) else []
        resolved = item.get("resolved")
        require(resolved is None or isinstance(resolved, bool), f"resolved {resolved!r} is not true/false", source)
        end = ending(reward=float(resolved), scores={"resolved": resolved}) if resolved is not None else ending()
        metadata = {k: v for k, v in item.items() if k not in ("messages", "tools", "resolved")}
        task = {"name": "adp", "instance_id": item.get("instance_id")}
        out.append(episode_events(messages, source=source, tools=own_tools if tools is None else tools, task=task,
                                  metadata=metadata, end=end))
    return out


IMPORTER = Importer(name="adp", description="Agent Data Protocol raw samples: a list of {messages, resolved, "
                                            "instance_id|traj_id, ...} (function calling or <function=...> text calls)",
                    matches=matches, read=read)
"""The `adp` entry of `IMPORTERS`."""
