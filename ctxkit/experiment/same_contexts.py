"""Arms that showed the policy the same contexts: a comparison that measures nothing about the context policy.

Two context policies can differ in name and still build the same tokens: a mask stage whose masked output the
window stage then drops anyway, or pins whose text the kept first message still holds (the pinned block lists only
pins no longer visible). Their episodes are then equal decision for decision, and a reported difference of 0
reads as "no effect" when the comparison never happened. This module finds such pairs from the logs: an episode's
*decision trace* is the `context_hash` of each of its `Step` events (the hash of the rendered ids the policy was
given), and two arms are *the same here* when every episode they share has the same trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Hashable, Mapping, Sequence

from ctxkit.events import Step
from ctxkit.log.file_format import iter_events

__all__ = ["SameContexts", "decision_trace", "same_context_pairs"]


@dataclass(frozen=True)
class SameContexts:
    """Two arms whose every shared episode showed the policy identical contexts at every decision."""

    first: str
    """The arm listed first (in the order given)."""
    second: str
    """The other arm."""
    episodes: int
    """Episodes the two share (same key: task and seed, or a run's step and episode file)."""
    decisions: int
    """Decisions compared over those episodes (each with equal context hashes)."""


def decision_trace(path: str | Path) -> tuple[str, ...]:
    """The `context_hash` of each `Step` in the log at `path`, in order (the log is read and verified; a bad
    log raises its typed `ctxkit` error naming the file and line)."""
    return tuple(e.context_hash for e in iter_events(path) if isinstance(e, Step))


def same_context_pairs(traces: Mapping[str, Mapping[Hashable, Sequence[str]]]) -> list[SameContexts]:
    """The pairs of arms (`arm -> episode key -> decision trace`) that share at least one episode with at least
    one decision, hold the same episode keys, and have equal traces for every one of them; in the order of
    `traces`. Arms that share no episode are not compared."""
    out = []
    for a, b in combinations(traces, 2):
        ta, tb = traces[a], traces[b]
        if not ta or set(ta) != set(tb):
            continue
        if all(tuple(ta[k]) == tuple(tb[k]) for k in ta):
            decisions = sum(len(ta[k]) for k in ta)
            if decisions:
                out.append(SameContexts(first=a, second=b, episodes=len(ta), decisions=decisions))
    return out
