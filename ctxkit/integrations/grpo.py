"""GRPO under compression: the reference policy-gradient step in a loop over ctxkit-built tool episodes.

Why the reference step and not TRL's `GRPOTrainer(rollout_func=EpisodeRollout(...))`: TRL takes one prompt and
one completion per rollout, so an episode whose history a compaction rewrote (several samples) can only be
refused or cut to its last sample; and without vLLM, TRL 1.16 ignores the behaviour log-probs a rollout
returns, so an off-policy batch would be trained as if on-policy. `reference_step` trains every sample of an
episode and corrects off-policy data with truncated importance sampling (`LossConfig.tis_clip`).

One iteration (`run_grpo`):

1. Rollouts: `prompts` task seeds, each run `group_size` times (sampling seeds offset per member, so the
   group differs), every context built by a `ContextBuilder` (compressor, budget, pins) and logged under
   `out_dir/step<k>/`. The sampling agent is a `TransformersAgent` whose weights are the behaviour policy;
   every `Step` records `policy_version = "<model id>+v<version>"`, the number of updates its weights had.
2. Rewards and advantages: an episode's reward is its `EpisodeEnd.reward`, or 0.0 where it has none (a
   `max_steps` cut: the policy did not answer); the advantage is the reward minus its group's mean, over the
   group's standard deviation (plus 1e-6). Episodes a trainer drops (`ctxkit.training.preflight.is_discarded`:
   length truncations, no end) count in their group's statistics but give no sample.
3. Update: every sample of every kept episode (`ctxkit.training.episode_samples.samples`: a new sample where
   history was rewritten), each with its episode's advantage, in one `reference_step`.

`mode="sync"`: batch k is sampled by the weights being trained, then trained (lag 0). `mode="one-step-off"`:
while batch k is trained, batch k+1 is sampled in a thread by a copy of the weights taken before update k,
so every batch after the first is one update old when it is trained (lag 1), and the loss uses TIS (the
ratio against the trainer's own log-probs before the update, each token weighted by min(pi_old / mu, C)).
Each iteration appends a `GrpoStep` to `out_dir/grpo_log.jsonl`; after the last one the trained weights and
the policy's tokenizer are saved to `out_dir/checkpoint` (a folder the `transformers` agent loads:
`model_path = "DIR/<run>/checkpoint"`), so the trained policy can be evaluated on held-out seeds.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ctxkit.context.builder import ContextBuilder
from ctxkit.errors import ConfigError
from ctxkit.events import EpisodeEnd, Step
from ctxkit.experiment.agents.hf import TransformersAgent
from ctxkit.experiment.tasks.base import make_task
from ctxkit.integrations.trl import SeedOffset, run_tool_episode, trainable_copy
from ctxkit.log.file_format import read_events
from ctxkit.text.tokenizer.loader import Tokenizer, load_tokenizer
from ctxkit.training.episode_samples import TrainingSample, samples
from ctxkit.training.preflight import is_discarded
from ctxkit.training.reference_step import LossConfig, reference_step

__all__ = ["MODES", "GrpoSpec", "GrpoStep", "group_advantages", "run_grpo", "save_policy"]

MODES: tuple[str, ...] = ("sync", "one-step-off")
"""How generation and the update are scheduled (module docstring)."""


@dataclass(frozen=True)
class GrpoSpec:
    """What one GRPO run trains on and how."""

    task: str
    """Task registry name (`ctxkit.experiment.tasks`)."""
    seeds: tuple[int, ...]
    """Training task seeds, used `prompts` at a time, in order, cycling."""
    task_params: Mapping[str, Any] = field(default_factory=dict)
    """Task parameters (as in an ablation config's `[tasks.<name>]`)."""
    template: str = "chatml-tools-v1"
    """Chat template the contexts are rendered with."""
    compressor: str = "keep-all"
    """Context policy: a compressor registry name."""
    compressor_params: Mapping[str, Any] = field(default_factory=dict)
    """The compressor's parameters."""
    budget: int = 2048
    """Context budget (tokens)."""
    pins: bool = True
    """Detect and pin constraints."""
    steps: int = 4
    """GRPO iterations (one update each)."""
    prompts: int = 2
    """Task seeds per iteration."""
    group_size: int = 4
    """Episodes per task seed (the GRPO group)."""
    max_steps: int = 8
    """Most agent turns per episode."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_new_tokens: int = 96
    """Most tokens per turn."""
    stop_token_ids: tuple[int, ...] | None = None
    """Token ids that end a turn (None: the model's end-of-turn ids)."""
    learning_rate: float = 1e-5
    """AdamW learning rate (no weight decay: a zero advantage leaves the weights as they are)."""
    mode: str = "sync"
    """`sync` or `one-step-off` (`MODES`)."""
    tis_clip: float = 2.0
    """TIS cap C of the one-step-off update (the sync update is on-policy and uses the plain ratio)."""
    micro_batch: int = 1
    """Samples per forward and backward pass of the update (gradients accumulated into one optimizer step):
    memory is bounded by the longest sample, not the batch."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"GrpoSpec.mode={self.mode!r}: expected one of {list(MODES)}")
        for name in ("steps", "prompts", "group_size", "max_steps", "max_new_tokens", "budget", "micro_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"GrpoSpec.{name}={value!r}: expected an integer >= 1")
        if self.group_size < 2:
            raise ConfigError(f"GrpoSpec.group_size={self.group_size}: a group needs >= 2 episodes for an advantage")
        if not self.seeds:
            raise ConfigError("GrpoSpec.seeds is empty: give the training task seeds")


@dataclass(frozen=True)
class GrpoStep:
    """One GRPO iteration, as logged to `grpo_log.jsonl`."""

    step: int
    """0-based iteration; the update it makes takes the weights from version `step` to `step + 1`."""
    behaviour_version: int
    """Updates the sampling weights had (every `Step` of the batch records it in `policy_version`)."""
    lag: int
    """`step - behaviour_version`: how many updates old the batch is when trained."""
    mean_reward: float
    """Mean episode reward over the batch (0.0 for an episode without one)."""
    episodes: int
    """Episodes sampled."""
    discarded: int
    """Episodes that gave no sample (length truncations, no end)."""
    samples: int
    """Samples trained (more than kept episodes where compactions split histories)."""
    samples_per_episode: float
    """`samples` over kept episodes."""
    generated_tokens: int
    """Tokens sampled over the batch."""
    loss_tokens: int
    """Tokens the loss averaged over."""
    generate_s: float
    """Seconds the batch took to sample (its own clock; overlaps the previous update when one-step-off)."""
    update_s: float
    """Seconds of the update."""
    wall_s: float
    """Seconds from the end of the previous iteration to the end of this one."""
    data_age_s: float
    """Seconds from the end of the batch's sampling to the start of its update."""
    loss: float
    """The loss back-propagated."""
    mean_ratio: float
    """Mean policy ratio over the trained tokens."""
    mean_tis_weight: float | None
    """Mean truncated importance weight (None when the update used none)."""
    logs: tuple[str, ...] = ()
    """The batch's episode logs."""

    @property
    def generated_tokens_per_s(self) -> float:
        """Sampled tokens per second of sampling."""
        return self.generated_tokens / self.generate_s if self.generate_s > 0 else 0.0

    @property
    def loss_tokens_per_s(self) -> float:
        """Trained tokens per wall second of the iteration."""
        return self.loss_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The log record (with the two rates)."""
        return {**dataclasses.asdict(self), "logs": list(self.logs), "generated_tokens_per_s": self.generated_tokens_per_s,
                "loss_tokens_per_s": self.loss_tokens_per_s}


def group_advantages(rewards: Sequence[float], group_size: int) -> list[float]:
    """(reward - group mean) / (group std + 1e-6) over consecutive groups of `group_size`."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)
    adv = (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, keepdims=True) + 1e-6)
    return [float(a) for a in adv.reshape(-1)]


@dataclass
class _Batch:
    logs: list[Path]
    version: int
    generate_s: float
    done_at: float


def _rollouts(spec: GrpoSpec, task: Any, builder: ContextBuilder, agent: TransformersAgent, model: Any,
              version: int, step: int, out: Path) -> _Batch:
    agent.lm = dataclasses.replace(agent.lm, model=model)
    agent.policy_version = f"{agent.lm.id}+v{version}"
    start = time.perf_counter()
    logs = []
    for p in range(spec.prompts):
        seed = spec.seeds[(step * spec.prompts + p) % len(spec.seeds)]
        for member in range(spec.group_size):
            path = out / f"step{step:04d}" / f"{task.name}-{seed}-{member}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="ctxkit-grpo-") as tmp:
                run_tool_episode(path, task=task, seed=seed, builder=builder, agent=SeedOffset(agent, 7919 * member),
                                 max_steps=spec.max_steps, episode_id=f"{task.name}-{seed}-s{step}-m{member}", workdir=tmp)
            logs.append(path)
    return _Batch(logs, version, time.perf_counter() - start, time.perf_counter())


def _update(spec: GrpoSpec, model: Any, optimizer: Any, batch: _Batch, loss: LossConfig) -> tuple[dict[str, Any], float]:
    rewards, kept = [], []
    generated = 0
    for path in batch.logs:
        events = read_events(path)
        steps = [e for e in events if isinstance(e, Step)]
        end = next((e for e in reversed(events) if isinstance(e, EpisodeEnd)), None)
        generated += sum(len(s.token_ids) for s in steps)
        rewards.append(float(end.reward) if end is not None and end.reward is not None else 0.0)
        kept.append(None if is_discarded(steps, end) else path)
    advantages = group_advantages(rewards, spec.group_size)
    train: list[TrainingSample] = []
    weights: list[float] = []
    for path, adv in zip(kept, advantages):
        if path is None:
            continue
        for s in samples(str(path)):
            if s.n_sampled:
                train.append(s)
                weights.append(adv)
    started = time.perf_counter()
    stats = reference_step(model, optimizer, train, loss, advantages=weights, pad_id=0,
                           micro_batch=spec.micro_batch) if train else None
    figures = {
        "mean_reward": float(np.mean(rewards)), "episodes": len(rewards), "discarded": kept.count(None),
        "samples": len(train), "samples_per_episode": len(train) / max(1, len(rewards) - kept.count(None)),
        "generated_tokens": generated, "loss_tokens": stats.n_actions if stats else 0,
        "loss": stats.loss if stats else 0.0, "mean_ratio": stats.mean_ratio if stats else 1.0,
        "mean_tis_weight": stats.mean_tis_weight if stats else None,
    }
    return figures, started


def save_policy(model: Any, hf_tokenizer: Any, folder: str | Path) -> Path:
    """Save a trained causal LM and its `transformers` tokenizer into `folder` (written to a sibling temporary
    folder first and renamed, so a crash never leaves a half-written checkpoint under the final name)."""
    final = Path(folder)
    if final.exists():
        raise ConfigError(f"{final}: a checkpoint already exists; choose a new output folder")
    partial = final.with_name(final.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    model.save_pretrained(partial)
    hf_tokenizer.save_pretrained(partial)
    partial.rename(final)
    return final


def run_grpo(spec: GrpoSpec, out_dir: str | Path, *, model_path: str | None = None, tokenizer: Any,
             threads: int | None = None) -> list[GrpoStep]:
    """Train the model at `model_path` (None: SmolLM2-135M-Instruct) with GRPO on `spec` (module docstring);
    returns the iterations, also appended to `out_dir/grpo_log.jsonl`; the trained policy is saved to
    `out_dir/checkpoint` (`save_policy`). `tokenizer`: the contexts' tokenizer."""
    import torch  # lazy: the train extra loads on first use

    if threads is not None:
        torch.set_num_threads(threads)
    out = Path(out_dir)
    if (out / "checkpoint").exists():  # refused before training, not after
        raise ConfigError(f"{out / 'checkpoint'}: a checkpoint already exists; choose a new output folder")
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(str(tokenizer))
    task = make_task(spec.task, dict(spec.task_params), where="GrpoSpec")
    builder = ContextBuilder(tok, spec.template, spec.compressor, spec.budget, dict(spec.compressor_params),
                             detect_pins=spec.pins)
    agent = TransformersAgent(tokenizer=tok, model_path=model_path, temperature=spec.temperature, top_p=spec.top_p,
                              max_new_tokens=spec.max_new_tokens, stop_token_ids=spec.stop_token_ids)
    model = trainable_copy(agent.lm.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.0)
    loss = LossConfig(tis_clip=spec.tis_clip if spec.mode == "one-step-off" else None)
    history: list[GrpoStep] = []
    log_file = out / "grpo_log.jsonl"
    with ThreadPoolExecutor(max_workers=1) as pool, open(log_file, "a", encoding="utf-8") as f:
        pending = None
        if spec.mode == "one-step-off":
            pending = pool.submit(_rollouts, spec, task, builder, agent, copy.deepcopy(model), 0, 0, out)
        last = time.perf_counter()
        for step in range(spec.steps):
            if spec.mode == "sync":
                batch = _rollouts(spec, task, builder, agent, model, step, step, out)
            else:
                batch = pending.result()
                if step + 1 < spec.steps:  # sample the next batch with the weights before this update
                    pending = pool.submit(_rollouts, spec, task, builder, agent, copy.deepcopy(model), step, step + 1, out)
            figures, started = _update(spec, model, optimizer, batch, loss)
            done = time.perf_counter()
            record = GrpoStep(step=step, behaviour_version=batch.version, lag=step - batch.version,
                              generate_s=batch.generate_s, update_s=done - started, wall_s=done - last,
                              data_age_s=max(0.0, started - batch.done_at), logs=tuple(str(p) for p in batch.logs),
                              **figures)
            last = done
            history.append(record)
            f.write(json.dumps(record.to_dict()) + "\n")
            f.flush()
    save_policy(model, agent.lm.hf_tokenizer, out / "checkpoint")
    return history
