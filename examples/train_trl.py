"""Train SmolLM2-135M-Instruct with TRL on ctxkit episodes, end to end on a CPU in a few minutes.

1. episodes: the scripted agent works `calculator-chain` worksheets; every context is built by a ctxkit
   `ContextBuilder` and every event logged (`ctxkit.integrations.trl.run_tool_episode`);
2. samples: `ctxkit samples` replays the logs (hash-checked) and writes `samples.jsonl`;
3. SFT: `sft_dataset` feeds TRL's `SFTTrainer` (loss on the agent's tokens only), on a trainable copy of
   the GGUF model (`trainable_copy`);
4. GRPO: `EpisodeRollout` is TRL's `rollout_func`: the fine-tuned model itself samples new tool episodes;
5. reference step: one off-policy `reference_step` (with TIS) on the GRPO episodes.

Writes only under `--out` (default: a new temporary folder) and prints the measured numbers, also saved
as `summary.json`. Run from a checkout: `python examples/train_trl.py --out runs/train-trl`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ctxkit.errors import ConfigError, CtxkitError

TASK = "calculator-chain"
TASK_PARAMS = {"n_steps": 2, "lag": 1, "lines_per_file": 2}
"""A short worksheet (two multiplications, then the question): 6 agent turns per episode."""
TEMPLATE = "chatml-tools-v1"
WRITES = ("episodes", "samples.jsonl", "sft", "grpo", "summary.json")
"""Everything the script writes inside `--out` (what `--force` replaces)."""


def default_tokenizer() -> Path:
    """The SmolLM2 tokenizer folder of the shared fixtures: `$CTXKIT_SHARED` or `../shared` beside the checkout."""
    shared = os.environ.get("CTXKIT_SHARED") or Path(__file__).resolve().parent.parent.parent / "shared"
    return Path(shared) / "tokenizers" / "smollm2-135m-instruct"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see `--help`)."""
    p = argparse.ArgumentParser(prog="train_trl.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", metavar="DIR", help="output folder (default: a new temporary folder); an existing "
                   "non-empty one is refused unless --force")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out, replacing this script's "
                   f"earlier outputs there ({', '.join(WRITES)}); other files are left alone")
    p.add_argument("--tokenizer", metavar="DIR", default=None,
                   help="the SmolLM2 tokenizer folder contexts are built with (default: $CTXKIT_SHARED/tokenizers/"
                   "smollm2-135m-instruct, or ../shared/... beside the checkout)")
    p.add_argument("--episodes", type=int, default=2, metavar="N", help="scripted episodes for SFT (default 2)")
    p.add_argument("--sft-steps", type=int, default=2, metavar="N", help="SFT optimizer steps (default 2)")
    p.add_argument("--grpo-steps", type=int, default=1, metavar="N",
                   help="GRPO steps, 2 sampled episodes each (default 1; 0 skips GRPO and the reference step)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="torch CPU threads (default 1: on a loaded "
                   "2-core machine one thread trained twice as fast as two; 0 keeps torch's default)")
    args = p.parse_args(argv)
    if args.threads < 0:
        raise ConfigError(f"--threads {args.threads}: must be >= 0")
    for name in ("episodes", "sft_steps"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    if args.grpo_steps < 0:
        raise ConfigError(f"--grpo-steps {args.grpo_steps}: must be >= 0")
    return args


def prepare_out(out: str | None, force: bool) -> Path:
    """The output folder, created; an existing non-empty one is refused unless `force` (ctxkit's overwrite rule)."""
    if out is None:
        return Path(tempfile.mkdtemp(prefix="ctxkit-train-trl-"))
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {out}: is a file; expected a folder")
    if path.is_dir() and any(path.iterdir()):
        if not force:
            raise ConfigError(f"--out {out}: already exists and is not empty; pass --force to replace its outputs, "
                              "or choose a new folder")
        for name in WRITES:
            old = path / name
            if old.is_dir():
                shutil.rmtree(old)
            elif old.exists():
                old.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


# ------------------------------------------------------------------------------------------- 1. episodes


def scripted_episodes(out: Path, tok, n: int) -> list[Path]:
    """`n` logged episodes of the scripted agent on `TASK` (seeds 1..n), contexts built by ctxkit."""
    from ctxkit.context.builder import ContextBuilder
    from ctxkit.experiment.agents.scripted import ScriptedAgent
    from ctxkit.experiment.tasks.base import make_task
    from ctxkit.integrations.trl import run_tool_episode

    task = make_task(TASK, TASK_PARAMS)
    agent = ScriptedAgent(tokenizer=tok, template=TEMPLATE, task=TASK)
    logs = []
    for seed in range(1, n + 1):
        builder = ContextBuilder(tok, template=TEMPLATE, compressor="keep-all", budget=4096, detect_pins=False)
        with tempfile.TemporaryDirectory(prefix="ctxkit-task-") as workdir:  # the task's files (worksheet)
            logs.append(run_tool_episode(out / "episodes" / f"{TASK}-{seed}.jsonl", task=task, seed=seed,
                                         builder=builder, agent=agent, max_steps=12,
                                         episode_id=f"{TASK}-{seed}", workdir=workdir))
    return logs


# ------------------------------------------------------------------------------------------------ 3. SFT


def run_sft(model, hf_tokenizer, samples_path: Path, out: Path, steps: int, device: str) -> dict:
    """TRL SFT on `ctxkit samples` output; the batch is the whole dataset, so each step's loss is comparable."""
    from trl import SFTConfig, SFTTrainer

    from ctxkit.integrations.trl import sft_dataset

    dataset = sft_dataset(samples_path)  # rows {"input_ids", "labels"}: -100 off ctxkit's loss mask
    args = SFTConfig(output_dir=str(out / "sft"), max_steps=steps, per_device_train_batch_size=len(dataset),
                     learning_rate=1e-4, lr_scheduler_type="constant", max_length=None, logging_steps=1,
                     save_strategy="no", report_to=[], use_cpu=device == "cpu", seed=0, dataloader_num_workers=0,
                     bf16=False,  # TRL's default autocasts to bfloat16, also on a CPU (several times slower there)
                     gradient_checkpointing=False)  # TRL turns it on by default: pure cost for a 135M model
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=hf_tokenizer)
    with contextlib.redirect_stdout(sys.stderr):  # TRL's per-step logs: stdout keeps the report
        trainer.train()
    losses = [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]
    return {"steps": trainer.state.global_step, "samples": len(dataset), "losses": losses,
            "loss_tokens": sum(lab != -100 for row in dataset for lab in row["labels"]),
            "tokens": sum(len(row["input_ids"]) for row in dataset)}


# ----------------------------------------------------------------------------------------------- 4. GRPO


def tool_call_reward(completions=None, ctxkit_log=(), **kwargs) -> list[float]:
    """0.1 per tool call that ran (a `ToolResult` with status ok in the episode's log): a shaping reward, so
    a group's advantages are not all 0 when short episodes end before they are scored."""
    from ctxkit.events import ToolResult
    from ctxkit.log import read_events

    return [0.1 * sum(isinstance(e, ToolResult) and e.status == "ok" for e in read_events(path)) for path in ctxkit_log]


def run_grpo(model, hf_tokenizer, tok, out: Path, steps: int, device: str) -> dict:
    """TRL GRPO whose rollouts are ctxkit tool episodes sampled by the model being trained."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from ctxkit.integrations.trl import EpisodeRollout, reward_func

    rollout = EpisodeRollout(task=TASK, task_params=TASK_PARAMS, out_dir=out / "grpo" / "episodes", tokenizer=tok,
                             template=TEMPLATE, compressor="keep-all", budget=4096, max_steps=2, max_new_tokens=40)
    args = GRPOConfig(output_dir=str(out / "grpo"), max_steps=steps, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=40, learning_rate=1e-5, beta=0.0, logging_steps=1, save_strategy="no",
                      report_to=[], use_cpu=device == "cpu", seed=0, dataloader_num_workers=0, bf16=False,
                      gradient_checkpointing=False)
    trainer = GRPOTrainer(model=model, args=args, reward_funcs=[reward_func(unscored=0.0), tool_call_reward],
                          train_dataset=Dataset.from_list([{"prompt": str(seed)} for seed in range(101, 101 + steps)]),
                          processing_class=hf_tokenizer, rollout_func=rollout)
    with contextlib.redirect_stdout(sys.stderr):  # TRL's per-step logs: stdout keeps the report
        trainer.train()
    rewards = [float(h["reward"]) for h in trainer.state.log_history if "reward" in h]
    return {"steps": trainer.state.global_step, "episodes": [str(p) for p in rollout.logs], "mean_rewards": rewards}


# -------------------------------------------------------------------------------------- 5. reference step


def run_reference_step(model, logs: list[str]) -> dict:
    """One clipped policy-gradient step with TIS on the GRPO episodes (now off-policy: GRPO updated the model)."""
    import torch

    from ctxkit.training.episode_samples import samples
    from ctxkit.training.reference_step import LossConfig, reference_step

    batch, rewards = [], []
    for log in logs:
        got = samples(log)  # replayed and hash-checked; keep-all: one sample per episode
        shaped = tool_call_reward(ctxkit_log=[log])[0]
        batch += got
        rewards += [(s.reward or 0.0) + shaped for s in got]  # the rewards GRPO used
    advantages = [r - sum(rewards) / len(rewards) for r in rewards]  # centred over the batch: one GRPO-style group
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    stats = reference_step(model, opt, batch, LossConfig(clip_low=0.2, clip_high=0.28, tis_clip=2.0),
                           advantages=advantages)
    return {"samples": len(batch), "loss": stats.loss, "n_actions": stats.n_actions, "mean_ratio": stats.mean_ratio,
            "mean_tis_weight": stats.mean_tis_weight}


# ------------------------------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> dict:
    """The whole recipe; returns the summary."""
    from ctxkit.cli.parser import main as ctxkit_main
    from ctxkit.context.models import load_causal_lm
    from ctxkit.integrations.trl import trainable_copy
    from ctxkit.text.tokenizer.loader import load_tokenizer

    tokenizer_dir = Path(args.tokenizer) if args.tokenizer else default_tokenizer()
    if not tokenizer_dir.is_dir():
        raise ConfigError(f"--tokenizer {tokenizer_dir}: no such folder; set CTXKIT_SHARED to the shared fixtures "
                          "or pass --tokenizer DIR")
    out = prepare_out(args.out, args.force)
    t0 = time.perf_counter()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    seconds = {}

    def lap(name: str, since: float) -> float:
        seconds[name] = round(time.perf_counter() - since, 1)
        return time.perf_counter()

    tok = load_tokenizer(str(tokenizer_dir))
    logs = scripted_episodes(out, tok, args.episodes)
    samples_path = out / "samples.jsonl"
    if ctxkit_main(["samples", *map(str, logs), "-o", str(samples_path)]) != 0:
        raise ConfigError(f"ctxkit samples failed on {out / 'episodes'}")
    t = lap("episodes_and_samples", t0)
    lm = load_causal_lm(device=args.device, dtype="float32")  # SmolLM2 GGUF, dequantized to float32
    model = trainable_copy(lm.model)  # drops the GGUF quantizer marks TRL's Trainer refuses
    t = lap("load_model", t)
    summary = {"out": str(out), "episodes": [str(p) for p in logs], "samples_file": str(samples_path),
               "sft": run_sft(model, lm.hf_tokenizer, samples_path, out, args.sft_steps, args.device)}
    t = lap("sft", t)
    if args.grpo_steps:
        summary["grpo"] = run_grpo(model, lm.hf_tokenizer, tok, out, args.grpo_steps, args.device)
        t = lap("grpo", t)
        summary["reference_step"] = run_reference_step(model, summary["grpo"]["episodes"])
        t = lap("reference_step", t)
    summary["seconds"] = seconds
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def report(summary: dict) -> str:
    """The printed numbers."""
    sft = summary["sft"]
    lines = [f"episodes: {len(summary['episodes'])} scripted {TASK} logs -> {sft['samples']} samples, "
             f"{sft['tokens']} tokens, {sft['loss_tokens']} loss-bearing",
             f"sft: {sft['steps']} steps, loss {sft['losses'][0]:.4f} -> {sft['losses'][-1]:.4f}"]
    if "grpo" in summary:
        grpo, ref = summary["grpo"], summary["reference_step"]
        lines.append(f"grpo: {grpo['steps']} step(s), {len(grpo['episodes'])} sampled episodes, mean reward "
                     + ", ".join(f"{r:.3f}" for r in grpo["mean_rewards"]))
        lines.append(f"reference step: {ref['samples']} samples, {ref['n_actions']} action tokens, "
                     f"loss {ref['loss']:.4f}, mean ratio {ref['mean_ratio']:.4f}, mean TIS weight {ref['mean_tis_weight']:.4f}")
    lines.append(f"wrote {summary['out']} in {summary['wall_s']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 on success, 2 with one `train_trl: error:` line on bad input."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        summary = run(parse_args(argv))
    except CtxkitError as exc:
        print(f"train_trl: error: {exc}", file=sys.stderr)
        return 2
    print(report(summary))
    if not all(math.isfinite(x) for x in summary["sft"]["losses"]):
        print("train_trl: error: a non-finite SFT loss", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
