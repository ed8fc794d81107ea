"""Behaviour cloning from ctxkit's own samples: `ctxkit train sft CONFIG --out DIR`.

1. Collect: the config's expert ablation (`collect`, an ordinary ablation config: the scripted agent over the
   training seeds, under a mix of arms so the policy sees masked placeholders, truncated outputs, the pinned
   block, summaries and retrieved blocks) runs into `DIR/expert` (resumable like any run folder); a second
   and third collection, pooled with it, into `DIR/expert-2`, `DIR/expert-3`.
2. Samples: every episode becomes ctxkit samples (`ctxkit.training.samples`: contexts replayed and
   hash-checked, loss on the sampled assistant tokens only, a new sample where history was rewritten),
   written to `DIR/samples.parquet`; rows for TRL are `{"input_ids", "labels"}` with labels -100 off the
   loss mask (`ctxkit.integrations.trl.sample_record`). Samples over `max_length` are left out and counted.
3. Train: the model (default SmolLM2-135M-Instruct, its GGUF dequantized to float32 and made trainable by
   `trainable_copy`; LoRA through `peft` when configured, merged before saving) is fine-tuned by TRL's
   `SFTTrainer`, which uses the labels as given (on CPU in float32 by default; `device="cuda"` keeps float32
   weights under bfloat16 autocast). `DIR/checkpoint` holds the model and its tokenizer (a
   folder the `transformers` agent loads: `model_path = "DIR/checkpoint"`), `DIR/train_log.jsonl` the loss
   per optimizer step, `DIR/loss.png` the curve, `DIR/sft.json` the run's figures (`SftResult.to_dict`).

The held-out seeds (`eval_seeds`) are checked disjoint from the collection seeds when the config loads.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ctxkit.context.models import MissingExtraError, load_causal_lm
from ctxkit.errors import ConfigError
from ctxkit.experiment.runner import read_rows, run_experiment
from ctxkit.integrations.sft_config import SftConfig, TrainSpec
from ctxkit.integrations.trl import sample_record, trainable_copy
from ctxkit.training.episode_samples import TrainingSample, samples
from ctxkit.training.sample_files import write_samples

DEVICES: tuple[str, ...] = ("cpu", "cuda")
"""Devices `ctxkit train sft` trains on."""

__all__ = ["DEVICES", "SftResult", "collect_samples", "expert_folder", "fitting", "run_sft", "sft_rows", "train_sft"]


@dataclass(frozen=True)
class SftResult:
    """What one behaviour-cloning run did, with its measured figures."""

    out_dir: str
    """The run folder."""
    checkpoint: str
    """The saved model folder."""
    episodes: int
    """Expert episodes collected."""
    samples: int
    """Samples trained on."""
    left_out: int
    """Samples over `max_length`, not trained on."""
    tokens: int
    """Tokens of the samples trained on (one pass)."""
    loss_tokens: int
    """Loss-bearing (sampled assistant) tokens among them."""
    steps: int
    """Optimizer steps run."""
    losses: tuple[float, ...]
    """Training loss per optimizer step."""
    tokens_seen: int
    """Tokens the trainer consumed (`num_input_tokens_seen`, padding excluded)."""
    collect_s: float
    """Wall seconds collecting expert episodes (0 when the run folder already held them)."""
    train_s: float
    """Wall seconds of `trainer.train()`."""

    @property
    def tokens_per_s(self) -> float:
        """Tokens trained per second of training."""
        return self.tokens_seen / self.train_s if self.train_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (what `sft.json` holds)."""
        return {**dataclasses.asdict(self), "losses": list(self.losses), "tokens_per_s": self.tokens_per_s}


def expert_folder(out: Path, i: int) -> Path:
    """Where collection `i` (0-based) of a run folder `out` runs: `out/expert`, then `out/expert-2`, ..."""
    return out / ("expert" if i == 0 else f"expert-{i + 1}")


def collect_samples(config: SftConfig, out: Path, *, progress: bool = True) -> tuple[list[TrainingSample], int, float]:
    """Run each expert ablation into its folder (`expert_folder`) and turn every episode into samples; returns the
    samples (collection by collection, each ordered by arm, task, seed), the episode count and the collections'
    wall seconds. Samples are written to `out/samples.parquet`."""
    found: list[TrainingSample] = []
    episodes, collect_s = 0, 0.0
    for i, collect in enumerate(config.collect):
        folder = expert_folder(out, i)
        started = time.perf_counter()
        run_experiment(collect, folder, progress=progress, report=False)
        collect_s += time.perf_counter() - started
        rows = sorted(read_rows(folder), key=lambda r: (r["arm"], r["task"], r["seed"]))
        found.extend(s for row in rows for s in samples(folder / row["log"]))
        episodes += len(rows)
    write_samples(found, out / "samples.parquet")
    return found, episodes, collect_s


def fitting(found: Sequence[TrainingSample], max_length: int) -> list[TrainingSample]:
    """The samples of at most `max_length` tokens (longer ones are left out, never truncated)."""
    return [s for s in found if len(s.token_ids) <= max_length]


def sft_rows(found: Sequence[TrainingSample], max_length: int) -> tuple[list[dict[str, list[int]]], int]:
    """TRL rows (`sample_record`) of the samples that fit `max_length` tokens, and how many did not."""
    rows = [sample_record(s) for s in fitting(found, max_length)]
    return rows, len(found) - len(rows)


def _check_device(device: str) -> None:
    if device not in DEVICES:
        raise ConfigError(f"ctxkit train sft: device {device!r}; expected one of {list(DEVICES)}")


def _require_training_stack() -> tuple[Any, Any, Any]:
    try:
        import datasets  # lazy: the train extra loads on first use
        import trl  # lazy: the train extra loads on first use
        import torch  # lazy: the train extra loads on first use
    except ImportError as exc:
        raise MissingExtraError(exc.name or "trl", "train", "ctxkit train sft") from exc
    return datasets, trl, torch


def _with_lora(model: Any, spec: TrainSpec) -> Any:
    if spec.lora is None:
        return model
    try:
        import peft  # lazy: optional, only for LoRA
    except ImportError as exc:
        raise MissingExtraError("peft", "train", "LoRA fine-tuning") from exc
    lora = peft.LoraConfig(r=spec.lora.r, lora_alpha=spec.lora.alpha, lora_dropout=spec.lora.dropout,
                           target_modules=list(spec.lora.target_modules), task_type="CAUSAL_LM")
    return peft.get_peft_model(model, lora)


def make_trainer(model: Any, tokenizer: Any, rows: list[dict[str, list[int]]], spec: TrainSpec, out: Path, *,
                 progress: bool = True, device: str = "cpu") -> Any:
    """TRL's `SFTTrainer` over pre-tokenized rows (labels used as given), logging every step: float32 on CPU,
    float32 weights with bfloat16 autocast on CUDA."""
    datasets, trl, torch = _require_training_stack()
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    args = trl.SFTConfig(
        output_dir=str(out / "trainer"), max_steps=spec.max_steps, per_device_train_batch_size=spec.batch_size,
        gradient_accumulation_steps=spec.grad_accum, learning_rate=spec.learning_rate, lr_scheduler_type="linear",
        logging_steps=1, save_strategy="no", report_to=[], seed=spec.seed, data_seed=spec.seed,
        max_length=spec.max_length, use_cpu=device == "cpu", activation_checkpointing=False, bf16=device == "cuda",
        include_num_input_tokens_seen="non_padding", disable_tqdm=not progress, dataloader_num_workers=0,
    )
    return trl.SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                          processing_class=tokenizer)


def train_sft(config: SftConfig, rows: list[dict[str, list[int]]], out: Path, *, progress: bool = True,
              device: str = "cpu") -> tuple[Any, Any, tuple[float, ...], int, float]:
    """Fine-tune the config's model on `rows` on `device` ("cpu" or "cuda"); returns (model, tokenizer, losses,
    tokens seen, seconds)."""
    _check_device(device)
    if not rows:
        raise ConfigError(f"{config.path}: no sample fits max_length={config.train.max_length}; nothing to train on")
    lm = load_causal_lm(config.model, device=device, dtype="float32")
    model = _with_lora(trainable_copy(lm.model), config.train)
    trainer = make_trainer(model, lm.hf_tokenizer, rows, config.train, out, progress=progress, device=device)
    started = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - started
    losses = tuple(float(h["loss"]) for h in trainer.state.log_history if "loss" in h)
    model = trainer.model
    if config.train.lora is not None:
        model = model.merge_and_unload()
    return model, lm.hf_tokenizer, losses, int(trainer.state.num_input_tokens_seen), train_s


def plot_losses(losses: Sequence[float], path: Path, title: str) -> None:
    """The loss curve as a PNG."""
    try:
        import matplotlib  # lazy: optional plotting dependency
    except ImportError as exc:
        raise MissingExtraError("matplotlib", "train", "the loss curve of ctxkit train sft") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after choosing the non-interactive backend

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, marker="o", markersize=3)
    ax.set(xlabel="optimizer step", ylabel="training loss (assistant tokens)", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_sft(config: SftConfig, out_dir: str | Path, *, force: bool = False, progress: bool = True,
            device: str = "cpu") -> SftResult:
    """Collect, make samples, train on `device`, save (module docstring). An existing checkpoint in `out_dir` is
    refused unless `force`; the expert episodes of an earlier run in the same folder are reused."""
    _check_device(device)
    out = Path(out_dir)
    if (out / "checkpoint").exists() and not force:
        raise ConfigError(f"{out / 'checkpoint'}: already exists; pass --force to train again, or choose a new --out")
    out.mkdir(parents=True, exist_ok=True)
    found, episodes, collect_s = collect_samples(config, out, progress=progress)
    rows, left_out = sft_rows(found, config.train.max_length)
    model, tokenizer, losses, seen, train_s = train_sft(config, rows, out, progress=progress, device=device)
    checkpoint = out / "checkpoint"
    model.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    kept = fitting(found, config.train.max_length)
    result = SftResult(out_dir=str(out), checkpoint=str(checkpoint), episodes=episodes, samples=len(rows),
                       left_out=left_out, tokens=sum(len(s.token_ids) for s in kept),
                       loss_tokens=sum(s.n_sampled for s in kept), steps=len(losses), losses=losses,
                       tokens_seen=seen, collect_s=collect_s, train_s=train_s)
    with open(out / "train_log.jsonl", "w", encoding="utf-8") as f:
        for step, loss in enumerate(losses, 1):
            f.write(json.dumps({"step": step, "loss": loss}) + "\n")
    plot_losses(losses, out / "loss.png", f"{config.name}: SFT on ctxkit samples")
    (out / "sft.json").write_text(json.dumps({"config": config.path, **result.to_dict()}, indent=2) + "\n")
    return result
