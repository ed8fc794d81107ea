"""`ctxkit bench build`: per-turn context building with compressors vs LangChain trim + apply_chat_template.

The episode is the render benchmark's (`render_bench.build_episode`: per turn an assistant tool call and
a ~300-word tool output; ~70k tokens at 200 turns), recorded as events (assistant turns as `Step`s with
their token ids). One context is built before every assistant turn, at a fixed budget, for each ctxkit
compressor, and, in the same run, with LangChain's `trim_messages(strategy="last", include_system=True,
token_counter=<per-message token count over the same tokenizer, cached>, max_tokens=budget)` followed by
`apply_chat_template(tokenize=True, add_generation_prompt=True)`. Reported: per-turn medians, ratios,
and whether every context is within the budget in tokens of the final render (ctxkit checks this at
every build; LangChain's token counter sees message text only, so its renders may not be).

Layer L4 (experiment): imports the library layers below it, never the CLI.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_COMPRESSORS = ("window", "mask-observations")


@dataclass(frozen=True)
class ArmResult:
    """Figures for one arm (a ctxkit compressor, or the LangChain baseline)."""

    name: str
    """Compressor spec name, or `langchain trim_messages + apply_chat_template`."""
    median_ms: float
    """Median per-turn build time (median over repeats of the per-turn median)."""
    p90_ms: float
    """90th percentile per-turn time (first repeat)."""
    total_s: float
    """Median total time of one pass over the episode."""
    max_tokens: int
    """Largest context (tokens of the final render)."""
    final_tokens: int
    """Tokens of the last context."""
    over_budget: int
    """Turns whose context exceeded the budget."""
    orphans: int
    """Turns whose context holds an orphaned tool message."""
    compactions: int = 0
    """Compaction events recorded (ctxkit arms)."""
    pin_kept: bool = True
    """The user's constraint is verbatim in every context."""


@dataclass(frozen=True)
class BuildBenchResult:
    """One `bench build` run."""

    tokenizer: str
    template: str
    turns: int
    budget: int
    repeats: int
    episode_tokens: int
    """Tokens of the full, uncompressed episode (final render)."""
    arms: list[ArmResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict."""
        return asdict(self)


def episode_events(turns: int, tok, tpl, seed: int = 0):
    """The render benchmark's episode as events (tool-call arguments as JSON text, steps with token ids)."""
    from ctxkit.benchmarks.render_bench import build_episode
    from ctxkit.events import EpisodeStart, Message, Step, ToolCall, ToolResult
    from ctxkit.rendering import encode_assistant_turn

    head, steps, tools = build_episode(turns, seed)
    events: list = [EpisodeStart(episode_id="bench-build", tools=tuple(tools))]
    events += [Message(role=m["role"], content=m["content"]) for m in head]
    per_turn = []
    for assistant, result in steps:
        calls = tuple(ToolCall(id=c["id"], name=c["function"]["name"], arguments=json.dumps(c["function"]["arguments"]))
                      for c in assistant["tool_calls"])
        msg = {"role": "assistant", "content": assistant["content"], "tool_calls": [c.to_openai() for c in calls]}
        ids = encode_assistant_turn(msg, tok, tpl, tools)
        per_turn.append([Step(token_ids=ids, content=assistant["content"], tool_calls=calls),
                         ToolResult(tool_call_id=result["tool_call_id"], content=result["content"])])
    return events, per_turn, list(tools)


def _ctxkit_pass(tok, tpl, name, budget, head, per_turn, constraint, check: bool):
    from ctxkit.builder import ContextBuilder
    from ctxkit.events import Compaction
    from ctxkit.log import MemoryLog
    from ctxkit.view import find_orphans

    builder = ContextBuilder(tok, tpl, name, budget)
    log = MemoryLog()
    log.extend(head)
    times, sizes, orphans, pin_ok, compactions = [], [], 0, True, 0
    for turn in per_turn:
        t0 = time.perf_counter()
        ctx = builder.build(log)
        times.append(time.perf_counter() - t0)
        sizes.append(ctx.n_tokens)
        if check:
            orphans += bool(find_orphans(ctx.view.messages))
            pin_ok = pin_ok and constraint in tok.decode(ctx.token_ids)
        log.extend(turn)
    compactions = sum(isinstance(e, Compaction) for e in log.events())
    return times, sizes, orphans, pin_ok, compactions, builder.compressor.spec.name


def _langchain_pass(tok, tpl, budget, lc_head, lc_turns, tools, constraint, check: bool):
    from functools import lru_cache

    from langchain_core.messages import ToolMessage, convert_to_openai_messages, trim_messages

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

    msgs = list(lc_head)
    times, sizes, orphans, pin_ok = [], [], 0, True
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
            first = next((m for m in trimmed[1:]), None)
            orphans += isinstance(first, ToolMessage)
            pin_ok = pin_ok and constraint in tok.decode(ids)
        msgs.extend(turn)
    return times, sizes, orphans, pin_ok


def _lc_messages(head, per_turn):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    from ctxkit.events import content_text

    lc_head = []
    for e in head[1:]:
        cls = SystemMessage if e.role == "system" else HumanMessage
        lc_head.append(cls(content=content_text(e.content)))
    lc_turns = []
    for step, result in per_turn:
        calls = [{"name": c.name, "args": json.loads(c.arguments_text()), "id": c.id, "type": "tool_call"} for c in step.tool_calls]
        lc_turns.append([AIMessage(content=content_text(step.content), tool_calls=calls),
                         ToolMessage(content=content_text(result.content), tool_call_id=result.tool_call_id)])
    return lc_head, lc_turns


def require_langchain() -> None:
    """Check that LangChain (the baseline arm, `langchain-core` from the `test` extra) can be imported;
    else a `MissingExtraError` naming the extra."""
    try:
        import langchain_core.messages  # noqa: F401
    except ImportError as exc:
        from ctxkit.models import MissingExtraError

        raise MissingExtraError("langchain-core", "test", "ctxkit bench build (its LangChain baseline arm)") from exc


def run(tokenizer_spec: str, *, turns: int = 200, budget: int = 16_000, compressors=DEFAULT_COMPRESSORS,
        repeats: int = 3, progress=None) -> BuildBenchResult:
    """Run the benchmark (see the module docstring)."""
    from ctxkit.compress import compressor_class
    from ctxkit.errors import ConfigError
    from ctxkit.rendering import render
    from ctxkit.templates import load_template
    from ctxkit.tokenizers import load_tokenizer

    require_langchain()
    compressors = tuple(compressors)
    if not compressors:
        raise ConfigError("bench build: no compressor given; name at least one (see `ctxkit compressors`)")
    for name in compressors:
        compressor_class(name)  # an unknown name fails here, before the episode is built
    if turns < 1 or repeats < 1 or budget < 1:
        raise ConfigError(f"bench build: turns, repeats and budget must be at least 1 (got {turns}, {repeats}, {budget})")
    tok = load_tokenizer(tokenizer_spec)
    if tok.hf is None:
        raise ConfigError(f"bench build compares against transformers; --tokenizer must be a Hugging Face tokenizer, got {tok.id}")
    tpl = load_template(None, tok)
    head, per_turn, tools = episode_events(turns, tok, tpl)
    constraint = "Do not modify the original config file."
    full = [m for e in head[1:] for m in [{"role": e.role, "content": e.content}]]
    for step, result in per_turn:
        full.append({"role": "assistant", "content": step.content, "tool_calls": [c.to_openai() for c in step.tool_calls]})
        full.append({"role": "tool", "tool_call_id": result.tool_call_id, "content": result.content})
    episode_tokens = len(render(full, tok, tpl, tools=tools, add_generation_prompt=True).token_ids)
    lc_head, lc_turns = _lc_messages(head, per_turn)
    arms = []
    for name in compressors:
        totals, medians, first = [], [], None
        for rep in range(repeats):
            times, sizes, orphans, pin_ok, compactions, spec = _ctxkit_pass(tok, tpl, name, budget, head, per_turn,
                                                                             constraint, check=rep == 0)
            totals.append(sum(times))
            medians.append(statistics.median(times))
            if rep == 0:
                first = (times, sizes, orphans, pin_ok, compactions)
            if progress:
                progress(f"{spec}: repeat {rep + 1}/{repeats}: {sum(times):.2f}s")
        times, sizes, orphans, pin_ok, compactions = first
        arms.append(ArmResult(spec, 1000 * statistics.median(medians), 1000 * _p90(times), statistics.median(totals),
                              max(sizes), sizes[-1], sum(s > budget for s in sizes), orphans, compactions, pin_ok))
    totals, medians, first = [], [], None
    for rep in range(repeats):
        times, sizes, orphans, pin_ok = _langchain_pass(tok, tpl, budget, lc_head, lc_turns, tools, constraint, rep == 0)
        totals.append(sum(times))
        medians.append(statistics.median(times))
        if rep == 0:
            first = (times, sizes, orphans, pin_ok)
        if progress:
            progress(f"langchain: repeat {rep + 1}/{repeats}: {sum(times):.2f}s")
    times, sizes, orphans, pin_ok = first
    arms.append(ArmResult("langchain trim_messages + apply_chat_template", 1000 * statistics.median(medians),
                          1000 * _p90(times), statistics.median(totals), max(sizes), sizes[-1],
                          sum(s > budget for s in sizes), orphans, 0, pin_ok))
    return BuildBenchResult(tokenizer=tok.id, template=tpl.id, turns=turns, budget=budget, repeats=repeats,
                            episode_tokens=episode_tokens, arms=arms)


def _p90(xs):
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.9 * len(s)))]


def main(args: argparse.Namespace) -> int:
    """Entry point of `ctxkit bench build` (options: --turns, --budget, --tokenizer, --compressors, --repeats, --json)."""
    import orjson

    from ctxkit.errors import ConfigError
    from ctxkit.tokenizers import shared_dir

    if args.turns < 1 or args.repeats < 1 or args.budget < 1:
        raise ConfigError("--turns, --repeats and --budget must be at least 1")
    spec = args.tokenizer or str(shared_dir() / "tokenizers" / "qwen2.5-instruct")
    names = DEFAULT_COMPRESSORS
    if args.compressors is not None:
        names = tuple(n.strip() for n in args.compressors.split(",") if n.strip())
        if not names:
            raise ConfigError(f"--compressors {args.compressors!r}: no compressor named; give comma-separated "
                              "names (see `ctxkit compressors`)")
    progress = None
    if not args.json:
        progress = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    result = run(spec, turns=args.turns, budget=args.budget, compressors=names, repeats=args.repeats, progress=progress)
    ok = all(a.over_budget == 0 and a.orphans == 0 and a.pin_kept for a in result.arms if not a.name.startswith("langchain"))
    if args.json:
        sys.stdout.write(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0 if ok else 1
    base = next(a for a in result.arms if a.name.startswith("langchain"))
    print(f"bench build: {result.turns} turns, budget {result.budget}, full episode {result.episode_tokens} tokens, "
          f"median of {result.repeats} repeats; tokenizer {result.tokenizer}, template {result.template}")
    print(f"{'arm':<48} {'median ms/turn':>14} {'p90 ms':>8} {'total s':>8} {'x faster':>9} {'max tok':>8} "
          f"{'over budget':>11} {'orphans':>8} {'pin kept':>8}")
    for a in result.arms:
        speed = base.median_ms / a.median_ms if a.median_ms else float("inf")
        print(f"{a.name:<48} {a.median_ms:>14.3f} {a.p90_ms:>8.2f} {a.total_s:>8.2f} {speed:>8.1f}x {a.max_tokens:>8} "
              f"{a.over_budget:>11} {a.orphans:>8} {'yes' if a.pin_kept else 'NO':>8}")
    print("ctxkit contexts within budget (tokens of the final render): " + ("yes, every turn" if ok else "NO"))
    print(f"langchain contexts within budget: {'yes' if base.over_budget == 0 else f'no, {base.over_budget} turns over'}")
    return 0 if ok else 1
