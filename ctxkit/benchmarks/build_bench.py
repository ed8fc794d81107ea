"""`ctxkit bench build`: whole-episode context building with compressors vs LangChain trim + apply_chat_template.

The workload (`ctxkit.benchmarks.workload`) is the render benchmark's synthetic episode (per turn an
assistant tool call and a ~300-word tool output; ~70k tokens at 200 turns) or any conversation or imported
trajectory (`--episode`). One context is built before every assistant turn (each decision point), at a fixed
budget, for each ctxkit compressor (a `ContextBuilder` over a `MemoryLog`, pins on), and in the same run
with LangChain's `trim_messages(strategy="last", include_system=True, token_counter=<per-message token count
over the same tokenizer, cached>, max_tokens=budget)` followed by `apply_chat_template(tokenize=True,
add_generation_prompt=True)`; plus encoding only each decision's new text (the physical-limit reference).
Every timed ctxkit pass starts with the caches of episode content empty (`workload.cold_start`: token
counts, piece encodings, pin detections), so a repeat does not re-use what the previous one tokenized, and
the check against full renders runs in a pass of its own, untimed.

Reported per arm: the whole-episode total, p50/p90/p99/max per build (each decision's median over the
repeats), compactions, the total's ratio against LangChain and against encode-only, whether every ctxkit
context is within the budget in real tokens and equals a from-scratch render of its view (ids identical),
and LangChain's over-budget and orphaned-tool-message counts. Model-backed arms (`MODEL_BACKED`) are
reported separately: their first pass includes loading the model, so `first_pass_s` is shown too.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable
from functools import lru_cache

from ctxkit.benchmarks.workload import (Timing, Workload, cold_start, encode_only_times, new_text_deltas,
                                        summarize_times)
from ctxkit.benchmarks.workload import synthetic_workload
from ctxkit.context.builder import ContextBuilder
from ctxkit.context.models import MissingExtraError
from ctxkit.errors import BudgetError, ConfigError
from ctxkit.events import Compaction, Pin
from ctxkit.log.event_log import MemoryLog
from ctxkit.text.rendering.renderer import render
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.tokenizer.loader import load_tokenizer

DEFAULT_COMPRESSORS = ("window", "mask-observations")
LANGCHAIN = "langchain trim_messages + apply_chat_template"
ENCODE_ONLY = "encode only the new text"
MODEL_BACKED = frozenset({"summarize", "summarize-v2", "summarize-then-window", "retrieve"})
"""Arms that load a model (embedder/summarizer): slow, timed and reported apart from the others."""


@dataclass(frozen=True)
class ArmResult:
    """Figures for one arm (a ctxkit compressor, LangChain, or the encode-only reference)."""

    name: str
    """Compressor spec name, `LANGCHAIN` or `ENCODE_ONLY`."""
    kind: str
    """`ctxkit`, `ctxkit-model` (model-backed), `peer` or `reference`."""
    timing: Timing
    """Whole-episode total and per-build percentiles."""
    vs_peer: float | None
    """LangChain's total / this arm's total (> 1: faster than LangChain)."""
    vs_encode_only: float | None
    """This arm's total / encode-only's total (the target is <= 3)."""
    first_pass_s: float = 0.0
    """Total of the first repeat (includes any model load)."""
    compactions: int = 0
    """Compaction events recorded over the episode (ctxkit arms)."""
    max_tokens: int = 0
    """Largest context (tokens of the final render)."""
    over_budget: int = 0
    """Builds whose context exceeded the budget."""
    orphans: int = 0
    """Builds whose context holds an orphaned tool message (LangChain: trimmed to start on a tool result)."""
    pins_missing: int = 0
    """Builds whose context lacks a constraint ctxkit pinned (LangChain; ctxkit checks pins at every build)."""
    ids_identical: bool | None = None
    """ctxkit: every built context's ids equal a from-scratch render of its view."""
    error: str | None = None
    """Why the arm stopped before the last decision (e.g. a one-thing `-v2` strategy's BudgetError)."""


@dataclass(frozen=True)
class BuildBenchResult:
    """One `bench build` run over one workload."""

    tokenizer: str
    template: str
    episode: str
    """The workload's name (`synthetic:<turns>` or `<file>#<entry>`)."""
    decisions: int
    """Decision points (assistant turns): one build per arm at each."""
    budget: int
    budget_note: str
    """How the budget was chosen (given, or a fraction of the episode, raised to fit)."""
    repeats: int
    episode_tokens: int
    """Tokens of the full, uncompressed episode."""
    arms: list[ArmResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict."""
        return asdict(self)

    @property
    def ok(self) -> bool:
        """Every ctxkit arm that finished kept every context within budget with ids identical to a full render."""
        return all(a.over_budget == 0 and a.ids_identical is not False and a.orphans == 0
                   for a in self.arms if a.kind.startswith("ctxkit"))


def _ctxkit_pass(tok, tpl, name, budget, wl: Workload, check: bool):
    """One pass: build before every turn, every cache of episode content empty at its start (`cold_start`).
    Returns (times, sizes, compactions, ids_ok, pins, error, spec name); `check` compares every context with a
    full render (an untimed pass of its own: the full renders would warm the tokenizer's caches)."""
    cold_start(tok)
    builder = ContextBuilder(tok, tpl, name, budget)
    log = MemoryLog()
    log.extend(wl.head)
    times, sizes, ids_ok, error = [], [], True, None
    for turn in wl.turns:
        t0 = time.perf_counter()
        try:
            ctx = builder.build(log)
        except BudgetError as exc:
            error = f"BudgetError at decision {len(times) + 1}/{len(wl.turns)}: {exc}"
            break
        times.append(time.perf_counter() - t0)
        sizes.append(ctx.n_tokens)
        if check:
            full = render([m.to_chat() for m in ctx.view.messages], tok, tpl, tools=list(ctx.view.tools) or None,
                          add_generation_prompt=True, special_tokens=builder.special_tokens)
            ids_ok = ids_ok and tuple(full.token_ids) == tuple(ctx.token_ids)
        log.extend(turn)
    events = log.events()
    compactions = sum(isinstance(e, Compaction) for e in events)
    pins = tuple(e.text for e in events if isinstance(e, Pin))
    return times, sizes, compactions, ids_ok, pins, error, builder.compressor.spec.name


def fits_with(tok, tpl, name: str, wl: Workload) -> Callable[[int], None]:
    """A callable that builds every decision of `wl` with compressor `name` at a budget (raising `BudgetError`
    when one does not fit): `workload.budget_from_fraction`'s fit test."""
    def fits(budget: int) -> None:
        builder = ContextBuilder(tok, tpl, name, budget)
        log = MemoryLog()
        log.extend(wl.head)
        for turn in wl.turns:
            builder.build(log)
            log.extend(turn)
    return fits


def _to_lc(chat: dict):
    # lazy: langchain_core loads on first use
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    role, content = chat["role"], chat.get("content") or ""
    if role == "system":
        return SystemMessage(content=content)
    if role == "tool":
        return ToolMessage(content=content, tool_call_id=chat.get("tool_call_id") or "")
    if role == "assistant":
        calls = []
        for c in chat.get("tool_calls") or ():
            args = c["function"]["arguments"]
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    args = {"arguments": args}
            if not isinstance(args, dict):
                args = {"arguments": args}
            calls.append({"name": c["function"]["name"], "args": args, "id": c.get("id") or "", "type": "tool_call"})
        return AIMessage(content=content, tool_calls=calls)
    return HumanMessage(content=content)


def _langchain_pass(tok, tpl, budget, wl: Workload, pins, check: bool):
    # lazy: langchain_core loads on first use
    from langchain_core.messages import SystemMessage, ToolMessage, convert_to_openai_messages, trim_messages

    backend = tok.hf.backend_tokenizer

    @lru_cache(maxsize=None)
    def count_text(text: str) -> int:
        return len(backend.encode(text, add_special_tokens=False).ids)

    def token_counter(messages) -> int:
        n = 0
        for m in messages:
            n += count_text(m.content if isinstance(m.content, str) else str(m.content))
            for tc in getattr(m, "tool_calls", None) or ():
                n += count_text(tc["name"]) + count_text(json.dumps(tc["args"]))
        return n

    msgs = [_to_lc(c) for c in wl.chats(wl.head)]
    lc_turns = [[_to_lc(c) for c in wl.chats(t)] for t in wl.turns]
    tools = wl.tools_or_none
    times, sizes, orphans, missing = [], [], 0, 0
    for turn in lc_turns:
        t0 = time.perf_counter()
        trimmed = trim_messages(msgs, max_tokens=budget, strategy="last", include_system=True,
                                token_counter=token_counter)
        chat = convert_to_openai_messages(trimmed)
        ids = tok.hf.apply_chat_template(chat, tools=tools, chat_template=tpl.source, tokenize=True,
                                         add_generation_prompt=True, return_dict=False)
        times.append(time.perf_counter() - t0)
        sizes.append(len(ids))
        if check:
            rest = trimmed[1:] if trimmed and isinstance(trimmed[0], SystemMessage) else trimmed
            orphans += bool(rest) and isinstance(rest[0], ToolMessage)
            if pins:
                text = tok.decode(ids)
                missing += any(p not in text for p in pins)
        msgs.extend(turn)
    return times, sizes, orphans, missing


def require_langchain() -> None:
    """Check that LangChain (the baseline arm, `langchain-core` from the `test` extra) can be imported;
    else a `MissingExtraError` naming the extra."""
    try:
        import langchain_core.messages  # noqa: F401  # lazy: langchain_core loads on first use
    except ImportError as exc:
        raise MissingExtraError("langchain-core", "test", "ctxkit bench build (its LangChain baseline arm)") from exc


def run_workload(tok, tpl, wl: Workload, *, budget: int, budget_note: str = "", compressors=DEFAULT_COMPRESSORS,
                 repeats: int = 3, progress=None) -> BuildBenchResult:
    """Run every arm over one workload at `budget` (see the module docstring)."""
    require_langchain()
    if tok.hf is None:
        raise ConfigError(f"bench build compares against transformers; --tokenizer must be a Hugging Face tokenizer, got {tok.id}")
    if repeats < 1 or budget < 1:
        raise ConfigError(f"bench build: repeats and budget must be at least 1 (got {repeats}, {budget})")
    say = progress or (lambda msg: None)
    raw: list[tuple] = []  # (name, kind, per-repeat times, extra dict)
    pins: tuple[str, ...] = ()
    for name in compressors:
        reps, extra = [], {}
        for rep in range(repeats):
            times, sizes, compactions, _, found, error, spec = _ctxkit_pass(tok, tpl, name, budget, wl, False)
            reps.append(times)
            if rep == 0:
                pins = pins or found
                extra = dict(compactions=compactions, max_tokens=max(sizes, default=0),
                             over_budget=sum(s > budget for s in sizes), error=error)
            say(f"{spec}: repeat {rep + 1}/{repeats}: {sum(times):.2f}s" + (f" ({error})" if error else ""))
            if error:
                break  # the same build fails every time
        extra["ids_identical"] = _ctxkit_pass(tok, tpl, name, budget, wl, True)[3]
        kind = "ctxkit-model" if name.split("-v")[0] in MODEL_BACKED or name in MODEL_BACKED else "ctxkit"
        raw.append((spec, kind, reps, extra))
    reps = []
    for rep in range(repeats):
        times, sizes, orphans, missing = _langchain_pass(tok, tpl, budget, wl, pins, rep == 0)
        reps.append(times)
        if rep == 0:
            lc_extra = dict(max_tokens=max(sizes, default=0), over_budget=sum(s > budget for s in sizes),
                            orphans=orphans, pins_missing=missing)
        say(f"langchain: repeat {rep + 1}/{repeats}: {sum(times):.2f}s")
    raw.append((LANGCHAIN, "peer", reps, lc_extra))
    deltas = new_text_deltas(wl, tpl)
    raw.append((ENCODE_ONLY, "reference", [encode_only_times(tok, deltas) for _ in range(repeats)], {}))
    timings = {name: summarize_times(reps) for name, _, reps, _ in raw}
    peer, ref = timings[LANGCHAIN].total_s, timings[ENCODE_ONLY].total_s
    arms = []
    for name, kind, reps, extra in raw:
        t = timings[name]
        complete = extra.get("error") is None
        arms.append(ArmResult(name=name, kind=kind, timing=t,
                              vs_peer=peer / t.total_s if t.total_s and complete else None,
                              vs_encode_only=t.total_s / ref if ref and complete else None,
                              first_pass_s=sum(reps[0]), **extra))
    return BuildBenchResult(tokenizer=tok.id, template=tpl.id, episode=wl.name, decisions=len(wl.turns),
                            budget=budget, budget_note=budget_note or "given", repeats=repeats,
                            episode_tokens=wl.full_tokens, arms=arms)


def run(tokenizer_spec: str, *, turns: int = 200, budget: int = 16_000, compressors=DEFAULT_COMPRESSORS,
        repeats: int = 3, progress=None) -> BuildBenchResult:
    """The synthetic episode of `turns` turns at a fixed `budget` (the default `bench build`)."""
    tok = load_tokenizer(tokenizer_spec)
    tpl = load_template(None, tok)
    return run_workload(tok, tpl, synthetic_workload(turns, tok, tpl), budget=budget, compressors=compressors,
                        repeats=repeats, progress=progress)


def episode_events(turns: int, tok, tpl, seed: int = 0):
    """The synthetic episode as `(head events, per-turn event lists, tools)` (each turn: its `Step` and
    tool result), for tests and scripts that drive a builder themselves."""
    wl = synthetic_workload(turns, tok, tpl, seed)
    return list(wl.head), [list(t) for t in wl.turns], [dict(t) for t in wl.tools]
