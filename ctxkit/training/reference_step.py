"""A framework-free reference policy-gradient step over ctxkit training samples.

What a trainer must do with a `ctxkit.training.episode_samples.TrainingSample`, written out in ~100 lines of
torch so a framework's behaviour can be checked against it:

- `collate_samples` pads a batch of samples into arrays: token ids, attention mask, the loss mask (1
  exactly on tokens the policy sampled), behaviour log-probs on those tokens and one advantage per
  sample (default: the episode reward). A sample whose sampled tokens carry no behaviour log-prob, or
  whose log-probs are `raw` while its sampling config was not neutral (the temperature/top-p trap: the
  ratio would use the wrong denominator), is refused with a `ConfigError` naming the episode, sample and
  step.
- `token_logprobs` runs the model once and returns, at every position t >= 1, the log-prob of token t
  given tokens < t (position 0 has no prediction and gets 0), at the batch's sampling temperature.
- `policy_loss`: the token-level clipped policy-gradient loss
  `-min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)` averaged over action tokens only (a masked mean
  over the whole batch, never over padded length). Without TIS the ratio `r` is against the behaviour
  log-probs the engine recorded (`pi_theta / mu`). With TIS (`tis_clip`), `r` is against the trainer's
  own log-probs recomputed before the update (`pi_theta / pi_old`), and every action is weighted by the
  truncated importance weight `min(pi_old / mu, C)` (`ctxkit.training.rl_math.truncated_importance_weights`).
- `reference_step`: collate, forward, loss, backward, one optimizer step; returns `StepStats`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ctxkit.errors import ConfigError
from ctxkit.training.rl_math import truncated_importance_weights
from ctxkit.training.episode_samples import TrainingSample

__all__ = ["LossConfig", "SampleBatch", "StepStats", "collate_samples", "policy_loss", "reference_step", "token_logprobs"]

_NEUTRAL = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}


@dataclass(frozen=True)
class LossConfig:
    """Parameters of the clipped policy-gradient loss."""

    clip_low: float = 0.2
    """Lower clip range: the ratio is clipped at `1 - clip_low`."""
    clip_high: float = 0.2
    """Upper clip range: the ratio is clipped at `1 + clip_high` (DAPO's clip-higher raises it)."""
    tis_clip: float | None = None
    """None: ratio against the behaviour log-probs. A number C: ratio against the trainer's recomputed
    log-probs, each action weighted by `min(pi_old / mu, C)` (truncated importance sampling)."""
    tis_level: str = "token"
    """`token` or `sequence` truncated importance weights (see `rl_math.truncated_importance_weights`)."""

    def __post_init__(self) -> None:
        for name in ("clip_low", "clip_high"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value and math.isfinite(value)):
                raise ConfigError(f"LossConfig.{name}={value!r}: must be a finite number >= 0")
        if self.clip_low >= 1:
            raise ConfigError(f"LossConfig.clip_low={self.clip_low!r}: must be < 1 (the ratio is clipped at 1 - clip_low)")
        if self.tis_clip is not None and not (self.tis_clip > 0 and math.isfinite(self.tis_clip)):
            raise ConfigError(f"LossConfig.tis_clip={self.tis_clip!r}: must be a finite number > 0, or None")
        if self.tis_level not in ("token", "sequence"):
            raise ConfigError(f"LossConfig.tis_level={self.tis_level!r}: expected 'token' or 'sequence'")


@dataclass(frozen=True)
class SampleBatch:
    """A padded batch of training samples (numpy arrays, shape `[batch, max_len]` unless noted)."""

    input_ids: np.ndarray
    """Token ids (int64), right-padded with `pad_id`."""
    attention_mask: np.ndarray
    """1 on real tokens, 0 on padding (int64)."""
    loss_mask: np.ndarray
    """1 exactly on sampled tokens (float64); 0 on prompt, tool output, scaffold and padding."""
    behaviour_logprobs: np.ndarray
    """Recorded behaviour log-prob on sampled tokens (float64); 0 elsewhere (never read there)."""
    advantages: np.ndarray
    """One advantage per sample, shape `[batch]` (float64)."""
    temperature: float
    """The sampling temperature shared by every step of the batch (the trainer's log-probs use it)."""
    keys: tuple[tuple[str, int], ...]
    """`(episode_id, sample_index)` of each row."""


@dataclass(frozen=True)
class StepStats:
    """What one `reference_step` did."""

    loss: float
    """The loss value that was back-propagated."""
    n_actions: int
    """Number of action (sampled) tokens the loss averaged over."""
    mean_ratio: float
    """Mean policy ratio over actions (1 on-policy, before the update)."""
    clip_fraction: float
    """Share of actions whose ratio was outside the clip range on the side that stops the gradient."""
    mean_tis_weight: float | None
    """Mean truncated importance weight over actions (None without TIS)."""


def _where(sample: TrainingSample) -> str:
    return f"episode {sample.episode_id!r} sample {sample.sample_index}"


def _sampling_temperature(sample: TrainingSample) -> float:
    temps = set()
    for seq, kind, sampling in zip(sample.step_seqs, sample.logprob_kinds, sample.sampling):
        if kind is None or kind == "none":
            raise ConfigError(f"{_where(sample)}: step seq {seq} recorded no behaviour log-probs (logprob_kind={kind!r}); "
                              "a policy-gradient ratio needs them")
        t = sampling.get("temperature", 1.0)
        t = 1.0 if t is None else float(t)
        if kind == "raw":
            for key, neutral in _NEUTRAL.items():
                value = sampling.get(key)
                if value is not None and float(value) != float(neutral) and not (key == "top_k" and int(value) == -1):
                    raise ConfigError(
                        f"{_where(sample)}: step seq {seq} has raw log-probs but sampled with {key}={value!r}; the "
                        "raw distribution is not the one the tokens were drawn from (record processed log-probs)")
        if t <= 0:
            raise ConfigError(f"{_where(sample)}: step seq {seq} sampled greedily (temperature {t}); a greedy "
                              "policy has no log-probs to train a ratio on")
        temps.add(t)
    if len(temps) > 1:
        raise ConfigError(f"{_where(sample)}: steps sampled at different temperatures {sorted(temps)}")
    return temps.pop() if temps else 1.0


def collate_samples(
    samples: Sequence[TrainingSample], *, advantages: Sequence[float] | None = None, pad_id: int = 0
) -> SampleBatch:
    """Pad `samples` into a `SampleBatch`. `advantages`: one per sample (default: each sample's reward,
    which must then be scored). Raises `ConfigError` naming the sample at fault (see the module docstring)."""
    if not samples:
        raise ConfigError("collate_samples: no samples")
    if advantages is not None and len(advantages) != len(samples):
        raise ConfigError(f"advantages: {len(advantages)} values for {len(samples)} samples")
    n = max(len(s.token_ids) for s in samples)
    b = len(samples)
    ids = np.full((b, n), int(pad_id), dtype=np.int64)
    att = np.zeros((b, n), dtype=np.int64)
    mask = np.zeros((b, n))
    beh = np.zeros((b, n))
    adv = np.zeros(b)
    temps = set()
    for i, s in enumerate(samples):
        k = len(s.token_ids)
        if s.n_sampled == 0:
            raise ConfigError(f"{_where(s)}: no sampled tokens (loss mask all 0)")
        if s.loss_mask[0]:
            raise ConfigError(f"{_where(s)}: token 0 is marked sampled, but the first token has no context to predict it from")
        ids[i, :k] = s.token_ids
        att[i, :k] = 1
        mask[i, :k] = s.loss_mask
        for t, (m, lp) in enumerate(zip(s.loss_mask, s.logprobs)):
            if m:
                if lp is None or not math.isfinite(lp):
                    raise ConfigError(f"{_where(s)}: sampled token {t} has behaviour log-prob {lp!r}; a ratio needs a finite one")
                beh[i, t] = lp
        temps.add(_sampling_temperature(s))
        if advantages is not None:
            adv[i] = float(advantages[i])
        elif s.reward is None:
            raise ConfigError(f"{_where(s)}: reward is None (reward_kind={s.reward_kind!r}); pass advantages explicitly")
        else:
            adv[i] = float(s.reward)
    if len(temps) > 1:
        raise ConfigError(f"collate_samples: samples were drawn at different temperatures {sorted(temps)}")
    keys = tuple((s.episode_id, s.sample_index) for s in samples)
    return SampleBatch(ids, att, mask, beh, adv, temps.pop(), keys)


def token_logprobs(model: Any, input_ids: Any, attention_mask: Any, *, temperature: float = 1.0) -> Any:
    """Per-position log-prob of each token given the ones before it, `[batch, len]` torch tensor (float32).

    Position t >= 1 holds `log softmax(logits[t - 1] / temperature)[token t]`; position 0 holds 0. Gradients
    flow unless called under `torch.no_grad()`.
    """
    import torch  # lazy: torch loads on first use

    ids = torch.as_tensor(input_ids, dtype=torch.long)
    att = torch.as_tensor(attention_mask, dtype=torch.long)
    device = next(model.parameters()).device
    logits = model(input_ids=ids.to(device), attention_mask=att.to(device)).logits.float()
    logp = torch.log_softmax(logits[:, :-1] / float(temperature), dim=-1)
    picked = logp.gather(-1, ids[:, 1:].to(device).unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def policy_loss(new_logprobs: Any, batch: SampleBatch, config: LossConfig = LossConfig(), *,
                old_logprobs: Any = None) -> tuple[Any, StepStats]:
    """The clipped token-level policy-gradient loss of `batch` (a torch scalar) and its statistics.

    `new_logprobs`: `token_logprobs` of the current weights (with gradient). `old_logprobs`: the trainer's
    log-probs before the update (no gradient); required with `config.tis_clip`, ignored otherwise.
    """
    import torch  # lazy: torch loads on first use

    device = new_logprobs.device
    mask = torch.as_tensor(batch.loss_mask, dtype=torch.float32, device=device)
    beh = torch.as_tensor(batch.behaviour_logprobs, dtype=torch.float32, device=device)
    adv = torch.as_tensor(batch.advantages, dtype=torch.float32, device=device).unsqueeze(1)
    if tuple(new_logprobs.shape) != tuple(mask.shape):
        raise ConfigError(f"new_logprobs: shape {tuple(new_logprobs.shape)} does not match the batch's {tuple(mask.shape)}")
    weights = None
    if config.tis_clip is None:
        denom = beh
    else:
        if old_logprobs is None:
            raise ConfigError("old_logprobs: required with LossConfig.tis_clip (the trainer's log-probs before the update)")
        denom = torch.as_tensor(old_logprobs, dtype=torch.float32, device=device).detach()
        if tuple(denom.shape) != tuple(mask.shape):
            raise ConfigError(f"old_logprobs: shape {tuple(denom.shape)} does not match the batch's {tuple(mask.shape)}")
        w = truncated_importance_weights(denom.cpu().numpy(), batch.behaviour_logprobs, batch.loss_mask,
                                         clip=config.tis_clip, level=config.tis_level)
        weights = torch.as_tensor(np.nan_to_num(w, nan=0.0), dtype=torch.float32, device=device)
    # exp of 0 off the mask keeps padding and prompt positions finite; the mask removes them below.
    ratio = torch.exp((new_logprobs - denom) * mask)
    clipped = torch.clamp(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    if weights is not None:
        per_token = per_token * weights
    n = mask.sum()
    loss = (per_token * mask).sum() / n
    with torch.no_grad():
        r = ratio.detach()
        cut = ((r > 1.0 + config.clip_high) & (adv > 0)) | ((r < 1.0 - config.clip_low) & (adv < 0))
        stats = StepStats(
            loss=float(loss.detach()),
            n_actions=int(n.item()),
            mean_ratio=float((r * mask).sum() / n),
            clip_fraction=float((cut.float() * mask).sum() / n),
            mean_tis_weight=None if weights is None else float((weights * mask).sum() / n),
        )
    return loss, stats


def reference_step(model: Any, optimizer: Any, samples: Sequence[TrainingSample], config: LossConfig = LossConfig(), *,
                   advantages: Sequence[float] | None = None, pad_id: int = 0,
                   micro_batch: int | None = None) -> StepStats:
    """One optimizer step of the clipped policy-gradient loss over `samples` (see the module docstring).

    `micro_batch`: samples per forward and backward pass (None: all at once). The gradients of the micro-batches
    add up to the gradient of the whole batch's loss (each micro-batch's token sum over the batch's action
    count), so the step is the same up to float rounding while memory is bounded by the largest micro-batch."""
    import torch  # lazy: torch loads on first use

    if micro_batch is not None and (isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1):
        raise ConfigError(f"reference_step: micro_batch={micro_batch!r}; expected an integer >= 1 or None")
    adv = list(advantages) if advantages is not None else [None] * len(samples)
    size = len(samples) if micro_batch is None else micro_batch
    chunks = [collate_samples(samples[i:i + size], pad_id=pad_id,
                              advantages=None if advantages is None else adv[i:i + size])
              for i in range(0, len(samples), size)]
    total = sum(int(np.asarray(c.loss_mask).sum()) for c in chunks)
    optimizer.zero_grad(set_to_none=True)
    parts: list[tuple[int, StepStats]] = []
    for batch in chunks:
        n = int(np.asarray(batch.loss_mask).sum())  # > 0: collate_samples refuses a sample without sampled tokens
        old = None
        if config.tis_clip is not None:
            with torch.no_grad():
                old = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=batch.temperature)
        new = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=batch.temperature)
        loss, stats = policy_loss(new, batch, config, old_logprobs=old)
        (loss * (n / total)).backward()
        parts.append((n, stats))
    optimizer.step()
    return _combined(parts, total)


def _combined(parts: Sequence[tuple[int, StepStats]], total: int) -> StepStats:
    """The statistics of a step from its micro-batches' (action count, statistics), each weighted by its count."""
    if len(parts) == 1:
        return parts[0][1]

    def mean(field: str) -> float:
        return sum(n * getattr(s, field) for n, s in parts) / total

    tis = None if any(s.mean_tis_weight is None for _, s in parts) else mean("mean_tis_weight")
    return StepStats(loss=mean("loss"), n_actions=total, mean_ratio=mean("mean_ratio"),
                     clip_fraction=mean("clip_fraction"), mean_tis_weight=tis)
