"""`ctxkit audit PATH... [--json] [--trained-at N]`: pre-flight checks over logs or run folders (thin)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ctxkit.cli.commands.argtypes import non_negative_int


def register_audit(subparsers: Any) -> None:
    """Add `ctxkit audit`."""
    p = subparsers.add_parser(
        "audit",
        help="pre-flight checks of episode logs before training (exit 1 when any check fails)",
        description="Run the five pre-flight checks (record, rewards, distributions, ends, resume) over logs "
        "or run folders, with counts, failing examples and token/time/lag figures.",
    )
    p.add_argument("paths", nargs="+", help="episode logs (.jsonl) or folders holding them")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--trained-at", type=int, metavar="VERSION", help="policy version being trained now (lag figures)")
    p.add_argument("--no-rebuild", action="store_true", help="skip replaying contexts in the record check")
    p.add_argument("--examples", type=non_negative_int, default=5, metavar="N", help="failing examples kept per check (default 5)")
    p.set_defaults(func=_audit)


def _audit(args: argparse.Namespace) -> int:
    from ctxkit.training.preflight import audit  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.errors import ConfigError  # lazy: per command: keeps `ctxkit --help` fast

    report = audit(args.paths, trained_at=args.trained_at, rebuild=not args.no_rebuild, max_examples=args.examples)
    if not report.paths:
        found = f" (only {len(report.skipped)} other .jsonl file(s), not ctxkit logs)" if report.skipped else ""
        raise ConfigError(f"no episode logs found in {', '.join(args.paths)}{found}")
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0 if report.ok else 1
    print(f"audited {len(report.paths)} log(s)" + (f", skipped {len(report.skipped)} other file(s)" if report.skipped else ""))
    for i, c in enumerate(report.checks, 1):
        mark = "PASS" if c.ok else "FAIL"
        print(f"[{mark}] {i}. {c.name}: {c.title} ({c.failed} of {c.checked} failing)")
        for f in c.examples:
            print(f"       - {f}")
        for f in c.warnings:
            print(f"       ~ warning: {f}")
    if report.offline:
        print(f"offline: {len(report.offline)} of {len(report.paths)} log(s) hold only offline steps (logprob_kind 'none', "
              "no behaviour log-probs): usable for supervised training, not for importance-weighted RL")
    print("figures:")
    for key, value in report.figures.items():
        print(f"  {key}: {json.dumps(value) if isinstance(value, dict) else value}")
    print("audit: ok" if report.ok else "audit: FAILED")
    return 0 if report.ok else 1
