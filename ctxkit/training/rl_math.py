"""The small pieces of RL arithmetic that training on logged rollouts gets wrong most often.

- `masked_mean`: a mean over actions only (positions whose loss mask is 1), never over the padded length.
- `behaviour_logprobs`: the log-probs of the distribution a token was *actually* sampled from, given raw
  logits and the sampling config (temperature, top-k, top-p, min-p). `gather_logprobs` picks the sampled
  actions out of it and reports actions that fall outside the kept support (probability 0, log -inf).
- `importance_ratio`, `truncated_importance_weights`: new-policy / behaviour ratios on actions, with
  token- or sequence-level truncation (TIS).
- `td_target`, `gae`: episode ends done right: bootstrap on truncation, not on termination, and stop the
  advantage recursion at collection boundaries.

Pure numpy (torch tensors are accepted as inputs and converted); every result is a numpy array or float.
Imports nothing from ctxkit but `errors`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ctxkit.errors import ConfigError

__all__ = [
    "SAMPLING_ORDERS",
    "ActionLogprobs",
    "GaeResult",
    "as_array",
    "behaviour_logprobs",
    "check_mask",
    "gae",
    "gather_logprobs",
    "importance_ratio",
    "masked_mean",
    "td_target",
    "truncated_importance_weights",
]


def as_array(x: Any, *, name: str, dtype: Any = np.float64) -> np.ndarray:
    """`x` as a numpy array of `dtype`; torch tensors are detached and moved to CPU first."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    try:
        return np.asarray(x, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: cannot be read as an array of {np.dtype(dtype).name}: {exc}") from exc


def check_mask(mask: Any, *, name: str = "mask", length: int | None = None, shape: tuple | None = None) -> np.ndarray:
    """Validate a loss mask: only 0/1 values, and the given length or shape. Returns it as a bool array."""
    arr = as_array(mask, name=name)
    if shape is not None and arr.shape != tuple(shape):
        raise ConfigError(f"{name}: shape {arr.shape} does not match the values' shape {tuple(shape)}")
    if length is not None and (arr.ndim != 1 or arr.shape[0] != length):
        raise ConfigError(f"{name}: length {arr.shape} does not match the values' length {length}")
    bad = np.flatnonzero(~((arr == 0) | (arr == 1)))
    if bad.size:
        pos = int(bad[0])
        raise ConfigError(f"{name}: not binary: value {float(arr.reshape(-1)[pos])} at flat position {pos} ({bad.size} non-0/1 value(s))")
    return arr.astype(bool)


def masked_mean(values: Any, mask: Any) -> float:
    """Mean of `values` over the positions where `mask` is 1 (the actions), not over all positions.

    Raises `ConfigError` when the shapes differ, the mask is not 0/1, or there are no actions. Values
    outside the mask are never read (they may be NaN or padding).
    """
    vals = as_array(values, name="values")
    m = check_mask(mask, name="mask", shape=vals.shape)
    n = int(m.sum())
    if n == 0:
        raise ConfigError(f"mask: no actions (all {m.size} positions are 0); a mean over actions is undefined")
    return float(vals[m].sum() / n)


# --------------------------------------------------------------------------------------------------
# Behaviour distributions


def _temperature(logits: np.ndarray, t: float) -> np.ndarray:
    if t == 0.0:  # greedy (the vLLM convention): all mass on the first argmax
        out = np.full_like(logits, -np.inf)
        idx = np.argmax(logits, axis=-1)
        np.put_along_axis(out, idx[..., None], 0.0, axis=-1)
        return out
    return logits / t


def _softmax(logits: np.ndarray) -> np.ndarray:
    m = np.max(logits, axis=-1, keepdims=True)
    e = np.exp(logits - m)
    return e / e.sum(axis=-1, keepdims=True)


def _top_k(logits: np.ndarray, k: int) -> np.ndarray:
    if k >= logits.shape[-1]:
        return logits
    kth = np.sort(logits, axis=-1)[..., -k][..., None]  # ties with the k-th value are kept (as HF and vLLM do)
    return np.where(logits < kth, -np.inf, logits)


def _top_p(logits: np.ndarray, p: float) -> np.ndarray:
    if p >= 1.0:
        return logits
    probs = _softmax(logits)
    order = np.argsort(-logits, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(probs, order, axis=-1)
    above = np.cumsum(sorted_p, axis=-1) - sorted_p  # mass ranked strictly above each token
    keep_sorted = above < p  # the smallest top set whose mass reaches p; the top token is always kept
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return np.where(keep, logits, -np.inf)


def _min_p(logits: np.ndarray, p: float) -> np.ndarray:
    if p <= 0.0:
        return logits
    probs = _softmax(logits)
    threshold = p * probs.max(axis=-1, keepdims=True)
    return np.where(probs < threshold, -np.inf, logits)


SAMPLING_ORDERS: dict[str, tuple[str, ...]] = {
    "hf": ("temperature", "top_k", "top_p", "min_p"),
    "vllm": ("temperature", "min_p", "top_k", "top_p"),
}
"""Order in which the sampling transforms are applied. `hf` is transformers' logits-warper order
(temperature, top-k, top-p, min-p); `vllm` is vLLM V1's sampler (temperature, then min-p as an
argmax-invariant logits processor, then top-k/top-p). Each filter renormalizes over the set kept so
far (top-p's mass and min-p's threshold are computed on the already-filtered distribution). The two
differ only when min-p and top-p are both active."""

_NEUTRAL_PENALTIES = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def _sampling_params(sampling: Mapping[str, Any]) -> dict[str, float | int]:
    if not isinstance(sampling, Mapping):
        raise ConfigError(f"sampling: expected a mapping like {{'temperature': 0.7, 'top_p': 0.9}}, got {type(sampling).__name__}")
    for key, neutral in _NEUTRAL_PENALTIES.items():
        value = sampling.get(key)
        if value is not None and float(value) != neutral:
            raise ConfigError(
                f"sampling.{key}={value!r}: penalties depend on the generated history and are not modelled; "
                "record processed log-probs from the engine instead"
            )
    t = sampling.get("temperature", 1.0)
    t = 1.0 if t is None else float(t)
    if not (t >= 0.0 and math.isfinite(t)):
        raise ConfigError(f"sampling.temperature={t!r}: must be a finite number >= 0 (0 means greedy)")
    k = sampling.get("top_k")
    k = 0 if k is None else int(k)
    if k < -1:
        raise ConfigError(f"sampling.top_k={k!r}: must be >= 1, or 0/-1/None for disabled")
    p = sampling.get("top_p")
    p = 1.0 if p is None else float(p)
    if not (0.0 < p <= 1.0):
        raise ConfigError(f"sampling.top_p={p!r}: must be in (0, 1]")
    mp = sampling.get("min_p")
    mp = 0.0 if mp is None else float(mp)
    if not (0.0 <= mp <= 1.0):
        raise ConfigError(f"sampling.min_p={mp!r}: must be in [0, 1]")
    return {"temperature": t, "top_k": k, "top_p": p, "min_p": mp}


def behaviour_logprobs(logits: Any, sampling: Mapping[str, Any], *, order: str = "hf") -> np.ndarray:
    """Log-probs of the distribution sampling actually drew from, over the vocabulary (last axis).

    `logits` are the model's raw logits (any leading shape, vocabulary last; numpy or torch). `sampling`
    is a `Step.sampling`-style mapping: `temperature` (default 1; 0 = greedy), `top_k` (0, -1 or None =
    off), `top_p` (default 1), `min_p` (default 0); other keys (`seed`, `max_tokens`) are ignored, while a
    non-neutral repetition/presence/frequency penalty raises `ConfigError` (it depends on history). The
    transforms apply in `SAMPLING_ORDERS[order]`, each renormalizing over the kept set. Tokens removed by a
    filter get log-prob `-inf` (behaviour probability 0). Returns a float64 array shaped like `logits`.
    """
    steps = SAMPLING_ORDERS.get(order)
    if steps is None:
        raise ConfigError(f"order={order!r}: unknown; expected one of {sorted(SAMPLING_ORDERS)}")
    params = _sampling_params(sampling)
    x = as_array(logits, name="logits")
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ConfigError(f"logits: shape {x.shape} has no vocabulary axis")
    if np.isnan(x).any():
        raise ConfigError("logits: contain NaN")
    ops: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "temperature": lambda a: _temperature(a, float(params["temperature"])),
        "top_k": lambda a: _top_k(a, int(params["top_k"])) if int(params["top_k"]) > 0 else a,
        "top_p": lambda a: _top_p(a, float(params["top_p"])),
        "min_p": lambda a: _min_p(a, float(params["min_p"])),
    }
    for name in steps:
        x = ops[name](x)
    m = np.max(x, axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@dataclass(frozen=True)
class ActionLogprobs:
    """Log-probs of the sampled actions under one distribution, with the actions it could not produce."""

    logprobs: np.ndarray
    """Log-prob of each action (float64, shaped like the actions); `-inf` where outside the support."""
    outside_support: np.ndarray
    """Bool mask: True where the action has probability 0 under the distribution (e.g. cut by top-p)."""

    @property
    def n_outside(self) -> int:
        """How many actions fall outside the support."""
        return int(self.outside_support.sum())


def gather_logprobs(logprobs: Any, actions: Any) -> ActionLogprobs:
    """Pick each action's log-prob out of a full distribution `logprobs[..., V]` (`actions[...]` ints).

    Actions with probability 0 are reported in `outside_support`, never silently clipped.
    """
    lp = as_array(logprobs, name="logprobs")
    acts = as_array(actions, name="actions", dtype=np.int64)
    if lp.shape[:-1] != acts.shape:
        raise ConfigError(f"actions: shape {acts.shape} does not match the log-probs' leading shape {lp.shape[:-1]}")
    vocab = lp.shape[-1]
    bad = np.flatnonzero((acts < 0) | (acts >= vocab))
    if bad.size:
        raise ConfigError(f"actions: id {int(acts.reshape(-1)[bad[0]])} at flat position {int(bad[0])} is outside the vocabulary [0, {vocab})")
    picked = np.take_along_axis(lp, acts[..., None], axis=-1)[..., 0]
    return ActionLogprobs(logprobs=picked, outside_support=np.isneginf(picked))


# --------------------------------------------------------------------------------------------------
# Importance ratios


def importance_ratio(new_logprobs: Any, behaviour_logprobs: Any, mask: Any) -> np.ndarray:
    """Per-token ratio `exp(new - behaviour)` on actions (mask 1); NaN where the mask is 0.

    Both log-prob arrays must be aligned with `mask`. An action whose behaviour log-prob is `-inf` (it
    could not have been sampled, e.g. the log-probs are raw while sampling used top-p) raises `ConfigError`
    naming the position, since its ratio would be infinite.
    """
    new = as_array(new_logprobs, name="new_logprobs")
    old = as_array(behaviour_logprobs, name="behaviour_logprobs")
    if new.shape != old.shape:
        raise ConfigError(f"behaviour_logprobs: shape {old.shape} does not match new_logprobs' shape {new.shape}")
    m = check_mask(mask, shape=new.shape)
    if not m.any():
        raise ConfigError(f"mask: no actions (all {m.size} positions are 0)")
    for name, arr in (("new_logprobs", new), ("behaviour_logprobs", old)):
        bad = np.flatnonzero(m.reshape(-1) & ~np.isfinite(arr.reshape(-1)))
        if bad.size:
            pos = int(bad[0])
            raise ConfigError(
                f"{name}: non-finite log-prob {arr.reshape(-1)[pos]} on an action at flat position {pos} "
                f"({bad.size} such action(s)); an action outside the behaviour support cannot have been sampled from it"
            )
    out = np.full(new.shape, np.nan)
    out[m] = np.exp(new[m] - old[m])
    return out


def truncated_importance_weights(
    new_logprobs: Any, behaviour_logprobs: Any, mask: Any, *, clip: float = 2.0, level: str = "token"
) -> np.ndarray:
    """Truncated importance-sampling weights `min(ratio, clip)` on actions (NaN where the mask is 0).

    `level="token"`: each action's own ratio (verl `rollout_is_threshold`, slime `--tis-clip`).
    `level="sequence"`: the product of the ratios over all actions of the sequence (last axis), clipped
    and broadcast to every action. Inputs are 1-D (one sequence) or 2-D (batch, positions).
    """
    if not (clip > 0 and math.isfinite(clip)):
        raise ConfigError(f"clip={clip!r}: must be a finite number > 0")
    if level not in ("token", "sequence"):
        raise ConfigError(f"level={level!r}: expected 'token' or 'sequence'")
    ratio = importance_ratio(new_logprobs, behaviour_logprobs, mask)
    if level == "token":
        return np.where(np.isnan(ratio), np.nan, np.minimum(ratio, clip))
    m = ~np.isnan(ratio)
    log_seq = np.where(m, np.log(np.where(m, ratio, 1.0)), 0.0).sum(axis=-1, keepdims=True)
    seq = np.minimum(np.exp(log_seq), clip)
    return np.where(m, np.broadcast_to(seq, ratio.shape), np.nan)


# --------------------------------------------------------------------------------------------------
# Episode ends


def td_target(reward: float, next_value: float, gamma: float, terminated: bool) -> float:
    """One-step TD target: `reward` on termination, `reward + gamma * next_value` on truncation.

    On truncation (an external limit stopped collection) `next_value` is the value of the interrupted
    trajectory's final observation, so the target bootstraps from it; a terminated episode has no future.
    """
    if not isinstance(terminated, (bool, np.bool_)):
        raise ConfigError(f"terminated={terminated!r}: must be a bool (True: the task ended; False: truncated)")
    if not 0.0 <= gamma <= 1.0:
        raise ConfigError(f"gamma={gamma!r}: must be in [0, 1]")
    if terminated:
        return float(reward)
    if not math.isfinite(next_value):
        raise ConfigError(f"next_value={next_value!r}: a truncated step needs a finite bootstrap value")
    return float(reward + gamma * next_value)


@dataclass(frozen=True)
class GaeResult:
    """Advantages and returns (`advantages + values`) from `gae`."""

    advantages: np.ndarray
    """Generalized advantage estimate per step."""
    returns: np.ndarray
    """Value targets per step: `advantages + values`."""


def gae(
    rewards: Any,
    values: Any,
    bootstrap_values: Any,
    terminated: Any,
    boundary: Any,
    gamma: float,
    lam: float,
) -> GaeResult:
    """Generalized advantage estimation over a flat stream of steps from one or more trajectories.

    `boundary[t] = 1` marks the last step of a collected segment (episode end, truncation, or the end of
    the collection chunk): the recursion stops there and never leaks into the next segment. At a boundary,
    `terminated[t] = 1` means the task itself ended (next value 0); otherwise the step was truncated and
    bootstraps from `bootstrap_values[t]`, the value of the final observation (read only there; other
    entries may be NaN). Off boundaries the next value is `values[t + 1]`. `terminated[t] = 1` requires
    `boundary[t] = 1`, and the last step must be a boundary.
    """
    r = as_array(rewards, name="rewards")
    if r.ndim != 1 or r.size == 0:
        raise ConfigError(f"rewards: expected a non-empty 1-D array, got shape {r.shape}")
    n = r.shape[0]
    v = as_array(values, name="values")
    bv = as_array(bootstrap_values, name="bootstrap_values")
    for name, arr in (("values", v), ("bootstrap_values", bv)):
        if arr.shape != (n,):
            raise ConfigError(f"{name}: shape {arr.shape} does not match rewards' length {n}")
    term = check_mask(terminated, name="terminated", length=n)
    bound = check_mask(boundary, name="boundary", length=n)
    if not 0.0 <= gamma <= 1.0:
        raise ConfigError(f"gamma={gamma!r}: must be in [0, 1]")
    if not 0.0 <= lam <= 1.0:
        raise ConfigError(f"lam={lam!r}: must be in [0, 1]")
    bad = np.flatnonzero(term & ~bound)
    if bad.size:
        raise ConfigError(f"terminated: step {int(bad[0])} is terminated but not marked as a boundary")
    if not bound[-1]:
        raise ConfigError(f"boundary: the last step ({n - 1}) must be a boundary (end of the collected data)")
    need = np.flatnonzero(bound & ~term & ~np.isfinite(bv))
    if need.size:
        raise ConfigError(f"bootstrap_values: step {int(need[0])} is truncated but its bootstrap value is {bv[need[0]]}")
    adv = np.zeros(n)
    running = 0.0
    for t in range(n - 1, -1, -1):
        if bound[t]:
            next_v = 0.0 if term[t] else bv[t]
            running = 0.0
        else:
            next_v = v[t + 1]
        delta = r[t] + gamma * next_v - v[t]
        running = delta + gamma * lam * running
        adv[t] = running
    return GaeResult(advantages=adv, returns=adv + v)
