"""`ctxkit replay LOG (--verify | --step K)` and `ctxkit samples LOG... [--compressor NAME --budget N]
-o out.parquet|out.jsonl` (thin)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ctxkit.cli.commands.argtypes import add_recorded_overrides, int_at_least, non_negative_int
from ctxkit.cli.commands.outputs import add_force
from ctxkit.cli.commands.token_view import LEGEND, ROLE_STYLES, drift_summary, print_drifts, print_tokens


def register_replay(subparsers: Any) -> None:
    """Add `ctxkit replay`."""
    p = subparsers.add_parser(
        "replay",
        help="rebuild step contexts from a saved log and verify them against the recorded hashes",
        description="Rebuild contexts from the saved log alone (recorded compactions, summaries, retrieval "
        "results; recorded tokenizer and template) and check them against each step's recorded hash.",
    )
    p.add_argument("log", help="episode log (.jsonl)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--verify", action="store_true", help="check every step; exit 0 only if all match")
    mode.add_argument("--step", type=int, metavar="K", help="show step K's rebuilt context (0-based; -1 = last)")
    add_recorded_overrides(p)
    p.add_argument("--allow-hash-mismatch", action="store_true",
                   help="replay even when the tokenizer/template id differs from the recorded one")
    p.add_argument("--max-tokens", type=non_negative_int, default=None, metavar="N", help="with --step: show only the first N tokens")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_replay)


def _recorded_tokenizer(log: str) -> str:
    from ctxkit.events import EpisodeStart  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.log.event_log import read_events  # lazy: per command: keeps `ctxkit --help` fast

    start = next(e for e in read_events(log) if isinstance(e, EpisodeStart))
    return start.context["tokenizer"]["spec"]


def _result_dict(r: Any) -> dict[str, Any]:
    out = {"step": r.index, "seq": r.step.seq, "ok": r.ok, "expected_hash": r.expected_hash, "got_hash": r.got_hash,
           "n_tokens": len(r.token_ids), "error": r.error, "warnings": list(r.warnings)}
    if r.mismatch is not None:
        out["mismatch"] = dict(vars(r.mismatch), suspect_events=list(r.mismatch.suspect_events))
    return out


def _replay(args: argparse.Namespace) -> int:
    from ctxkit.training.context_replay import replay, verify_log  # lazy: per command: keeps `ctxkit --help` fast

    kw = dict(tokenizer=args.tokenizer, template=args.template, allow_hash_mismatch=args.allow_hash_mismatch)
    if args.verify:
        result = verify_log(args.log, **kw)
        if args.json:
            print(json.dumps({"ok": result.ok, "n_steps": result.n_steps, "n_ok": result.n_ok,
                              "steps": [_result_dict(r) for r in result.results]}, indent=2))
        else:
            for w in (result.results[0].warnings if result.results else ()):
                print(f"warning: {w}", file=sys.stderr)
            for r in result.results:
                if not r.ok:
                    print(r.describe())
            status = "ok" if result.ok else "FAILED"
            print(f"{args.log}: {result.n_ok}/{result.n_steps} steps verify: {status}")
        return 0 if result.ok else 1
    r = replay(args.log, step=args.step, **kw)
    if args.json:
        out = _result_dict(r)
        out["token_ids"] = list(r.token_ids)
        print(json.dumps(out))
    else:
        print(r.describe())
        if r.context is not None:
            from ctxkit.text.tokenizer.loader import load_tokenizer  # lazy: per command: keeps `ctxkit --help` fast

            _show_context(r.context, load_tokenizer(args.tokenizer or _recorded_tokenizer(args.log)), args.max_tokens)
    return 0 if r.ok else 1


def _show_context(ctx: Any, tokenizer: Any, max_tokens: int | None) -> None:
    """Show a rebuilt context as `ctxkit inspect` shows a render (its role colors, loss-masked tokens bold
    and underlined, special tokens reversed), then each message's provenance (verbatim, masked, summary...)."""
    from collections import Counter  # lazy: per command: keeps `ctxkit --help` fast

    from rich.console import Console  # lazy: per command: keeps `ctxkit --help` fast
    from rich.table import Table  # lazy: per command: keeps `ctxkit --help` fast
    from rich.text import Text  # lazy: per command: keeps `ctxkit --help` fast

    rendered = ctx.rendered
    console = Console(highlight=False)
    print_tokens(console, tokenizer, ctx.token_ids, rendered.roles, ctx.loss_mask, max_tokens)
    table = Table(title=f"{ctx.n_tokens} tokens, {len(ctx.view.messages)} messages", title_justify="left")
    for col in ("#", "role", "how", "events", "tokens", "loss-masked"):
        table.add_column(col, justify="right" if col in ("#", "tokens", "loss-masked") else "left")
    for span in rendered.spans:
        msg = ctx.view.messages[span.index]
        events = ", ".join(msg.provenance.event_ids[:4]) + (" ..." if len(msg.provenance.event_ids) > 4 else "")
        table.add_row(str(span.index), Text(msg.role, style=ROLE_STYLES.get(msg.role, "")), msg.provenance.how, events,
                      str(span.end - span.start), str(sum(ctx.loss_mask[span.start:span.end])))
    console.print(table)
    counts = Counter(rendered.roles)
    console.print("tokens by role: " + ", ".join(f"{r} {counts[r]}" for r in ROLE_STYLES if counts.get(r)))
    console.print(f"tokenizer {rendered.tokenizer_id}  ·  template {rendered.template_id}  ·  "
                  f"drifts {drift_summary(rendered.drifts)}", soft_wrap=True)
    print_drifts(console, tokenizer, rendered.drifts)
    console.print(f"hash {ctx.hash}")
    console.print(LEGEND)


SAMPLE_SUFFIXES = (".parquet", ".jsonl", ".ndjson")
"""Output suffixes `ctxkit samples -o` writes (Parquet, or JSON lines)."""


def register_samples(subparsers: Any) -> None:
    """Add `ctxkit samples`."""
    p = subparsers.add_parser(
        "samples",
        help="turn episode logs into training samples (Parquet or JSONL)",
        description="Rebuild and verify every step's context, merge steps whose contexts extend each other, "
        "and write one row per training sample (shared prefixes stored once; see ctxkit.training.sample_files).",
    )
    p.add_argument("logs", nargs="+", help="episode logs (.jsonl) or run folders holding them")
    p.add_argument("-o", "--output", required=True, help="output file: .parquet or .jsonl")
    p.add_argument("--inline-prefixes", action="store_true", help="store every row's full tokens (no shared prefixes)")
    add_recorded_overrides(p)
    p.add_argument("--compressor", metavar="NAME",
                   help="rebuild every step's context under this compressor (on an in-memory copy; the logs are only "
                   "read) and write the samples a policy would have been trained on had it seen those contexts")
    p.add_argument("--budget", type=int_at_least(1), metavar="N", help="with --compressor: context budget in tokens")
    p.add_argument("--params", metavar="JSON", help="with --compressor: compressor parameters as a JSON object")
    p.add_argument("--reserve-tokens", type=non_negative_int, default=0, metavar="N",
                   help="with --compressor: tokens of the budget kept free for the response")
    p.add_argument("--detect-pins", action="store_true", help="with --compressor: run the constraint detector in the rebuild")
    p.add_argument("--on-overflow", choices=("error", "truncate"), default=None,
                   help="with --compressor: a step whose context cannot fit the budget is an error (default), or "
                        "ends its episode there as truncated (cause context_budget, no reward)")
    add_force(p)
    p.set_defaults(func=_samples)


def _samples(args: argparse.Namespace) -> int:
    from ctxkit.training.preflight import find_logs  # lazy: per command: keeps `ctxkit --help` fast
    # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.cli.commands.outputs import atomic_output, check_output, safe_text, shown
    from ctxkit.errors import ConfigError, ReplayError  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.training.sample_files import write_samples  # lazy: per command: keeps `ctxkit --help` fast
    # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.training.episode_samples import compressed_samples, samples, split_statistics

    rebuild = _rebuild_options(args)
    out = check_output(args.output, "-o", probe=True, force=args.force)
    if out.suffix.lower() not in SAMPLE_SUFFIXES:
        raise ConfigError(f"-o {args.output}: unknown format {out.suffix or '(no suffix)'}; use .parquet or .jsonl")
    if out.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet  # noqa: F401  # lazy: per command: keeps `ctxkit --help` fast
        except ImportError as exc:
            from ctxkit.context.models import MissingExtraError  # lazy: per command: keeps `ctxkit --help` fast

            raise MissingExtraError("pyarrow", "export", f"ctxkit samples -o {args.output} (Parquet)") from exc
    logs, skipped = find_logs(args.logs)
    if not logs:
        found = f" (only {len(skipped)} other .jsonl file(s), not ctxkit logs)" if skipped else ""
        raise ConfigError(f"no episode logs found in {', '.join(args.logs)}{found}")
    rows = []
    empty = 0
    for path in logs:
        try:
            if rebuild is None:
                rows += samples(str(path), tokenizer=args.tokenizer, template=args.template)
            else:
                got = compressed_samples(str(path), tokenizer=args.tokenizer, template=args.template, **rebuild)
                empty += not got
                rows += got
        except (ConfigError, ReplayError) as exc:  # name the log unless the message already does
            if type(exc) not in (ConfigError, ReplayError) or str(exc).startswith(str(path)):
                raise
            raise type(exc)(f"{path}: {exc}") from None
    with atomic_output(args.output, "-o", replace=args.force) as tmp:
        info = {"sources": [safe_text(str(p)) for p in logs]}
        if rebuild is not None:
            info.update(rebuild=rebuild)
        write_samples(rows, tmp, inline_prefixes=args.inline_prefixes, info=info)
    n_tok = sum(len(s.token_ids) for s in rows)
    n_loss = sum(s.n_sampled for s in rows)
    print(f"{shown(args.output)}: {len(rows)} samples from {len(logs)} log(s), {n_tok} tokens, {n_loss} loss-bearing")
    stats = split_statistics(rows)
    by = ", ".join(f"{r} {n}" for r, n in stats["splits_by_reason"].items() if n)
    print(f"{stats['splits']} split(s) within episodes" + (f" ({by})" if by else ""))
    if rebuild is not None and rebuild["on_overflow"] == "truncate":
        cut = sorted({s.episode_id for s in rows if s.cause == "context_budget"})
        print(f"{len(cut)} episode(s) cut where a context could not fit {rebuild['budget']} tokens (outcome truncated, "
              f"cause context_budget, no reward); {empty} log(s) gave no sample (their first context did not fit)")
    if rebuild is not None:
        n_comp = sum(1 for s in rows for c in s.compactions if c.get("kind") == "compaction")
        print(f"rebuilt under {rows[0].compressor if rows else rebuild['compressor']}: {n_comp} compaction(s) "
              "(recorded in the samples' metadata; the logs are unchanged)")
    return 0


def _rebuild_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The `compressed_samples` keywords of `--compressor/--budget/...`, or None without `--compressor`."""
    from ctxkit.errors import ConfigError  # lazy: per command: keeps `ctxkit --help` fast

    if args.compressor is None:
        used = [flag for flag, value in (("--budget", args.budget), ("--params", args.params),
                                          ("--reserve-tokens", args.reserve_tokens), ("--detect-pins", args.detect_pins),
                                          ("--on-overflow", args.on_overflow)) if value]
        if used:
            raise ConfigError(f"{', '.join(used)} only apply with --compressor NAME")
        return None
    if args.budget is None:
        raise ConfigError(f"--compressor {args.compressor} needs --budget N (tokens)")
    params: Any = {}
    if args.params is not None:
        try:
            params = json.loads(args.params)
        except ValueError as exc:
            raise ConfigError(f"--params {args.params!r}: not JSON ({exc})") from None
        if not isinstance(params, dict):
            raise ConfigError(f"--params {args.params!r}: expected a JSON object")
    return {"compressor": args.compressor, "budget": args.budget, "params": params,
            "reserve_tokens": args.reserve_tokens, "detect_pins": args.detect_pins,
            "on_overflow": args.on_overflow or "error"}
