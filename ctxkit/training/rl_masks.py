"""Which tokens and sequences an off-policy correction would clip or drop, as pure functions of ratios.

A ratio here is `exp(trainer log-prob - behaviour log-prob)` of one sampled token (`pi_train / pi_sample`).
Three corrections used in RL training on engine-sampled tokens:

- **Truncated importance sampling (TIS)**, token level: the weight is `min(ratio, clip)`, so a token is
  *touched* when `ratio > clip` (`tis_touched`).
- **Token masking (IcePop style)**: a token whose ratio lies outside `[low, high]` gets weight 0
  (`token_mask_keep`; the bounds are kept, as IcePop's `k if k in [a, b] else 0`).
- **Sequence masking**, TRL's `vllm_importance_sampling_mode="sequence_mask"` (trl 1.16.0,
  `trl/trainer/grpo_trainer.py`, the block under "Compute the importance sampling ratio when using vLLM"):
  the per-token log-ratio differences are multiplied by the completion mask, NaN differences are set to 0
  (`torch.nan_to_num(..., nan=0.0)`), summed over the sequence, exponentiated, and the whole sequence is
  masked when that ratio is `< clip_min` (default None: no lower bound) or `> clip_max` (default 3.0,
  `vllm_importance_sampling_clip_max`). `sequence_mask_keep` reproduces exactly that.

Pure numpy; inputs are array-likes (torch tensors are converted by `rl_math.as_array`). Every function
returns a new numpy array. Bad parameters raise `ConfigError` naming them.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ctxkit.errors import ConfigError
from ctxkit.training.rl_math import as_array

__all__ = [
    "TRL_SEQUENCE_CLIP_MAX",
    "sequence_log_ratios",
    "sequence_mask_keep",
    "tis_touched",
    "token_mask_keep",
]

TRL_SEQUENCE_CLIP_MAX = 3.0
"""TRL's default `vllm_importance_sampling_clip_max` (GRPOConfig, trl 1.16.0)."""


def _positive(value: float, name: str) -> float:
    v = float(value)
    if not (v > 0 and math.isfinite(v)):
        raise ConfigError(f"{name}={value!r}: must be a finite number > 0")
    return v


def _ratios(ratios: Any) -> np.ndarray:
    arr = as_array(ratios, name="ratios")
    if np.isnan(arr).any() or (arr < 0).any():
        bad = int(np.flatnonzero(np.isnan(arr.reshape(-1)) | (arr.reshape(-1) < 0))[0])
        raise ConfigError(f"ratios: value {arr.reshape(-1)[bad]} at flat position {bad} is not a ratio (NaN or negative)")
    return arr


def tis_touched(ratios: Any, clip: float = 2.0) -> np.ndarray:
    """Bool array: True where token-level TIS `min(ratio, clip)` changes the weight (`ratio > clip`)."""
    c = _positive(clip, "clip")
    return _ratios(ratios) > c


def token_mask_keep(ratios: Any, low: float = 0.5, high: float = 2.0) -> np.ndarray:
    """Bool array: True where an IcePop-style token mask keeps the token (`low <= ratio <= high`)."""
    lo, hi = _positive(low, "low"), _positive(high, "high")
    if lo > hi:
        raise ConfigError(f"low={low!r} > high={high!r}: the kept interval [low, high] is empty")
    r = _ratios(ratios)
    return (r >= lo) & (r <= hi)


def sequence_log_ratios(token_log_ratios: Sequence[Any]) -> np.ndarray:
    """Per-sequence log-ratio: the sum of each sequence's token log-ratios, NaN counted as 0 (as TRL does).

    `token_log_ratios` is one 1-D array-like per sequence (its sampled tokens only, i.e. already masked).
    An infinite token log-ratio makes the sequence's log-ratio infinite (ratio 0 or inf).
    """
    out = np.zeros(len(token_log_ratios))
    for i, seq in enumerate(token_log_ratios):
        arr = as_array(seq, name=f"token_log_ratios[{i}]")
        if arr.ndim != 1:
            raise ConfigError(f"token_log_ratios[{i}]: expected a 1-D array, got shape {arr.shape}")
        out[i] = np.nan_to_num(arr, nan=0.0, posinf=np.inf, neginf=-np.inf).sum()
    return out


def sequence_mask_keep(token_log_ratios: Sequence[Any], *, clip_max: float | None = TRL_SEQUENCE_CLIP_MAX,
                       clip_min: float | None = None) -> np.ndarray:
    """Bool per sequence: True where TRL's `sequence_mask` keeps it (`clip_min <= exp(sum) <= clip_max`).

    `None` for a bound means no bound on that side (TRL's `-inf` / `inf`), as in TRL.
    """
    hi = math.inf if clip_max is None else _positive(clip_max, "clip_max")
    lo = -math.inf if clip_min is None else float(clip_min)
    if lo > hi:
        raise ConfigError(f"clip_min={clip_min!r} > clip_max={clip_max!r}: no sequence can be kept")
    with np.errstate(over="ignore"):
        ratio = np.exp(sequence_log_ratios(token_log_ratios))
    return ~((ratio < lo) | (ratio > hi))
