"""ShareGPT-style SFT files (ADP's SFT output and the like): a list of `{id?, system?, conversations: [{from,
value}]}`, one episode each.

| `from` | becomes |
|---|---|
| top-level `system`, `system` turns | system message |
| `human`, `user` | user message |
| `gpt`, `assistant`, `function_call` | assistant message; a `<function=...>` call in the text (grammar: `text_calls`) or a JSON `{"name", "arguments"}` value becomes one tool call, id `call_<turn>`; text the canonical writer does not reproduce is kept as `extra["source_text"]` |
| `observation`, `function_response`, `tool` | the tool message answering the pending call; an `EXECUTION RESULT of [name]:\n` or `OBSERVATION:` prefix is removed and kept as `extra["source_prefix"]` |

Other keys of a turn stay in the message's `extra`; other top-level keys in `metadata["source"]`. SFT files
record no end or score: `truncated`, `source_ended`, `unscored`. No tool schemas: pass them with `--tools`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from ctxkit.errors import ImportFormatError
from ctxkit.log.importers.common import (ImportedEpisode, Importer, SourceInfo, ending, episode_events, episode_label,
                                         id_field, require)
from ctxkit.log.importers.text_calls import TextCallError, format_text_call, parse_text_call, split_observation

ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "function_call": "assistant", "observation": "tool", "function_response": "tool", "tool": "tool"}
"""ShareGPT `from` -> chat role."""
_RESULT_PREFIX = re.compile(r"EXECUTION RESULT of \[[^\]\n]*\]:\n")


def _is_turn(turn: Any) -> bool:
    return isinstance(turn, Mapping) and "from" in turn and "value" in turn


def entry_problem(item: Any) -> str | None:
    """What keeps `item` from being a ShareGPT conversation, or None."""
    if not isinstance(item, Mapping):
        return f"a ShareGPT entry is an object, not {type(item).__name__}"
    turns = item.get("conversations")
    if not isinstance(turns, list) or not turns:
        return "field 'conversations' is missing, empty or not a list"
    bad = next((i for i, t in enumerate(turns) if not _is_turn(t)), None)
    return None if bad is None else f"conversations[{bad}] is not a {{from, value}} turn"


def matches(obj: Any) -> bool:
    """A non-empty list whose first item has a `conversations` list of `{from, value}` turns."""
    return isinstance(obj, list) and bool(obj) and entry_problem(obj[0]) is None


def _call_of(text: str, source: SourceInfo, turn: int) -> tuple[str, str | None, Any, bool]:
    """(thought, call name or None, arguments, canonical) of an assistant turn's text."""
    stripped = text.strip()
    if stripped.startswith("{") and '"name"' in stripped:
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, Mapping) and isinstance(obj.get("name"), str):
            args = obj.get("arguments", {})
            return "", obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False), False
    try:
        parsed = parse_text_call(text)
    except TextCallError as exc:
        raise ImportFormatError(str(exc), path=source.path, episode=episode_label(source), turn=turn,
                                line=source.line) from None
    canonical = format_text_call(parsed.thought, parsed.name, parsed.arguments) == text
    return parsed.thought, parsed.name, parsed.arguments_json() if parsed.name else None, canonical


def _messages(item: Mapping[str, Any], source: SourceInfo) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(item.get("system"), str) and item["system"]:
        out.append({"role": "system", "content": item["system"]})
    pending: tuple[str, str] | None = None
    for turn, t in enumerate(item["conversations"]):
        role = ROLES.get(t["from"])
        require(role is not None, f"field 'from': {t['from']!r} is not one of {sorted(ROLES)}", source, turn=turn)
        require(isinstance(t["value"], str), "field 'value' is not a string", source, turn=turn)
        extra = {k: v for k, v in t.items() if k not in ("from", "value")}
        if role == "tool":
            require(pending is not None, f"a {t['from']!r} turn answers no call", source, turn=turn)
            match = _RESULT_PREFIX.match(t["value"])
            prefix, output = (match.group(0), t["value"][match.end():]) if match else split_observation(t["value"])
            out.append({"role": "tool", "tool_call_id": pending[0], "name": pending[1], "content": output, **extra,  # type: ignore[index]
                        **({"source_prefix": prefix} if prefix else {})})
            pending = None
            continue
        require(pending is None, f"call {pending[1] if pending else ''!r} of the turn before has no result", source,
                turn=turn)
        if role != "assistant":
            out.append({"role": role, "content": t["value"], **extra})
            continue
        thought, name, arguments, canonical = _call_of(t["value"], source, turn)
        msg: dict[str, Any] = {"role": "assistant", "content": thought, **extra}
        if name is not None:
            pending = (f"call_{turn}", name)
            msg["tool_calls"] = [{"id": pending[0], "type": "function", "function": {"name": name, "arguments": arguments}}]
        if not canonical and name is not None:
            msg["source_text"] = t["value"]
        out.append(msg)
    return out


def read_entry(item: Mapping[str, Any], source: SourceInfo, tools: Sequence[Any] | None = None,
               document: Any = None) -> ImportedEpisode:
    """One conversation as an episode."""
    messages = _messages(item, source)
    metadata = {k: v for k, v in item.items() if k not in ("conversations", "system")}
    return episode_events(messages, source=source, tools=tools or (), task={"name": "sharegpt"}, metadata=metadata,
                          end=ending())


IMPORTER = Importer(name="sharegpt", description="ShareGPT-style SFT: a list of {id?, system?, conversations: "
                                                 "[{from, value}]}",
                    matches=matches, entries=lambda doc: doc, entry_problem=entry_problem,
                    entry_id=id_field("id"),
                    read_entry=read_entry)
"""The `sharegpt` entry of `IMPORTERS`."""
