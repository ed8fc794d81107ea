"""`ctxkit train sft CONFIG --out DIR`: behaviour cloning from ctxkit's own samples; `ctxkit train grpo CONFIG
--out DIR`: GRPO under compression, one run per context policy or schedule (thin)."""

from __future__ import annotations

import argparse

from ctxkit.cli.commands.outputs import add_force


def register_train(subparsers) -> None:
    """Add `ctxkit train sft CONFIG --out DIR [--quick] [--force] [--no-progress] [--device cpu|cuda]` and
    `ctxkit train grpo CONFIG --out DIR [--quick] [--force]`."""
    train = subparsers.add_parser("train", help="train a policy on ctxkit samples (sft, grpo)",
                                  description="Train a policy on samples ctxkit made from its own episodes.")
    sub = train.add_subparsers(dest="train_command", metavar="KIND", required=True)
    sft = sub.add_parser(
        "sft", help="behaviour cloning: collect expert episodes, make samples, fine-tune with TRL",
        description="Run CONFIG's expert ablation into DIR/expert, turn every episode into ctxkit samples "
                    "(DIR/samples.parquet: loss on sampled assistant tokens only), fine-tune the model with TRL's "
                    "SFTTrainer (on CPU unless --device cuda), and save DIR/checkpoint, DIR/loss.png, DIR/train_log.jsonl and DIR/sft.json.")
    sft.add_argument("config", metavar="CONFIG", help="behaviour-cloning config (.toml), e.g. experiments/sft.toml")
    sft.add_argument("--out", required=True, metavar="DIR", help="run folder (created; its expert episodes are reused)")
    sft.add_argument("--quick", action="store_true", help="apply the config's [quick] table (a few minutes)")
    sft.add_argument("--no-progress", action="store_true", help="no progress bars")
    sft.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                     help="train on CPU (float32, the default) or CUDA (bfloat16 autocast)")
    add_force(sft)
    sft.set_defaults(func=_sft)
    grpo = sub.add_parser(
        "grpo", help="GRPO under compression: one run per context policy or schedule, compared at equal wall time",
        description="Train CONFIG's policy with GRPO once per [[runs]] entry (its compressor, pins and schedule), each "
                    "into DIR/<run>/ (episode logs and grpo_log.jsonl), then write DIR/report.md, DIR/grpo.json and "
                    "DIR/grpo.png: reward, samples per episode, tokens/s, lag and data age, per run and at equal wall time.")
    grpo.add_argument("config", metavar="CONFIG", help="GRPO config (.toml), e.g. experiments/grpo.toml")
    grpo.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    grpo.add_argument("--quick", action="store_true", help="apply the config's [quick] table (a few minutes)")
    add_force(grpo)
    grpo.set_defaults(func=_grpo)


def _sft(args: argparse.Namespace) -> int:
    from ctxkit.integrations.sft import run_sft  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.integrations.sft_config import load_sft_config  # lazy: per command: keeps `ctxkit --help` fast

    config = load_sft_config(args.config, quick=args.quick)
    result = run_sft(config, args.out, force=args.force, progress=not args.no_progress, device=args.device)
    first, last = (result.losses[0], result.losses[-1]) if result.losses else (float("nan"), float("nan"))
    print(f"{result.episodes} expert episodes -> {result.samples} samples ({result.left_out} over max_length left out), "
          f"{result.tokens} tokens, {result.loss_tokens} loss-bearing")
    print(f"{result.steps} steps in {result.train_s:.0f} s, {result.tokens_per_s:.0f} tokens/s; loss {first:.3f} -> {last:.3f}")
    print(f"checkpoint: {result.checkpoint}")
    return 0


def _grpo(args: argparse.Namespace) -> int:
    from ctxkit.integrations.grpo_config import load_grpo_config  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.integrations.grpo_runs import run_grpo_config  # lazy: per command: keeps `ctxkit --help` fast

    config = load_grpo_config(args.config, quick=args.quick)
    _, equal = run_grpo_config(config, args.out, force=args.force)
    for s in equal:
        print(f"{s.run}: {s.iterations} iterations in {s.until_s:.0f} s, mean reward {s.mean_reward:.3f}, "
              f"{s.loss_tokens_per_s:.1f} loss tokens/s")
    print(f"report: {args.out}/report.md")
    return 0
