"""The `resume` check of `ctxkit.training.preflight`: is enough recorded to continue an episode from its log?

`resume_problems` lists what is missing: the builder description, a sampler seed (not for a log whose
steps are all offline: nothing was sampled), unique tool-call ids and results that answer a known call,
unpins of known pins, and, in episodes with external state (any `StateSnapshot`, or `stateful: true` in the
task/metadata), a snapshot after every successful tool result whose manifest blob exists beside the log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from ctxkit.events import EpisodeEnd, EpisodeStart, Event, Pin, StateSnapshot, Step, ToolResult, Unpin
from ctxkit.training.offline_steps import is_offline_step
from ctxkit.errors import StateError
from ctxkit.log.state import BlobStore

__all__ = ["resume_problems", "snapshot_problems"]


def resume_problems(path: Path, events: Sequence[Event], start: EpisodeStart | None, steps: Sequence[Step]) -> list[str]:
    """What prevents resuming the episode in `path` from its `events`, one line each (empty: nothing)."""
    live = [s for s in steps if not is_offline_step(s)]
    offline_only = bool(steps) and not live
    problems = []
    if start is None or not start.context:
        problems.append("no builder description in EpisodeStart.context (the next context cannot be built)")
    has_seed = (start is not None and "seed" in start.sampler) or offline_only or (live and all("seed" in s.sampling for s in live))
    if not has_seed:
        problems.append("no sampler seed (EpisodeStart.sampler['seed'] or on every step)")
    calls: dict[str, int | None] = {}
    for e in events:
        for tc in getattr(e, "tool_calls", ()) or ():
            if not tc.id:
                problems.append(f"seq {e.seq}: tool call {tc.name!r} has no id")
            elif tc.id in calls:
                problems.append(f"seq {e.seq}: tool call id {tc.id!r} reused (first at seq {calls[tc.id]})")
            calls.setdefault(tc.id, e.seq)
        if isinstance(e, ToolResult) and e.tool_call_id not in calls:
            problems.append(f"seq {e.seq}: tool result answers unknown call id {e.tool_call_id!r}")
    pins = set()
    for e in events:
        if isinstance(e, Pin):
            pins.add(e.pin_id)
        elif isinstance(e, Unpin) and e.pin_id not in pins:
            problems.append(f"seq {e.seq}: unpin of unknown pin {e.pin_id!r}")
    snaps = [e for e in events if isinstance(e, StateSnapshot)]
    stateful = bool(snaps) or any(
        bool(m.get("stateful")) for m in ((start.task, start.metadata) if start is not None else ()) if isinstance(m, Mapping)
    )
    if stateful:
        problems += snapshot_problems(path, events, snaps)
    return problems


def snapshot_problems(path: Path, events: Sequence[Event], snaps: Sequence[StateSnapshot]) -> list[str]:
    """A successful tool result must be followed by a snapshot before the policy acts again (or the log ends):
    any snapshot after it captures the state it left."""
    problems = []
    pending: list[ToolResult] = []
    for e in events:
        if isinstance(e, ToolResult) and e.status == "ok":
            pending.append(e)
        elif isinstance(e, StateSnapshot):
            pending = []
        elif isinstance(e, (Step, EpisodeEnd)):
            problems += [f"seq {r.seq}: tool result for call {r.tool_call_id!r} may have changed external state "
                         "but no StateSnapshot follows it" for r in pending]
            pending = []
    problems += [f"seq {r.seq}: tool result for call {r.tool_call_id!r} has no StateSnapshot after it" for r in pending]

    store = BlobStore.for_log(path)
    for s in snaps:
        try:
            present = store.has(s.manifest_sha256)
        except StateError:
            present = False
        if not present:
            problems.append(f"seq {s.seq}: snapshot manifest {s.manifest_sha256[:16]!r} is missing from {store.root}")
    return problems
