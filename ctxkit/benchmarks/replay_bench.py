"""Replay vs live build: what re-deriving every step's context from a saved log costs.

For each compressor, in one process and one run: (a) the synthetic episode (`workload.synthetic_workload`)
is built live with a `ContextBuilder` over a `MemoryLog`, one build before every assistant turn,
compactions included, each step recorded with its context's hash (as `bench build` times it: only the
builds); (b) every step of the log that pass recorded is replayed with `replay_steps` (one incremental walk:
one view state, one kept render cache); (c) the same with `replay_steps(..., reference=True)`, the old
path that rebuilds each step from scratch. Every timed pass starts with the caches of episode content empty
(`workload.cold_start`). A replayed step's time is the wait for its result (the first one includes reading
the setup); like the live pass, a timed replay keeps no result (the comparison with the reference runs
in an untimed pass of its own). Each decision's median over the repeats gives the total and p50/p90/p99/max
(`workload.summarize_times`).

Reported per compressor: the three timings, the ratios replay/live and reference/live (the target for the
new replay is <= 1.5x live), the compactions recorded, whether every replayed step verified against its
recorded hash, and whether the new replay's results equal the reference's (hashes, ids, masks, mismatches).

Run: `python -m ctxkit.benchmarks.replay_bench [--tokenizer DIR] [--turns 200] [--budget 16000] [--json]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from itertools import zip_longest
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import orjson

from ctxkit.benchmarks.bench_tables import table
from ctxkit.benchmarks.workload import Timing, Workload, cold_start, summarize_times, synthetic_workload
from ctxkit.context.builder import ContextBuilder
from ctxkit.errors import ConfigError
from ctxkit.events import Compaction, EpisodeStart, Event, Step
from ctxkit.log.event_log import MemoryLog
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.tokenizer.loader import load_tokenizer, shared_dir
from ctxkit.training.context_replay import ReplayResult, replay_steps

DEFAULT_COMPRESSORS = ("window", "mask-observations")
TARGET = 1.5
"""The new replay's whole-episode time should be at most this multiple of the live build's."""


@dataclass(frozen=True)
class ReplayArm:
    """Figures for one compressor."""

    compressor: str
    """The compressor's spec name."""
    steps: int
    """Steps recorded (and replayed)."""
    compactions: int
    """Compaction events the live build recorded."""
    live: Timing
    """Building the episode live: one `ContextBuilder.build` per decision."""
    replay: Timing
    """`replay_steps` over the recorded log (incremental walk)."""
    reference: Timing
    """`replay_steps(..., reference=True)` (a from-scratch `rebuild` per step)."""
    replay_vs_live: float | None
    """replay total / live total (target <= `TARGET`)."""
    reference_vs_live: float | None
    """reference total / live total."""
    all_ok: bool
    """Every replayed step's context hash equals the recorded one."""
    identical: bool
    """The new replay's results equal the reference's (every field, hashes, ids, masks, mismatches)."""


@dataclass(frozen=True)
class ReplayBenchResult:
    """One `replay_bench` run."""

    tokenizer: str
    template: str
    episode: str
    turns: int
    budget: int
    repeats: int
    arms: list[ReplayArm] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict."""
        return asdict(self)

    @property
    def ok(self) -> bool:
        """Every arm verified every step and matched the reference."""
        return all(a.all_ok and a.identical for a in self.arms)


def result_key(r: ReplayResult) -> tuple:
    """What must agree between two replays of one step: every field of the result and of its context
    (the render object itself aside: its ids, mask, spans and hash are compared)."""
    ctx = r.context
    built = None if ctx is None else (ctx.token_ids, ctx.loss_mask, ctx.hash, ctx.n_tokens, ctx.budget, ctx.view,
                                      ctx.pins_checked, ctx.compactions, ctx.truncated, tuple(ctx.rendered.spans))
    return (r.step, r.index, r.ok, r.expected_hash, r.got_hash, r.mismatch, r.error, r.tokenizer_id, r.template_id,
            r.warnings, built)


def live_pass(tok: Any, tpl: Any, compressor: str, budget: int, wl: Workload) -> tuple[list[float], tuple[Event, ...]]:
    """Build every decision of `wl` live (caches cold at the start); returns (seconds per build, the log's
    events: `EpisodeStart` carrying the builder's description, each step with its context's hash)."""
    cold_start(tok)
    builder = ContextBuilder(tok, tpl, compressor, budget)
    log = MemoryLog()
    head = list(wl.head)
    at = next((i for i, e in enumerate(head) if isinstance(e, EpisodeStart)), None)
    if at is None:
        raise ConfigError(f"{wl.name}: the workload has no EpisodeStart to record the builder in")
    head[at] = dataclasses.replace(head[at], context=builder.describe())
    log.extend(head)
    times = []
    for turn in wl.turns:
        t0 = time.perf_counter()
        ctx = builder.build(log)
        times.append(time.perf_counter() - t0)
        step = dataclasses.replace(turn[0], context_hash=ctx.hash, context_length=ctx.n_tokens)
        log.extend([step, *turn[1:]])
    return times, tuple(log.events())


def replay_pass(tok: Any, tpl: Any, events: Sequence[Event], *, reference: bool) -> tuple[list[float], bool]:
    """Replay every step of `events` (caches cold at the start), keeping no result (as `live_pass` keeps no
    context: kept contexts would only add collector time); returns (seconds per step, every step verified)."""
    cold_start(tok)
    times, ok = [], True
    it = replay_steps(events, tokenizer=tok, template=tpl, reference=reference)
    while True:
        t0 = time.perf_counter()
        r = next(it, None)
        if r is None:
            break
        times.append(time.perf_counter() - t0)
        ok = ok and r.ok
    return times, ok and bool(times)


def identical_to_reference(tok: Any, tpl: Any, events: Sequence[Event]) -> bool:
    """The new replay's results equal the reference's, step by step (`result_key`); untimed."""
    new = replay_steps(events, tokenizer=tok, template=tpl)
    ref = replay_steps(events, tokenizer=tok, template=tpl, reference=True)
    sentinel = object()
    for a, b in zip_longest(new, ref, fillvalue=sentinel):
        if a is sentinel or b is sentinel or result_key(a) != result_key(b):
            return False
    return True


def run_arm(tok: Any, tpl: Any, compressor: str, budget: int, wl: Workload, repeats: int, say) -> ReplayArm:
    """The three timings of one compressor (see the module docstring)."""
    live, new, ref = [], [], []
    events: tuple[Event, ...] = ()
    all_ok = True
    for rep in range(repeats):
        times, events = live_pass(tok, tpl, compressor, budget, wl)
        live.append(times)
        times, ok = replay_pass(tok, tpl, events, reference=False)
        new.append(times)
        all_ok = all_ok and ok
        ref.append(replay_pass(tok, tpl, events, reference=True)[0])
        say(f"{compressor}: repeat {rep + 1}/{repeats}: live {sum(live[-1]):.2f}s, replay {sum(new[-1]):.2f}s, "
            f"reference {sum(ref[-1]):.2f}s")
    t_live, t_new, t_ref = summarize_times(live), summarize_times(new), summarize_times(ref)
    ratio = (lambda t: t.total_s / t_live.total_s if t_live.total_s else None)
    return ReplayArm(compressor=compressor, steps=len(new[-1]), live=t_live, replay=t_new, reference=t_ref,
                     compactions=sum(isinstance(e, Compaction) for e in events),
                     replay_vs_live=ratio(t_new), reference_vs_live=ratio(t_ref), all_ok=all_ok,
                     identical=identical_to_reference(tok, tpl, events))


def run(tokenizer_spec: Any, turns: int = 200, budget: int = 16_000, compressors: Sequence[str] = DEFAULT_COMPRESSORS,
        repeats: int = 3, progress=None) -> ReplayBenchResult:
    """Time live build, replay and the reference replay of the synthetic episode of `turns` turns at
    `budget`, for each compressor (see the module docstring)."""
    if repeats < 1 or budget < 1 or turns < 1:
        raise ConfigError(f"replay bench: turns, budget and repeats must be at least 1 (got {turns}, {budget}, {repeats})")
    tok = load_tokenizer(tokenizer_spec)
    tpl = load_template(None, tok)
    wl = synthetic_workload(turns, tok, tpl)
    say = progress or (lambda msg: None)
    arms = [run_arm(tok, tpl, name, budget, wl, repeats, say) for name in compressors]
    return ReplayBenchResult(tokenizer=tok.id, template=tpl.id, episode=wl.name, turns=turns, budget=budget,
                             repeats=repeats, arms=arms)


def replay_table(result: ReplayBenchResult) -> str:
    """One row per compressor and pass: total, ratio against live, p50/p90/p99/max per step."""
    header = ["compressor", "pass", "total s", "vs live", "p50 ms", "p90 ms", "p99 ms", "max ms", "steps",
              "compactions", "ok", "identical"]
    rows = []
    for a in result.arms:
        for name, t, ratio in (("live build", a.live, 1.0), ("replay", a.replay, a.replay_vs_live),
                               ("reference replay", a.reference, a.reference_vs_live)):
            rows.append([a.compressor, name, f"{t.total_s:.3f}", "-" if ratio is None else f"{ratio:.2f}x",
                         f"{t.p50_ms:.2f}", f"{t.p90_ms:.2f}", f"{t.p99_ms:.2f}", f"{t.max_ms:.2f}", str(a.steps),
                         str(a.compactions),
                         str(a.all_ok) if name == "replay" else "", str(a.identical) if name == "replay" else ""])
    head = (f"replay bench: {result.episode}, budget {result.budget}, per-step medians of {result.repeats} repeats; "
            f"tokenizer {result.tokenizer}, template {result.template}; target replay <= {TARGET}x live")
    return head + "\n" + table(header, rows, left=(0, 1))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run once and print the table (or `--json`); exit 1 when a replay fails to verify or to
    match the reference."""
    parser = argparse.ArgumentParser(prog="python -m ctxkit.benchmarks.replay_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", default=None, help="tokenizer spec (default: ../shared/tokenizers/qwen2.5-instruct)")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--budget", type=int, default=16_000)
    parser.add_argument("--compressors", default=",".join(DEFAULT_COMPRESSORS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    spec = args.tokenizer or str(shared_dir() / "tokenizers" / "qwen2.5-instruct")
    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr))
    result = run(spec, turns=args.turns, budget=args.budget, compressors=tuple(args.compressors.split(",")),
                 repeats=args.repeats, progress=progress)
    if args.json:
        sys.stdout.write(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(replay_table(result))
    return 0 if result.ok else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
