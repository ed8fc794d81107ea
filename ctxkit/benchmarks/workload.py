"""Benchmark workloads: an episode cut at its decision points, timing statistics, budget fitting.

A `Workload` is one episode as the benchmarks replay it: `head` (the events before the first assistant
turn) and `turns` (per assistant turn: its `Step` and every event up to the next one). A context is built
(or rendered) before every turn, i.e. at every decision point. Workloads come from the synthetic
render-benchmark episode (`synthetic_workload`) or from any conversation or imported trajectory
(`episode_workloads`: `ctxkit.read_episodes` formats, assistant turns made into offline steps).

`Timing` summarizes per-decision times honestly: the whole-episode total first, then p50/p90/p99/max.
`fit_budget` turns a fraction of the episode's full length into a budget, raised in 256-token steps to
the smallest one at which `window` fits every decision point when the fraction is below the fixed
prefix (system prompt, tool schemas, pins) plus the newest turn, as tests/training/test_trajectories.py does.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

from ctxkit.benchmarks.synthetic_episode import build_episode
from ctxkit.context.pins import clear_detection_cache
from ctxkit.context.view import message_of
from ctxkit.errors import BudgetError, ConfigError
from ctxkit.events import Compaction, EpisodeStart, Message, Step, ToolCall, ToolResult
from ctxkit.log.importers import read_episodes, read_tools
from ctxkit.text.rendering.renderer import encode_assistant_turn, render
from ctxkit.training.offline_steps import add_offline_steps
import statistics
import time

BUDGET_STEP = 256
"""Budget increment used when a fraction of the episode is too small to fit (tokens)."""


@dataclass(frozen=True)
class Workload:
    """One episode cut at its decision points (see the module docstring)."""

    name: str
    """Where it came from: `synthetic:<turns>` or `<file>#<entry id or index>`."""
    head: tuple[Any, ...]
    """Events before the first assistant turn (EpisodeStart first)."""
    turns: tuple[tuple[Any, ...], ...]
    """Per decision point: the assistant `Step` and the events after it up to the next step."""
    tools: tuple[dict, ...]
    """The episode's tool schemas (OpenAI shape)."""
    full_tokens: int
    """Tokens of the full, uncompressed episode (see `full_length`)."""

    def chats(self, events: Sequence[Any]) -> list[dict]:
        """OpenAI messages of chat-shaped `events` (what the view renders for them, sampled ids dropped)."""
        out = []
        for e in events:
            m = message_of(e)
            if m is not None:
                chat = m.to_chat()
                chat.pop("token_ids", None)
                out.append(chat)
        return out

    @property
    def tools_or_none(self) -> list[dict] | None:
        """The tool schemas, or None when the episode has none."""
        return [dict(t) for t in self.tools] or None


@dataclass(frozen=True)
class Timing:
    """Per-decision times of one arm, summarized (milliseconds per decision, seconds in total)."""

    total_s: float
    """Whole-episode time: the sum over decision points."""
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    decisions: int
    """Decision points timed."""


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..100) of a non-empty sequence."""
    s = sorted(values)
    rank = max(1, -(-len(s) * q // 100))  # ceil(n * q / 100), at least 1
    return s[int(min(len(s), rank)) - 1]


def summarize_times(per_repeat: Sequence[Sequence[float]]) -> Timing:
    """`Timing` from per-decision seconds of each repeat: each decision's median over the repeats, then the
    total and percentiles over decisions (a one-off stall in one repeat does not count; a slow decision does)."""
    n = min(len(r) for r in per_repeat)
    per = [statistics.median(r[i] for r in per_repeat) for i in range(n)]
    if not per:
        return Timing(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    ms = [1000 * t for t in per]
    return Timing(sum(per), percentile(ms, 50), percentile(ms, 90), percentile(ms, 99), max(ms), n)


def split_at_steps(events: Sequence[Any], name: str, tok: Any, tpl: Any) -> Workload:
    """A `Workload` from events holding `Step`s (their assistant turns are the decision points)."""
    events = [e for e in events if not isinstance(e, Compaction)]  # a source's own decisions are not replayed
    first = next((i for i, e in enumerate(events) if isinstance(e, Step)), None)
    if first is None:
        raise ConfigError(f"{name}: the episode has no assistant turn, so no decision point to benchmark")
    turns, cur = [], []
    for e in events[first:]:
        if isinstance(e, Step) and cur:
            turns.append(tuple(cur))
            cur = []
        cur.append(e)
    turns.append(tuple(cur))
    start = next((e for e in events if isinstance(e, EpisodeStart)), None)
    tools = tuple(dict(t) for t in start.tools) if start is not None else ()
    head = tuple(events[:first])
    wl = Workload(name, head, tuple(turns), tools, 0)
    return Workload(name, head, tuple(turns), tools, full_length(wl, tok, tpl))


def full_length(wl: Workload, tok: Any, tpl: Any) -> int:
    """Tokens of the uncompressed episode at its last decision: the keep-all context length of the last
    step plus its own ids when recorded (offline steps record it), else a full render through that step."""
    last = wl.turns[-1][0]
    if getattr(last, "context_length", None):
        return max(s[0].context_length + len(s[0].token_ids) for s in wl.turns)

    msgs = wl.chats(wl.head) + [c for t in wl.turns[:-1] for c in wl.chats(t)] + wl.chats(wl.turns[-1][:1])
    return len(render(msgs, tok, tpl, tools=wl.tools_or_none).token_ids)


def synthetic_workload(turns: int, tok: Any, tpl: Any, seed: int = 0) -> Workload:
    """The render benchmark's episode (`render_bench.build_episode`) as a workload: per turn an assistant
    tool call (a `Step` with its ids) and a ~300-word tool result."""
    head, steps, tools = build_episode(turns, seed)
    events: list = [EpisodeStart(episode_id="bench-build", tools=tuple(tools))]
    events += [Message(role=m["role"], content=m["content"]) for m in head]
    for assistant, result in steps:
        calls = tuple(ToolCall(id=c["id"], name=c["function"]["name"], arguments=json.dumps(c["function"]["arguments"]))
                      for c in assistant["tool_calls"])
        msg = {"role": "assistant", "content": assistant["content"], "tool_calls": [c.to_openai() for c in calls]}
        ids = encode_assistant_turn(msg, tok, tpl, tools)
        events += [Step(token_ids=ids, content=assistant["content"], tool_calls=calls),
                   ToolResult(tool_call_id=result["tool_call_id"], content=result["content"])]
    return split_at_steps(events, f"synthetic:{turns}", tok, tpl)


def episode_workloads(path: str, tok: Any, tpl: Any, *, select: str | None = None, tools_file: str | None = None,
                      format: str = "auto") -> list[Workload]:
    """Workloads of every episode of a conversation or trajectory file (or those `select` names), with
    assistant turns made into offline steps; `tools_file` replaces the file's tool schemas."""
    tools = read_tools(tools_file) if tools_file else None
    out = []
    base = os.path.basename(str(path))
    for i, ep in enumerate(read_episodes(path, format=format, select=select, tools=tools)):
        events = ep.events
        if not any(isinstance(e, Step) for e in events):
            events = add_offline_steps(events, tok, tpl)
        out.append(split_at_steps(events, f"{base}#{ep.entry_id or i}", tok, tpl))
    return out


def histories(wl: Workload, *, after_each_turn: bool = False) -> list[list[dict]]:
    """The full (uncompressed) chat history at every decision point: before each turn (where `bench build`
    builds), or after each turn is appended (where `bench render` renders, the next decision's context)."""
    out, msgs = [], wl.chats(wl.head)
    for turn in wl.turns:
        if not after_each_turn:
            out.append(msgs)
        msgs = msgs + wl.chats(turn)
        if after_each_turn:
            out.append(msgs)
    return out


def new_text_deltas(wl: Workload, tpl: Any, *, after_each_turn: bool = False) -> list[str]:
    """Per decision point, the text a renderer must newly tokenize: the full history's rendered text (with
    the generation prompt) after its common prefix with the previous decision's. Computed untimed."""
    tools = wl.tools_or_none
    texts = [tpl.render_text(h, tools=tools, add_generation_prompt=True)
             for h in histories(wl, after_each_turn=after_each_turn)]
    return [texts[0]] + [b[len(os.path.commonprefix([a, b])):] for a, b in zip(texts, texts[1:])]


def encode_only_times(tok: Any, deltas: Sequence[str]) -> list[float]:
    """Seconds to encode each delta (the physical-limit reference: nothing but the new text tokenized, by
    the fastest exact call the tokenizer library has: `encode_batch_fast` of one text, which skips the
    character offsets, where the installed `tokenizers` has it; ids equal `encode`'s)."""
    if tok.hf is not None:
        backend = tok.hf.backend_tokenizer
        fast = getattr(backend, "encode_batch_fast", None)
        if fast is not None:
            def enc(text):
                return fast([text], add_special_tokens=False)
        else:
            def enc(text):
                return backend.encode(text, add_special_tokens=False)
    else:
        enc = tok.encode
    out = []
    for d in deltas:
        t0 = time.perf_counter()
        enc(d)
        out.append(time.perf_counter() - t0)
    return out


def cold_start(tok: Any) -> None:
    """Empty every cache that holds episode content (the tokenizer's counts and piece encodings, pin
    detections by text), so a timed pass pays for all of its own text, as a worker's first sight of an
    episode does. Caches of configuration (compiled templates, template profiles) stay warm."""
    tok.clear_caches()
    clear_detection_cache()


def budget_from_fraction(wl: Workload, tok: Any, tpl: Any, fraction: float, fits) -> tuple[int, str]:
    """`(budget, note)`: `fraction` of the episode's full length, or, when `fits(budget)` (a window pass over
    every decision point) says that is below the fixed prefix + newest turn, the smallest budget above it in
    `BUDGET_STEP` steps that fits; the note says which."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"--budget-fraction {fraction}: expected a fraction in (0, 1]")
    wanted = max(1, int(wl.full_tokens * fraction))
    budget = wanted
    while True:
        try:
            fits(budget)
            break
        except BudgetError:
            budget += BUDGET_STEP
            if budget > wl.full_tokens + BUDGET_STEP:
                raise ConfigError(f"{wl.name}: window cannot fit the episode even at its full length "
                                  f"({wl.full_tokens} tokens)") from None
    if budget == wanted:
        return budget, f"{fraction:.0%} of the full {wl.full_tokens} tokens"
    return budget, (f"{fraction:.0%} of the full {wl.full_tokens} tokens ({wanted}) is below the fixed prefix + "
                    f"newest turn; using {budget} ({budget / wl.full_tokens:.0%}), the smallest that fits in "
                    f"{BUDGET_STEP}-token steps")
