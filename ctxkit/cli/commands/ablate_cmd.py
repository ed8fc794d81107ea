"""`ctxkit ablate` and `ctxkit report`: run an A/B compression experiment, re-render its report (thin)."""

from __future__ import annotations

import argparse
import sys


def register_ablate(subparsers) -> None:
    """Add `ctxkit ablate CONFIG --out DIR [--executor local|ray] [--workers N] [--address ADDR]`."""
    parser = subparsers.add_parser(
        "ablate", help="run an A/B compression experiment (paired grid of arms x tasks x seeds)",
        description="Run every arm of CONFIG (a TOML experiment) on every task and seed, writing one event log "
                    "per episode under DIR/episodes/, one row per episode to DIR/results.jsonl, and DIR/report.md "
                    "with plots. Rerunning into the same DIR resumes: finished episodes are kept.")
    parser.add_argument("config", metavar="CONFIG", help="experiment config (.toml)")
    parser.add_argument("--out", required=True, metavar="DIR", help="run folder (created; reused to resume)")
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="local processes (default) or Ray")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="parallel episodes (local processes, or CPUs of a local Ray); default 1")
    parser.add_argument("--address", default=None, metavar="ADDR",
                        help="Ray cluster address (ray.init(address=ADDR)); default: start a local Ray")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--validate-only", action="store_true", help="check the config (nothing runs) and exit")
    parser.set_defaults(func=_ablate)


def _ablate(args: argparse.Namespace) -> int:
    from ctxkit.experiment.config import load_config  # lazy: per command: keeps `ctxkit --help` fast
    # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.experiment.runner import RunInterrupted, run_experiment, validate

    config = load_config(args.config)
    if args.validate_only:
        validate(config)
        print(f"{args.config}: ok ({len(config.episodes())} episodes: {len(config.arms)} arms x "
              f"{len(config.tasks)} tasks x {len(config.seeds)} seeds)")
        return 0
    try:
        summary = run_experiment(config, args.out, executor=args.executor, workers=args.workers, address=args.address,
                                 progress=not args.no_progress)
    except RunInterrupted as exc:  # Ctrl-C: finished rows are kept, a rerun resumes
        print(f"ctxkit: {exc}", file=sys.stderr)
        return 130
    print(f"{summary.total} episodes: {summary.ran} run, {summary.reused} reused"
          + (f", {len(summary.aborted_logs)} partial log(s) set aside" if summary.aborted_logs else ""))
    print(f"results: {summary.out_dir}/results.jsonl")
    print(f"report:  {summary.report}")
    return 0


def register_report(subparsers) -> None:
    """Add `ctxkit report DIR`."""
    parser = subparsers.add_parser(
        "report", help="re-render report.md and plots of an ablation run from its results.jsonl",
        description="Re-render DIR/report.md, DIR/quality_vs_tokens.png and DIR/latency_breakdown.png from "
                    "DIR/results.jsonl (and DIR/run.json for the baseline and bootstrap settings).")
    parser.add_argument("run_dir", metavar="DIR", help="run folder written by `ctxkit ablate`")
    parser.add_argument("--print", action="store_true", help="also print the report")
    parser.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from ctxkit.experiment.report import write_report  # lazy: per command: keeps `ctxkit --help` fast

    path = write_report(args.run_dir)
    if args.print:
        print(path.read_text(encoding="utf-8"))
    else:
        print(f"report: {path}")
    return 0
