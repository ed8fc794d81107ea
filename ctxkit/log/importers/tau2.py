"""tau2-bench `Results` files (`{timestamp, info, tasks, simulations}`): one episode per simulation, seen
by the policy under training, which is tau2's *agent*.

| source | becomes |
|---|---|
| `info.environment_info.policy` | the system message (tau2 wraps it in agent instructions the file does not record) |
| assistant messages (`tool_calls` `{id, name, arguments: object, requestor}`) | assistant `Message`s, arguments kept as objects |
| tool messages with `requestor: "assistant"` | tool messages answering `id`; `error: true` -> `ToolResult(status="error")` |
| user messages with text | user `Message`s (a user turn's own tool calls stay in its `extra["user_tool_calls"]`) |
| the user simulator's tool calls (user turns with no text) and their results (`requestor: "user"`) | **not in the view**: `metadata["source"]["user_side"]`, each message whole (`turn_idx` places it) |
| `reward_info.reward` | `EpisodeEnd.reward`, `scored`, details in `scores["reward_info"]` |
| `termination_reason` | `user_stop` / `agent_stop`: `terminated`; any other (`max_steps`, `too_many_errors`, ...): `truncated`, its reward `limit_truncation` |

Why the user simulator's calls stay out of the view: in tau2's "dual control" the user acts on their own
device; the orchestrator sends those calls to the environment and their results back to the user only. The
agent never sees them, only the user's next text (which reports what the user saw). Putting them in the
view, even as text, would train the policy on context it never had. They are kept whole in the episode's
metadata, with their `turn_idx`, so nothing recorded is lost.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ctxkit.log.importers.common import ImportedEpisode, Importer, SourceInfo, Ending, episode_events, require

_STOPS = ("user_stop", "agent_stop")
_KEYS = ("role", "content", "tool_calls", "id", "requestor", "error")


def matches(obj: Any) -> bool:
    """A dict with a `simulations` list and an `info` object (tau2-bench `Results`)."""
    return isinstance(obj, Mapping) and isinstance(obj.get("simulations"), list) and isinstance(obj.get("info"), Mapping)


def entry_problem(item: Any) -> str | None:
    """What keeps `item` from being a tau2 simulation, or None."""
    if not isinstance(item, Mapping):
        return f"a tau2 simulation is an object, not {type(item).__name__}"
    return None if isinstance(item.get("messages"), list) and "task_id" in item else \
        "field 'messages' (a list) or 'task_id' is missing"


def entry_id(item: Any, index: int) -> str:
    """`<task_id>-trial-<trial>` (the simulation's `id` is a random UUID, kept in the metadata)."""
    if not isinstance(item, Mapping) or "task_id" not in item:
        return ""
    return f"{item['task_id']}-trial-{item.get('trial', 0)}"


def _call(call: Any, source: SourceInfo, turn: int) -> dict[str, Any]:
    require(isinstance(call, Mapping) and isinstance(call.get("id"), str) and isinstance(call.get("name"), str),
            "a tool call needs string 'id' and 'name'", source, turn=turn)
    return {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call.get("arguments", {})}}


def _view(messages: Sequence[Any], system: str | None, source: SourceInfo) -> tuple[list[dict], dict[int, str], list]:
    """(the agent's messages, tool statuses by message index, the user side kept out of the view)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    statuses: dict[int, str] = {}
    user_side: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for turn, msg in enumerate(messages):
        require(isinstance(msg, Mapping) and msg.get("role") in ("assistant", "user", "tool"),
                f"role {msg.get('role') if isinstance(msg, Mapping) else msg!r} is not assistant, user or tool",
                source, turn=turn)
        role, extra = msg["role"], {k: v for k, v in msg.items() if k not in _KEYS}
        calls = msg.get("tool_calls") or []
        if role == "assistant":
            require(all(isinstance(c, Mapping) and c.get("requestor", "assistant") == "assistant" for c in calls),
                    "an assistant tool call with another requestor", source, turn=turn)
            item = {"role": "assistant", "content": msg.get("content"), **extra}
            if calls:
                item["tool_calls"] = [_call(c, source, turn) for c in calls]
                names.update((c["id"], c["name"]) for c in calls)
            out.append(item)
        elif role == "tool" and msg.get("requestor") == "user":
            user_side.append(dict(msg))
        elif role == "tool":
            require(isinstance(msg.get("id"), str), "a tool message needs the string 'id' of its call", source, turn=turn)
            if msg.get("error") is True:
                statuses[len(out)] = "error"
            out.append({"role": "tool", "tool_call_id": msg["id"], "name": names.get(msg["id"]),
                        "content": msg.get("content"), "requestor": "assistant", "error": msg.get("error"), **extra})
        elif msg.get("content") is None:  # the user simulator only called tools
            user_side.append(dict(msg))
        else:
            item = {"role": "user", "content": msg["content"], **extra}
            if calls:
                item["user_tool_calls"] = list(calls)
            out.append(item)
    return out, statuses, user_side


def _ending(item: Mapping[str, Any], source: SourceInfo) -> Ending:
    info = item.get("reward_info") if isinstance(item.get("reward_info"), Mapping) else {}
    reward = info.get("reward")
    require(reward is None or (isinstance(reward, (int, float)) and not isinstance(reward, bool)),
            f"field 'reward_info.reward': {reward!r} is not a number", source)
    reason = str(item.get("termination_reason") or "source_ended")
    stopped = reason in _STOPS
    kind = "unscored" if reward is None else "scored" if stopped else "limit_truncation"
    return Ending("terminated" if stopped else "truncated", reason, None if reward is None else float(reward), kind,
                  {"reward_info": dict(info)} if info else {})


def read_entry(item: Mapping[str, Any], source: SourceInfo, tools: Sequence[Any] | None = None,
               document: Any = None) -> ImportedEpisode:
    """One simulation as the agent's episode."""
    info = document.get("info") if isinstance(document, Mapping) else {}
    env = info.get("environment_info") if isinstance(info, Mapping) and isinstance(info.get("environment_info"), Mapping) else {}
    policy = env.get("policy") if isinstance(env.get("policy"), str) else None
    messages, statuses, user_side = _view(item["messages"], policy, source)
    metadata = {k: v for k, v in item.items() if k != "messages"}
    if user_side:
        metadata["user_side"] = user_side
    tasks = document.get("tasks") if isinstance(document, Mapping) and isinstance(document.get("tasks"), list) else []
    metadata["task"] = next((t for t in tasks if isinstance(t, Mapping) and t.get("id") == item.get("task_id")), None)
    metadata["results"] = {"timestamp": document.get("timestamp") if isinstance(document, Mapping) else None,
                           "info": {k: v for k, v in info.items() if k != "environment_info"}}
    own_tools = env.get("tool_defs") if isinstance(env.get("tool_defs"), list) else []
    task = {"name": f"tau2/{env.get('domain_name') or 'task'}", "task_id": item.get("task_id"), "trial": item.get("trial")}
    return episode_events(messages, source=source, tools=own_tools if tools is None else tools, task=task,
                          metadata=metadata, end=_ending(item, source), statuses=statuses)


IMPORTER = Importer(name="tau2", description="tau2-bench Results: {timestamp, info, tasks, simulations}",
                    matches=matches, entries=lambda doc: doc["simulations"], entry_problem=entry_problem,
                    entry_id=entry_id, read_entry=read_entry)
"""The `tau2` entry of `IMPORTERS`."""
