"""TRL glue: GRPO rollouts whose contexts ctxkit builds, and SFT on `ctxkit samples` output.

Written against TRL 1.16 (`trl/trainer/grpo_trainer.py`, `trl/trainer/sft_trainer.py`); docs/TRAINING.md
cites the lines each choice rests on.

**GRPO.** `GRPOTrainer(rollout_func=...)` calls `rollout_func(prompts, trainer)` with this process's prompts,
each already repeated `num_generations` times by TRL's sampler, and expects one rollout per prompt entry:
`prompt_ids`, `completion_ids`, `logprobs`, plus optional fields; an `env_mask` field (1 on model tokens,
0 on environment tokens) becomes TRL's `tool_mask`, multiplied into the loss mask. `EpisodeRollout` is
such a function: per prompt entry it runs one multi-turn tool episode of a ctxkit task with the policy
the trainer is training (its live weights, via `TransformersAgent`), every context built by a
`ContextBuilder` (compressor, budget, pins) and every event logged in an `EventLog` under `out_dir`. The
log is then turned into a training sample (`ctxkit.training.episode_samples.samples`: replayed, hash-checked)
and split for TRL by `sample_to_rollout`: the first step's context is the prompt; everything after it
(sampled turns, tool results, scaffold) is the completion; `env_mask` is the sample's loss mask there
(so tool tokens stay out of the loss); `logprobs` are the behaviour log-probs on sampled tokens and None
elsewhere (TRL maps None to NaN and neutralizes it). The episode's reward, reward kind and log path
travel as extra fields (`ctxkit_reward`, `ctxkit_reward_kind`, `ctxkit_log`) to reward functions;
`reward_func` reads them.

GRPO takes one prompt and one completion per rollout. An episode whose history a compaction rewrote
gives several samples (the later contexts do not extend the earlier tokens): `on_split="error"` (default)
refuses it naming the step; `"last"` trains on the last sample only (the episode's earlier tokens are
dropped, never mislabelled).

**SFT.** `sft_records(path)` reads a `ctxkit samples` export (JSONL or Parquet; shared prefixes resolved)
into rows `{"input_ids", "labels"}` with `labels = -100` wherever the loss mask is 0. TRL's SFT trainer
uses a `labels` column as given, so the loss falls on sampled tokens only, whatever
`completion_only_loss` / `assistant_only_loss` say. `sft_dataset` wraps the rows in a `datasets.Dataset`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence
import copy

from ctxkit.errors import BudgetError, ConfigError
from ctxkit.training.episode_samples import TrainingSample, samples
from ctxkit.context.builder import ContextBuilder
from ctxkit.context.models import MissingExtraError
from ctxkit.events import EpisodeEnd, EpisodeStart, ToolResult, message_from_openai
from ctxkit.experiment.agents.base import to_step
from ctxkit.experiment.agents.hf import TransformersAgent
from ctxkit.experiment.tasks.base import make_task
from ctxkit.experiment.tasks.tools import InvalidToolCall
from ctxkit.log.event_log import EventLog
from ctxkit.text.tokenizer.loader import Tokenizer, load_tokenizer
from ctxkit.training.sample_files import read_samples

__all__ = [
    "EpisodeRollout", "RolloutRow", "SPLIT_POLICIES", "SeedOffset", "episode_rollout", "reward_func", "rollout_batch",
    "run_tool_episode", "sample_to_rollout", "sft_dataset", "sft_records", "trainable_copy",
]

SPLIT_POLICIES: tuple[str, ...] = ("error", "last")
"""What `episode_rollout` does with an episode that gives several samples (see the module docstring)."""

IGNORE_INDEX = -100
"""Label of tokens outside the loss (the value `transformers` and TRL ignore)."""


@dataclass(frozen=True)
class RolloutRow:
    """One GRPO rollout in TRL's terms, from one ctxkit training sample."""

    prompt_ids: tuple[int, ...]
    """The first step's context: exactly what the policy saw before its first sampled token."""
    completion_ids: tuple[int, ...]
    """Every token after the prompt: sampled turns, tool results and template scaffold, in order."""
    logprobs: tuple[float | None, ...]
    """Behaviour log-prob per completion token on sampled tokens; None elsewhere."""
    env_mask: tuple[int, ...]
    """Per completion token: 1 where the policy sampled it, 0 on tool output and scaffold."""
    reward: float | None
    """The episode's reward (None when unscored or cut by a limit)."""
    reward_kind: str
    """Provenance of `reward` (`events.REWARD_KINDS`)."""
    episode_id: str
    """The episode the rollout comes from."""
    log: str
    """Path of the episode's event log ("" when built from a sample alone)."""


def sample_to_rollout(sample: TrainingSample, *, log: str = "") -> RolloutRow:
    """Split a training sample at its prompt into TRL's prompt/completion/mask/log-prob fields."""
    k = sample.prompt_len
    if k < 1 or k >= len(sample.token_ids):
        raise ConfigError(f"episode {sample.episode_id!r} sample {sample.sample_index}: prompt length {k} leaves no "
                          f"completion in {len(sample.token_ids)} tokens")
    if any(sample.loss_mask[:k]):
        raise ConfigError(f"episode {sample.episode_id!r} sample {sample.sample_index}: a prompt token is marked sampled")
    return RolloutRow(
        prompt_ids=tuple(sample.token_ids[:k]),
        completion_ids=tuple(sample.token_ids[k:]),
        logprobs=tuple(sample.logprobs[k:]),
        env_mask=tuple(int(m) for m in sample.loss_mask[k:]),
        reward=sample.reward,
        reward_kind=sample.reward_kind,
        episode_id=sample.episode_id,
        log=log,
    )


def one_sample_or_last(got: Sequence[Any], log_path: str | Path, on_split: str, holder: str) -> Any:
    """The sample a one-prompt, one-completion trainer gets from an episode's samples `got`: the only one, or
    with `on_split="last"` the last; a `ConfigError` naming the log for no sample, for several under
    `on_split="error"` (saying where the history was rewritten and that `holder` holds one), or for an
    unknown `on_split`."""
    if on_split not in SPLIT_POLICIES:
        raise ConfigError(f"on_split={on_split!r}: expected one of {list(SPLIT_POLICIES)}")
    if not got:
        raise ConfigError(f"{log_path}: the episode has no steps; nothing to train on")
    if len(got) > 1 and on_split == "error":
        raise ConfigError(
            f"{log_path}: episode {got[0].episode_id!r} gives {len(got)} samples (the context of step seq "
            f"{got[1].step_seqs[0]} does not extend the tokens before it, e.g. a compaction rewrote the history); "
            f"{holder}: pass on_split='last' to train on the last sample"
        )
    return got[-1]


def episode_rollout(log_path: str | Path, *, on_split: str = "error") -> RolloutRow:
    """The GRPO rollout of one logged episode (replayed and hash-checked by `training_samples.samples`)."""
    if on_split not in SPLIT_POLICIES:
        raise ConfigError(f"on_split={on_split!r}: expected one of {list(SPLIT_POLICIES)}")
    got = samples(str(log_path))
    last = one_sample_or_last(got, log_path, on_split, "a GRPO rollout holds one prompt and one completion")
    return sample_to_rollout(last, log=str(log_path))


def rollout_batch(rows: Sequence[RolloutRow]) -> dict[str, list[Any]]:
    """The dict a TRL `rollout_func` returns for `rows` (the `ctxkit_*` keys reach reward functions)."""
    return {
        "prompt_ids": [list(r.prompt_ids) for r in rows],
        "completion_ids": [list(r.completion_ids) for r in rows],
        "logprobs": [list(r.logprobs) for r in rows],
        "env_mask": [list(r.env_mask) for r in rows],
        "ctxkit_reward": [r.reward for r in rows],
        "ctxkit_reward_kind": [r.reward_kind for r in rows],
        "ctxkit_log": [r.log for r in rows],
    }


def reward_func(*, unscored: float | None = None) -> Callable[..., list[float | None]]:
    """A TRL reward function returning each episode's logged reward; `unscored` replaces a None reward
    (None keeps it None, which TRL treats as "this function does not score the sample")."""

    def ctxkit_episode_reward(prompts: Any = None, completions: Any = None, ctxkit_reward: Sequence[Any] = (),
                              **kwargs: Any) -> list[float | None]:
        """Each rollout's `ctxkit_reward` (the episode's reward), None replaced by the configured value."""
        return [unscored if r is None else float(r) for r in ctxkit_reward]

    return ctxkit_episode_reward


def trainable_copy(model: Any) -> Any:
    """A deep copy of a causal LM loaded from a `.gguf` file, made trainable by TRL / `transformers.Trainer`.

    `from_pretrained(gguf_file=...)` dequantizes every weight to the requested float dtype but keeps the
    GGUF quantizer's marks (`model.hf_quantizer`, `model.is_quantized`, `config._is_quantized`), and
    `Trainer` refuses a "purely quantized" model (`transformers/trainer_utils.py`,
    `validate_quantization_for_training`). The copy drops those marks
    after checking that every parameter really is floating point (`ConfigError` naming one that is not).
    The original (shared by `ctxkit.context.models`' cache) is left untouched.
    """
    for name, param in model.named_parameters():
        if not param.dtype.is_floating_point:
            raise ConfigError(f"parameter {name} is {param.dtype}, not floating point: the model is really "
                              "quantized; attach trainable adapters (PEFT) instead")
    out = copy.deepcopy(model)
    for module in out.modules():  # what transformers' quantizer set at load (quantizers/base.py)
        if getattr(module, "hf_quantizer", None) is not None:
            module.hf_quantizer = None
        if "is_quantized" in vars(module):
            module.is_quantized = False
        if "quantization_method" in vars(module):
            del module.quantization_method
        config = getattr(module, "config", None)
        if config is not None:
            if getattr(config, "quantization_config", None) is not None:
                config.quantization_config = None
            if getattr(config, "_is_quantized", False):
                config._is_quantized = False
    return out


# ------------------------------------------------------------------------------------- episodes


def _end(outcome: str, cause: str, reward: float | None, reward_kind: str, **scores: Any):
    return EpisodeEnd(outcome=outcome, cause=cause, reward=reward, reward_kind=reward_kind, scores=scores)


def run_tool_episode(path: str | Path, *, task: Any, seed: int, builder: Any, agent: Any, max_steps: int,
                     episode_id: str, workdir: str | Path) -> Path:
    """Run one episode of `task` (a `ctxkit.experiment` task) with `agent`, logging every event at `path`.

    Per step: build the context (the builder appends compactions and pins), let the agent act on its ids,
    record the `Step`, run its tool calls and record each `ToolResult`. Ends as the A/B harness ends
    episodes: answered (scored), invalid or failed tool call (reward 0), turn cut by the generation limit,
    over budget, or `max_steps` (no reward).
    """
    episode = task.episode(seed, Path(workdir))
    log = EventLog.create(path, episode_id=episode_id)
    try:
        log.append(EpisodeStart(episode_id=episode_id, tools=episode.tools, context=builder.describe(),
                                task={"name": task.name, "version": task.version, "seed": seed},
                                sampler={"agent": getattr(agent, "name", ""), "seed": seed}))
        log.extend([message_from_openai(m, where=f"{task.name} opening message") for m in episode.messages])
        end = None
        for step in range(max_steps):
            try:
                ctx = builder.build(log)
            except BudgetError as exc:
                end = _end("truncated", "context_budget", None, "length_truncation", error=str(exc))
                break
            turn = agent.act(ctx, tools=episode.tools, seed=seed * 1000 + step)
            log.append(to_step(turn, ctx))
            if not turn.tool_calls:
                if turn.finish_reason == "length":
                    end = _end("truncated", "max_new_tokens", None, "length_truncation")
                else:
                    score = episode.score(turn.content or "")
                    end = _end("terminated", score.cause, score.reward, score.reward_kind, quality=score.quality)
                break
            for tc in turn.tool_calls:
                if end is not None:
                    log.append(ToolResult(tool_call_id=tc.id, name=tc.name, status="error",
                                          content="not run: the episode ended at an earlier tool call"))
                    continue
                try:
                    out = episode.call_tool(tc.name, tc.arguments_text())
                except InvalidToolCall as exc:
                    log.append(ToolResult(tool_call_id=tc.id, name=tc.name, status="error", content=f"invalid tool call: {exc}"))
                    end = _end("terminated", "invalid_tool_call", 0.0, "task_failure", error=str(exc))
                    continue
                log.append(ToolResult(tool_call_id=tc.id, name=tc.name, content=out.content, status=out.status,
                                      duration_s=out.duration_s))
                if out.status != "ok":
                    end = _end("terminated", "tool_failed", 0.0, "tool_failure", error=out.content)
            if end is not None:
                break
        if end is None:
            end = _end("truncated", "max_steps", None, "limit_truncation", limit=max_steps)
        log.append(end)
    finally:
        log.close()
    return Path(path)


class EpisodeRollout:
    """A TRL `rollout_func`: one logged, ctxkit-built tool episode per prompt entry (module docstring).

    A prompt entry is the task seed (an int, or text holding one). Episodes are sampled by the trainer's
    live model through `TransformersAgent` (temperature/top-p/max_new_tokens as given), with contexts built
    by `ContextBuilder(tokenizer, template, compressor, budget, params, detect_pins=pins)`.
    """

    def __init__(self, *, task: str, out_dir: str | Path, tokenizer: Any, model_path: str | None = None,
                 task_params: Mapping[str, Any] | None = None, template: str | None = "chatml-tools-v1",
                 compressor: str = "keep-all", budget: int = 4096, params: Mapping[str, Any] | None = None,
                 pins: bool = False, max_steps: int = 4, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 16, on_split: str = "error"):
        """Check the configuration and build the task and context builder (the model is bound per call)."""
        if on_split not in SPLIT_POLICIES:
            raise ConfigError(f"on_split={on_split!r}: expected one of {list(SPLIT_POLICIES)}")
        if not (isinstance(max_steps, int) and max_steps >= 1):
            raise ConfigError(f"max_steps={max_steps!r}: must be an integer >= 1")
        self.task = make_task(task, task_params, where="EpisodeRollout")
        self.tokenizer = tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(str(tokenizer))
        self.builder = ContextBuilder(self.tokenizer, template, compressor, budget, params, detect_pins=pins)
        self.out_dir = Path(out_dir)
        self.model_path = model_path
        self.sampling = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens}
        self.max_steps = max_steps
        self.on_split = on_split
        self.logs: list[Path] = []
        """Every episode log written, in order."""
        self._agent: Any = None

    def agent_for(self, trainer: Any) -> Any:
        """A `TransformersAgent` sampling with the trainer's current weights (the same module, not a copy)."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        if self._agent is None:
            self._agent = TransformersAgent(tokenizer=self.tokenizer, model_path=self.model_path, device=str(model.device),
                                            dtype=str(model.dtype).removeprefix("torch."), **self.sampling)
        agent = self._agent
        if agent.lm.model is not model:
            agent.lm = dataclasses.replace(agent.lm, model=model)
        step = int(getattr(trainer.state, "global_step", 0))
        agent.policy_version = f"{agent.lm.id}+step{step}"
        return agent

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        """Run one episode per prompt entry and return TRL's rollout dict (see `rollout_batch`)."""
        agent = self.agent_for(trainer)
        step = int(getattr(trainer.state, "global_step", 0))
        rows = []
        for i, prompt in enumerate(prompts):
            seed = _seed_of(prompt, i)
            run = int(hashlib.sha256(f"{seed}:{step}:{i}".encode()).hexdigest()[:6], 16)
            path = self.out_dir / f"step{step:05d}" / f"{self.task.name}-{seed}-{i}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="ctxkit-trl-") as tmp:
                run_tool_episode(path, task=self.task, seed=seed, builder=self.builder, agent=SeedOffset(agent, run),
                                 max_steps=self.max_steps, episode_id=f"{self.task.name}-{seed}-s{step}-{i}", workdir=tmp)
            self.logs.append(path)
            rows.append(episode_rollout(path, on_split=self.on_split))
        return rollout_batch(rows)


class SeedOffset:
    """An agent whose sampling seeds are offset (`offset`), so the repeated entries of a GRPO group differ."""

    def __init__(self, agent: Any, offset: int):
        """Wrap `agent`; every `act` seed is shifted by `offset`."""
        self.agent, self.offset, self.name = agent, offset, getattr(agent, "name", "")

    def act(self, context: Any, *, tools: Any, seed: int) -> Any:
        """The wrapped agent's turn at `seed + offset`."""
        return self.agent.act(context, tools=tools, seed=seed + self.offset)


def _seed_of(prompt: Any, index: int) -> int:
    """The task seed a dataset prompt names."""
    if isinstance(prompt, int) and not isinstance(prompt, bool):
        return prompt
    if isinstance(prompt, str) and prompt.strip().isdigit():
        return int(prompt.strip())
    raise ConfigError(f"prompt {index}: {prompt!r} is not a task seed; EpisodeRollout expects a dataset whose "
                      "`prompt` column holds task seeds (ints or digit strings)")


# ------------------------------------------------------------------------------------------ SFT


def sample_record(sample: TrainingSample, where: str = "samples") -> dict[str, list[int]]:
    """One sample as a TRL row `{"input_ids", "labels"}`, labels -100 off the loss mask; `ConfigError`
    naming `where`, the episode and the sample when it has no sampled token."""
    if not any(sample.loss_mask):
        raise ConfigError(f"{where}: episode {sample.episode_id!r} sample {sample.sample_index} has no sampled tokens")
    return {"input_ids": list(sample.token_ids),
            "labels": [t if m else IGNORE_INDEX for t, m in zip(sample.token_ids, sample.loss_mask)]}


def sft_records(path: str | Path) -> list[dict[str, list[int]]]:
    """Rows `{"input_ids", "labels"}` of a `ctxkit samples` export (`sample_record` of each)."""
    return [sample_record(s, str(path)) for s in read_samples(path)]


def sft_dataset(path: str | Path) -> Any:
    """`sft_records(path)` as a `datasets.Dataset` (pre-tokenized: TRL's SFT trainer uses it as is)."""
    try:
        from datasets import Dataset  # lazy: datasets loads on first use
    except ImportError as exc:
        raise MissingExtraError("datasets", "train", "the TRL SFT dataset adapter") from exc
    return Dataset.from_list(sft_records(path))
