"""SWE-agent `.traj` files: one episode, read from `history` (what the model was shown), in either of the
two styles SWE-agent writes.

- function calling: `history` messages carry OpenAI `tool_calls`; tool messages name their call in a
  one-item `tool_call_ids` list (becomes `tool_call_id`); SWE-agent's own keys (`agent`, `message_type`,
  `thought`, `action`) stay on the message (`Message.extra`).
- thought/action/observation (older): assistant turns are `thought` + a fenced `action`; each becomes
  the thought plus one call of a `bash` tool `{"command": action}` (SWE-agent ran every action, its special
  commands included, in its shell), and the next user turn becomes that call's tool message.

`info.exit_status` gives the end: `submitted` is `terminated`, any other status `truncated` with that
cause; SWE-agent records no reward (`unscored`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from ctxkit.log.importers.common import ImportedEpisode, Importer, SourceInfo, ending, episode_events, require, utf8_path

BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Run one SWE-agent command line (a shell command or one of the agent's special commands).",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
"""The one tool the thought/action style is given (its actions are command lines)."""


def matches(obj: Any) -> bool:
    """A dict with a `history` list and a `trajectory` list."""
    return isinstance(obj, Mapping) and isinstance(obj.get("history"), list) and isinstance(obj.get("trajectory"), list)


def action_text(thought: str, action: str) -> str:
    """The text a thought/action turn is written as: the thought, then the action fenced by ```."""
    return f"{thought}```\n{action}```"


def _function_calling(history: Sequence[Mapping[str, Any]], source: SourceInfo) -> list[dict[str, Any]]:
    out = []
    for turn, msg in enumerate(history):
        require(isinstance(msg, Mapping), "a history entry is not an object", source, turn=turn)
        msg = dict(msg)
        if "tool_call_ids" in msg:
            ids = msg.pop("tool_call_ids")
            require(isinstance(ids, list) and len(ids) == 1 and "tool_call_id" not in msg,
                    f"a tool message answers one call; tool_call_ids is {ids!r}", source, turn=turn)
            msg["tool_call_id"] = ids[0]
        out.append(msg)
    return out


def _thought_action(history: Sequence[Mapping[str, Any]], source: SourceInfo) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: str | None = None
    for turn, msg in enumerate(history):
        require(isinstance(msg, Mapping) and isinstance(msg.get("content"), str),
                "a history entry needs string content", source, turn=turn)
        extra = {k: v for k, v in msg.items() if k not in ("role", "content", "thought", "action")}
        if msg.get("role") == "assistant":
            require(pending is None, "two assistant turns in a row: the first one's action has no observation",
                    source, turn=turn)
            thought, action = msg.get("thought"), msg.get("action")
            require(isinstance(thought, str) and isinstance(action, str),
                    "an assistant turn of this style needs string 'thought' and 'action'", source, turn=turn)
            pending = f"call_{turn}"
            if action_text(thought, action) != msg["content"]:
                extra["source_text"] = msg["content"]
            out.append({"role": "assistant", "content": thought, **extra, "tool_calls": [
                {"id": pending, "type": "function",
                 "function": {"name": "bash", "arguments": json.dumps({"command": action}, ensure_ascii=False)}}]})
        elif msg.get("role") == "user" and pending is not None:
            out.append({"role": "tool", "tool_call_id": pending, "name": "bash", "content": msg["content"], **extra})
            pending = None
        else:
            out.append(dict(msg))
    return out


def problem_id(obj: Any, index: int = 0) -> str:
    """`replay_config.problem_statement.id`, or `""` (the entry id is then the file name's stem)."""
    config = obj.get("replay_config") if isinstance(obj, Mapping) else None
    problem = (config.get("problem_statement") or {}) if isinstance(config, Mapping) else {}
    return problem["id"] if isinstance(problem, Mapping) and isinstance(problem.get("id"), str) else ""


def read_entry(obj: Mapping[str, Any], source: SourceInfo, tools: Sequence[Any] | None = None,
               document: Any = None) -> ImportedEpisode:
    """The file's one episode."""
    entry = problem_id(obj) or utf8_path(Path(source.path).stem)
    history = obj["history"]
    calling = any(isinstance(m, Mapping) and (m.get("tool_calls") or m.get("tool_call_ids")) for m in history)
    source = dataclasses.replace(source, entry_id=entry, variant="function-calling" if calling else "thought-action")
    messages = _function_calling(history, source) if calling else _thought_action(history, source)
    info = obj.get("info") if isinstance(obj.get("info"), Mapping) else {}
    status = info.get("exit_status")
    end = ending(cause=status, truncated=status != "submitted") if isinstance(status, str) and status else ending()
    if tools is None:
        tools = [] if calling else [BASH_TOOL]
    metadata = {"environment": obj.get("environment"), "info": dict(info)}
    return episode_events(messages, source=source, tools=tools, task={"name": "swe-agent", "instance_id": entry},
                          metadata=metadata, end=end)


IMPORTER = Importer(name="swe-agent", description="SWE-agent .traj: {history, trajectory, info} (function calling "
                                                  "or thought/action/observation)",
                    matches=matches, entries=lambda doc: [doc],
                    entry_problem=lambda doc: None if matches(doc) else "a SWE-agent .traj is an object with "
                                                                         "'history' and 'trajectory' lists",
                    entry_id=problem_id, read_entry=read_entry)
"""The `swe-agent` entry of `IMPORTERS`."""
