"""`ctxkit compressors` and `ctxkit build`: list strategies, build contexts from a log (thin)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import orjson

from ctxkit.cli.commands.argtypes import add_render_options, non_negative_int, positive_int
from ctxkit.errors import ConfigError, LogFormatError


def register_compressors(subparsers) -> None:
    """Add `ctxkit compressors [--json]`."""
    parser = subparsers.add_parser(
        "compressors", help="list the registered compressors and their default parameters",
        description="List every registered compressor with its versioned name and default parameters.")
    parser.add_argument("--json", action="store_true", help="print {name: {version, params}} as JSON")
    parser.set_defaults(func=_compressors)


def _compressors(args: argparse.Namespace) -> int:
    # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.context.compress import COMPRESSORS, compressor_defaults, versioned_name

    defaults = compressor_defaults()
    out = {name: {"version": versioned_name(name), "params": defaults[name]} for name in COMPRESSORS}
    if args.json:
        sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    for name, entry in out.items():
        params = ", ".join(f"{k}={v!r}" for k, v in entry["params"].items())
        print(f"{entry['version']:<26} {params}")
    return 0


def register_build(subparsers) -> None:
    """Add `ctxkit build LOG --tokenizer T [--template S] --compressor NAME [--param k=v ...] --budget N ...`."""
    parser = subparsers.add_parser(
        "build", help="build the context(s) of a log under a compressor and budget",
        description="Build contexts from an episode log. Decision points are the positions before each "
                    "assistant turn (plus the next turn at the end of the log). Without --write the log is "
                    "not touched: builds run on an in-memory copy whose recorded compactions are dropped "
                    "(the chosen compressor decides afresh; pins are kept).")
    parser.add_argument("log", metavar="LOG", help="episode log (.jsonl)")
    add_render_options(parser, purpose="build with", required=True)
    parser.add_argument("--compressor", default="keep-all", help="registered compressor name (see `ctxkit compressors`)")
    parser.add_argument("--param", action="append", default=[], metavar="K=V",
                        help="compressor parameter; V is parsed as JSON when it can be, else kept as a string")
    parser.add_argument("--budget", type=positive_int, required=True, help="token budget of the final render")
    parser.add_argument("--reserve-tokens", type=non_negative_int, default=0, help="tokens of the budget kept for the response")
    parser.add_argument("--no-detect-pins", action="store_true", help="turn off the constraint detector (constraint-rules-v2)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=non_negative_int, default=None, metavar="K",
                       help="build only before assistant turn K (0-based; default: the next turn after the log)")
    which.add_argument("--all-steps", action="store_true", help="build at every decision point")
    parser.add_argument("--write", action="store_true",
                        help="build the next turn on the log itself, appending detected pins and the compaction")
    parser.add_argument("--json", action="store_true", help="one JSON object per decision point")
    parser.add_argument("--embedding-cache", default=None, metavar="DIR",
                        help="folder of the on-disk embedding cache (summarize, retrieve), shared with other builds "
                             "and runs that name it; e.g. a run's <run>/cache/embeddings (default: memory only)")
    parser.set_defaults(func=_build)


def parse_params(items: list[str]) -> dict[str, Any]:
    """`["k=v", ...]` -> dict; values parsed as JSON when possible."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {item!r}: expected KEY=VALUE")
        try:
            out[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            out[key] = value
    return out


def decision_points(events) -> list[int]:
    """Indices (into `events`) of every assistant turn: the events before each are one decision point."""
    from ctxkit.events import Message, Step  # lazy: per command: keeps `ctxkit --help` fast

    return [i for i, e in enumerate(events)
            if isinstance(e, Step) or (isinstance(e, Message) and e.role == "assistant")]


def _build(args: argparse.Namespace) -> int:
    from ctxkit.context.builder import ContextBuilder  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.context.embedding_cache import set_cache_dir  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.events import Compaction, EpisodeEnd  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.log.event_log import EventLog, MemoryLog, read_events  # lazy: per command: keeps `ctxkit --help` fast

    if args.embedding_cache is not None:
        set_cache_dir(args.embedding_cache)
    builder = ContextBuilder(args.tokenizer, args.template, args.compressor, args.budget,
                             params=parse_params(args.param), detect_pins=not args.no_detect_pins,
                             reserve_tokens=args.reserve_tokens)
    if args.write:
        if args.all_steps or args.step is not None:
            raise ConfigError("--write builds only the next turn of the log (it is append-only); drop --step/--all-steps")
        try:
            log = EventLog.open(args.log)
        except OSError as exc:  # e.g. a read-only file: say so instead of a traceback
            raise ConfigError(f"--write {args.log}: cannot open the log for appending: {exc.strerror or exc}") from None
        try:
            # build on an in-memory copy first: a build that fails (budget, pins) leaves the log untouched;
            # one that passes appends what it recorded (detected pins, the compaction) in one batch, with the
            # same seq and ids the copy gave them (ids ignore ts)
            recorded = log.events()
            _require_messages(recorded, args.log)
            memory = MemoryLog(recorded)
            ctx = builder.build(memory)
            log.extend(dataclasses.replace(e, seq=None, id=None, ts=None) for e in memory.events()[len(recorded):])
            _emit(args, 0, len(recorded), ctx)
        finally:
            log.close()
        return 0
    events = [e for e in read_events(args.log) if not isinstance(e, (Compaction, EpisodeEnd))]
    _require_messages(events, args.log)
    points = decision_points(events)
    targets = list(range(len(points) + 1))
    if args.step is not None:
        if not 0 <= args.step <= len(points):
            raise ConfigError(f"--step {args.step}: the log has {len(points)} assistant turn(s); choose 0..{len(points)}")
        targets = [args.step]
    elif not args.all_steps:
        targets = [len(points)]
    bounds = points + [len(events)]
    log = MemoryLog()
    fed = 0
    for k in range(max(targets) + 1):
        upto = bounds[k]
        log.adopt(events[fed:upto])
        fed = upto
        ctx = builder.build(log)
        if k in targets:
            _emit(args, k, fed, ctx)
    return 0


def _require_messages(events, path: str) -> None:
    """`LogFormatError` naming the log when it holds no chat message (nothing a context could be built from)."""
    from ctxkit.events import Message, Step, ToolResult  # lazy: per command: keeps `ctxkit --help` fast

    if not any(isinstance(e, (Message, Step, ToolResult)) for e in events):
        raise LogFormatError(f"the log holds no messages to build a context from ({len(events)} event(s), none a "
                             "message, step or tool result)", path=str(path))


def _emit(args: argparse.Namespace, step: int, n_events: int, ctx) -> None:
    if args.json:
        obj = {
            "step": step,
            "n_events_before": n_events,
            "n_tokens": ctx.n_tokens,
            "budget": ctx.budget,
            "token_ids": list(ctx.token_ids),
            "context_hash": ctx.hash,
            "view_hash": ctx.view.hash,
            "pins_checked": list(ctx.pins_checked),
            "appended": list(ctx.compactions),
            "truncated": ctx.truncated,
            "provenance": [[m.provenance.how, list(m.provenance.event_ids)] for m in ctx.view.messages],
        }
        sys.stdout.write(orjson.dumps(obj).decode() + "\n")
        return
    hows: dict[str, int] = {}
    for m in ctx.view.messages:
        hows[m.provenance.how] = hows.get(m.provenance.how, 0) + 1
    kinds = ", ".join(f"{n} {h}" for h, n in hows.items())
    print(f"step {step}: {ctx.n_tokens} tokens (budget {ctx.budget}), {len(ctx.view.messages)} messages ({kinds}), "
          f"{len(ctx.pins_checked)} pin(s) checked, context {ctx.hash[:12]}, view {ctx.view.hash[:12]}"
          + (" [TRUNCATED]" if ctx.truncated else ""))
