"""Helpers for tests on the real trajectories in `../shared/trajectories`: read a tau-bench or SWE-agent
episode as an OpenAI conversation (the importers proper live elsewhere) and write an offline-step log."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from conftest import shared_path, tokenizer_dir
from ctxkit.log.conversation import import_conversation
from ctxkit.events import EpisodeEnd
from ctxkit.log.event_log import EventLog
from ctxkit.training.offline_steps import add_offline_steps


def qwen() -> str:
    return str(tokenizer_dir("qwen2.5-instruct"))


def tau_episodes() -> list[dict[str, Any]]:
    return json.loads(shared_path("trajectories", "tau-bench__gpt-4o-airline.json").read_text())


def tau_tools() -> list[dict[str, Any]]:
    return json.loads(shared_path("trajectories", "tau-bench__airline_tools.json").read_text())


def tau_conversation(index: int = 0) -> dict[str, Any]:
    return {"messages": tau_episodes()[index]["traj"], "tools": tau_tools()}


def sweagent_conversation() -> dict[str, Any]:
    """The function-calling `history` of the marshmallow `.traj`: `tool_calls` and `tool_call_ids` are
    Python reprs there; SWE-agent's own keys (agent, thought, action, message_type) are dropped."""
    traj = json.loads(shared_path("trajectories", "sweagent__marshmallow-1867__function_calling_replace_from_source.traj").read_text())
    messages = []
    for m in traj["history"]:
        out = {"role": m["role"], "content": m["content"]}
        if m.get("tool_calls"):
            out["tool_calls"] = ast.literal_eval(m["tool_calls"]) if isinstance(m["tool_calls"], str) else m["tool_calls"]
        if m["role"] == "tool":
            ids = ast.literal_eval(m["tool_call_ids"]) if isinstance(m["tool_call_ids"], str) else m["tool_call_ids"]
            out["tool_call_id"] = ids[0]
        messages.append(out)
    return {"messages": messages}


def write_offline_log(path: Path, conversation: Any, *, episode_id: str, reward: float | None = None,
                      tokenizer: str | None = None) -> EventLog:
    """Import, add offline steps, end (scored when `reward` is given) and write to `path`."""
    events = add_offline_steps(import_conversation(conversation, episode_id=episode_id), tokenizer or qwen())
    if reward is not None:
        events.append(EpisodeEnd(outcome="terminated", cause="answered", reward=reward, reward_kind="scored"))
    log = EventLog.create(path, episode_id=episode_id)
    log.extend(events)
    return log
