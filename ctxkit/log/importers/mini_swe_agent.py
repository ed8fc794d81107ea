"""mini-swe-agent trajectories (`*.traj.json`: `{info, messages, trajectory_format: "mini-swe-agent-1..."}`):
one episode.

- v2 (tool calling): assistant turns carry OpenAI `tool_calls` (JSON-text arguments; the streaming `index` of
  a call is not kept) and `reasoning_content` when the model gave one; `extra` (actions, the raw API
  response, cost) stays on the message. Tool messages keep `extra` (`returncode`, `raw_output`,
  `exception_info`); a nonzero `returncode` or an `exception_info` makes the message a
  `ToolResult(status="error")` (`timeout` when the exception names a timeout), its `extra` kept in
  `metadata["source"]["tool_result_extra"]`.
- v1 (text actions): an assistant turn with exactly one fenced ```bash block becomes the text before the
  block plus one call `bash({"command": ...})`, id `call_<turn>`, the whole text kept as
  `extra["source_text"]`; the next user turn is that call's tool message.

The final `exit` message (`extra.exit_status`, `extra.submission`) is the episode's end, not a message:
`Submitted` is `terminated` (cause `submitted`), any other status `truncated` with that status as cause;
the message itself goes to `metadata["source"]["exit"]`. Without one, `info.exit_status` is read the same
way. mini-swe-agent scores nothing: `unscored`. The file holds no tool schemas: pass them with `--tools`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Sequence

from ctxkit.log.importers.common import (ImportedEpisode, Importer, SourceInfo, drop_nulls, ending, episode_events,
                                         require)

_BASH_BLOCK = re.compile(r"```bash\s*\n(.*?)\n?```", re.DOTALL)


def matches(obj: Any) -> bool:
    """A dict with a `messages` list and a `trajectory_format` starting `mini-swe-agent`."""
    return isinstance(obj, Mapping) and isinstance(obj.get("messages"), list) \
        and str(obj.get("trajectory_format", "")).startswith("mini-swe-agent")


def _status(extra: Mapping[str, Any]) -> str | None:
    """`error` / `timeout` for a failed call (nonzero return code, or an exception), else None."""
    info = extra.get("exception_info")
    if info:
        return "timeout" if "timeout" in str(info).lower() else "error"
    code = extra.get("returncode")
    return "error" if isinstance(code, int) and code != 0 else None


def _tool_calling(messages: Sequence[Mapping[str, Any]], source: SourceInfo) -> tuple[list[dict], dict[int, str]]:
    out: list[dict[str, Any]] = []
    statuses: dict[int, str] = {}
    for turn, msg in enumerate(messages):
        msg = drop_nulls(dict(msg))
        if msg.get("tool_calls"):
            require(isinstance(msg["tool_calls"], list), "field 'tool_calls' is not a list", source, turn=turn)
            msg["tool_calls"] = [{k: v for k, v in call.items() if k != "index"} if isinstance(call, Mapping) else call
                                 for call in msg["tool_calls"]]
            reasoning = _response_reasoning(msg.get("extra"))
            if "reasoning_content" not in msg and reasoning:
                msg["reasoning_content"] = reasoning
        if msg.get("role") == "tool":
            status = _status(msg.get("extra") if isinstance(msg.get("extra"), Mapping) else {})
            if status:
                statuses[len(out)] = status
        out.append(msg)
    return out, statuses


def _response_reasoning(extra: Any) -> str | None:
    """The raw API response's `reasoning_content` (some providers give it only there)."""
    try:
        value = extra["response"]["choices"][0]["message"].get("reasoning_content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def _text_actions(messages: Sequence[Mapping[str, Any]], source: SourceInfo) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: str | None = None
    for turn, msg in enumerate(messages):
        require(isinstance(msg.get("content"), str), "field 'content' is not a string", source, turn=turn)
        rest = {k: v for k, v in msg.items() if k not in ("role", "content")}
        if msg.get("role") == "assistant":
            require(pending is None, "two assistant turns in a row: the first one's action has no observation",
                    source, turn=turn)
            blocks = list(_BASH_BLOCK.finditer(msg["content"]))
            require(len(blocks) == 1, f"a text action needs exactly one ```bash block; this turn has {len(blocks)}",
                    source, turn=turn)
            pending = f"call_{turn}"
            out.append({"role": "assistant", "content": msg["content"][:blocks[0].start()], **rest,
                        "source_text": msg["content"], "tool_calls": [{"id": pending, "type": "function", "function": {
                            "name": "bash", "arguments": json.dumps({"command": blocks[0].group(1)}, ensure_ascii=False)}}]})
        elif msg.get("role") == "user" and pending is not None:
            out.append({"role": "tool", "tool_call_id": pending, "name": "bash", "content": msg["content"], **rest})
            pending = None
        else:
            out.append(dict(msg))
    return out


def read_entry(obj: Mapping[str, Any], source: SourceInfo, tools: Sequence[Any] | None = None,
               document: Any = None) -> ImportedEpisode:
    """The file's one episode."""
    messages = list(obj["messages"])
    for turn, msg in enumerate(messages):
        require(isinstance(msg, Mapping), "a message is not an object", source, turn=turn)
    exits = [i for i, m in enumerate(messages) if m.get("role") == "exit"]
    require(exits in ([], [len(messages) - 1]), f"an 'exit' message may only come last (found at {exits})",
            source, turn=exits[0] if exits else None)
    exit_msg = messages.pop() if exits else None
    calling = any(m.get("tool_calls") for m in messages)
    source = dataclasses.replace(source, variant="tool-calling" if calling else "text-actions")
    statuses: dict[int, str] = {}
    if calling:
        converted, statuses = _tool_calling(messages, source)
    else:
        converted = _text_actions(messages, source)
    info = obj.get("info") if isinstance(obj.get("info"), Mapping) else {}
    exit_extra = exit_msg.get("extra") if exit_msg is not None and isinstance(exit_msg.get("extra"), Mapping) else {}
    status = exit_extra.get("exit_status", info.get("exit_status"))
    end = ending(cause="submitted" if status == "Submitted" else status, truncated=status != "Submitted") \
        if isinstance(status, str) and status else ending()
    metadata = {k: v for k, v in obj.items() if k != "messages"}
    if exit_msg is not None:
        metadata["exit"] = dict(exit_msg)
    return episode_events(converted, source=source, tools=tools or (), metadata=metadata, end=end,
                          task={"name": "mini-swe-agent", "instance_id": obj.get("instance_id")}, statuses=statuses)


IMPORTER = Importer(name="mini-swe-agent", description="mini-swe-agent .traj.json: {info, messages, "
                                                       "trajectory_format: mini-swe-agent-1.x} (tool calls or text actions)",
                    matches=matches, entries=lambda doc: [doc],
                    entry_problem=lambda doc: None if matches(doc) else "a mini-swe-agent trajectory is an object with "
                                                                         "'messages' and 'trajectory_format'",
                    entry_id=lambda doc, index: str(doc.get("instance_id") or ""), read_entry=read_entry)
"""The `mini-swe-agent` entry of `IMPORTERS`."""
