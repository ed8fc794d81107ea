"""Helper for tests that read decisions back from logs: write a real episode log whose `Step` events carry
given context hashes."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ctxkit.events import Message, Step
from ctxkit.log.event_log import EventLog


def write_step_log(path: Path, hashes: Sequence[str]) -> Path:
    """A real episode log at `path`: a user message, then one `Step` per context hash, each followed by a tool
    message (parent folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with EventLog.create(path, durability="none") as log:
        log.append(Message(role="user", content="go"))
        for h in hashes:
            log.append(Step(context_hash=h, context_length=3, token_ids=(1, 2)))
            log.append(Message(role="tool", content="out", tool_call_id="c"))
    return path
