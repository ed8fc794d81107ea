"""Per-episode metrics: outcome, quality, tool use, tokens, compression, prefix reuse and where time went.

`episode_metrics(events, steps, wall_s)` turns an episode's events plus the runner's per-step measurements
into one results row. Everything except the `timing` sub-dict is a deterministic function of the episode
(same config, same row); `timing` holds wall-clock seconds and is left out when rows are compared.

`malformed_tool_calls` counts `<tool_call>` blocks a turn wrote that do not parse (bad JSON, no name, never
closed): they run no tool, and their text stays in the turn's content. `tool_calls` counts the parsed ones.

`discarded` (and `loss_tokens` 0) follows `ctxkit.training.preflight.is_discarded`, the definition
`ctxkit audit` uses for its discard rate: an episode a trainer drops (no sampled step, no end, an unscored
end, or a length truncation). Limit truncations (`max_steps`, `wall_time`) are kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ctxkit.content import flatten_content
from ctxkit.events import Compaction, EpisodeEnd, Event, Pin, Step, ToolResult
from ctxkit.experiment.agents.parsing import parse_text
from ctxkit.training.preflight import is_discarded

__all__ = ["StepRecord", "common_prefix", "episode_metrics", "TIMING_KEY", "TIMEOUT_CAUSES"]

TIMING_KEY = "timing"
"""Row key of the non-deterministic wall-clock fields."""

TIMEOUT_CAUSES: frozenset[str] = frozenset({"wall_time", "tool_timeout"})
"""End causes that are timeouts."""


@dataclass(frozen=True)
class StepRecord:
    """What the runner measured at one step."""

    prompt_tokens: int
    """Tokens of the context sent to the policy."""
    full_tokens: int
    """Tokens the same history takes rendered without any compaction (the keep-all render)."""
    reused_prefix: int
    """Longest common prefix, in tokens, with the previous step's context (0 at the first step)."""
    generated_tokens: int
    """Tokens the policy produced."""
    build_s: float
    """Seconds to build the context (compression included)."""
    prefill_s: float
    """Agent-reported prefill seconds."""
    decode_s: float
    """Agent-reported decode seconds."""
    generate_s: float
    """Wall seconds of the agent's `act`."""
    tool_s: float
    """Seconds spent running this step's tool calls."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def _call_key(name: str, arguments: str) -> str:
    try:
        return name + json.dumps(json.loads(arguments), sort_keys=True)
    except (json.JSONDecodeError, TypeError):
        return name + arguments


def episode_metrics(events: Sequence[Event], steps: Sequence[StepRecord], *, wall_s: float) -> dict[str, Any]:
    """The metrics part of a results row (see the module docstring); `timing` holds the clock fields."""
    end = next((e for e in reversed(events) if isinstance(e, EpisodeEnd)), None)
    step_events = [e for e in events if isinstance(e, Step)]
    results = [e for e in events if isinstance(e, ToolResult)]
    seen: set[str] = set()
    repeated = 0
    n_calls = 0
    for s in step_events:
        for tc in s.tool_calls:
            n_calls += 1
            key = _call_key(tc.name, tc.arguments_text())
            repeated += key in seen
            seen.add(key)
    prompt = [r.prompt_tokens for r in steps]
    full = [r.full_tokens for r in steps]
    generated = sum(len(s.token_ids) for s in step_events)
    scores: Mapping[str, Any] = end.scores if end is not None else {}
    cause = end.cause if end is not None else "harness_error"
    discarded = is_discarded(step_events, end)  # the one definition, shared with `ctxkit audit`'s discard_rate
    total_prompt = int(sum(prompt))
    tool_waits = [float(r.duration_s or 0.0) for r in results]
    timing = {
        "wall_s": float(wall_s),
        "build_s": float(sum(r.build_s for r in steps)),
        "generate_s": float(sum(r.generate_s for r in steps)),
        "prefill_s": float(sum(r.prefill_s for r in steps)),
        "decode_s": float(sum(r.decode_s for r in steps)),
        "tool_s": float(sum(r.tool_s for r in steps)),
        "tool_waits": tool_waits,
    }
    timing["other_s"] = max(0.0, timing["wall_s"] - timing["build_s"] - timing["generate_s"] - timing["tool_s"])
    return {
        "outcome": end.outcome if end is not None else "truncated",
        "cause": cause,
        "reward": end.reward if end is not None else None,
        "reward_kind": end.reward_kind if end is not None else "unscored",
        "quality": float(scores.get("quality", 0.0) or 0.0),
        "violations": int(scores.get("violations", 0) or 0),
        "completed": end is not None and end.outcome == "terminated" and cause in ("answered", "constraint_violated"),
        "discarded": discarded,
        "timed_out": cause in TIMEOUT_CAUSES,
        "steps": len(step_events),
        "tool_calls": n_calls,
        "repeated_tool_calls": repeated,
        "malformed_tool_calls": sum(len(parse_text(flatten_content(s.content)).errors) for s in step_events),
        "tool_errors": sum(r.status != "ok" for r in results),
        "compactions": sum(isinstance(e, Compaction) for e in events),
        "pins": sum(isinstance(e, Pin) for e in events),
        "prompt_tokens": prompt,
        "prompt_tokens_total": total_prompt,
        "peak_context": max(prompt, default=0),
        "full_tokens_total": int(sum(full)),
        "compression_ratio": (sum(full) / total_prompt) if total_prompt else 1.0,
        "prefix_reuse": (sum(r.reused_prefix for r in steps) / total_prompt) if total_prompt else 0.0,
        "generated_tokens": generated,
        "loss_tokens": 0 if discarded else generated,
        TIMING_KEY: timing,
    }
