"""The mismatch statistics: quantiles, extremes, buckets, correction shares and the raw-denominator trap.

Inputs are `ScoredStep`s (`ctxkit.training.mismatch.scoring`); outputs are plain JSON-able dicts (floats, ints,
strings, lists; non-finite floats as None), so the text report, `--json` and the plot read one structure.

Definitions (one sampled token; a *sequence* is one step's sampled tokens, TRL's completion):
- `diff = recomputed - behaviour` (log space, same kind on both sides), `ratio = exp(diff)`;
- TIS touches a token when `ratio > clip`; a sequence when any of its tokens is touched;
- the token mask drops a token when `ratio` is outside `[mask_low, mask_high]`;
- TRL's `sequence_mask` drops a sequence when `exp(sum of its diffs) > 3.0` (`ctxkit.training.rl_masks`);
- the trap: `exp(recomputed_processed - recorded_raw)`, the ratio a trainer gets when it applies the
  sampling transform on its side but divides by the engine's raw (temperature-1, unfiltered) log-probs;
  counted only on steps whose transform is not the identity. Sampled tokens outside the trainer's kept
  support (`recomputed_processed = -inf`, e.g. cut by top-p) are counted;
- the extremes: the `top` tokens of largest `|diff|` (an infinite diff first, a NaN one as 0, ties in log order),
  each listed once: the same token of the same step scored alike under several arms of a paired run (arms
  share a task and seed, so their first steps often match) is one extreme naming all those `arms`.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from ctxkit.errors import ConfigError
from ctxkit.training.rl_masks import TRL_SEQUENCE_CLIP_MAX, sequence_mask_keep, tis_touched, token_mask_keep

__all__ = ["QUANTILES", "LENGTH_EDGES", "bucket_label", "bucketize", "quantiles", "analyze", "kind_stats", "trap_stats"]

QUANTILES: tuple[float, ...] = (0.01, 0.05, 0.25, 0.50, 0.75, 0.95, 0.99)
"""Quantiles reported (p1, p5, p25, p50, p75, p95, p99)."""
LENGTH_EDGES: tuple[int, ...] = (0, 128, 256, 512, 1024, 2048, 4096)
"""Lower edges of the position and sequence-length buckets (the last bucket is open)."""


def _f(x: float) -> float | None:
    return float(x) if math.isfinite(float(x)) else None


def quantiles(values: Any, qs: Sequence[float] = QUANTILES) -> dict[str, float | None]:
    """`{"p1": ..., "p50": ..., ...}`: numpy's default (linear) quantiles of the finite values; None when
    there are none. Keys are `p` + the percentage (`0.5 -> "p50"`)."""
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    arr = arr[np.isfinite(arr)]
    keys = [f"p{round(q * 100):d}" for q in qs]
    if arr.size == 0:
        return {k: None for k in keys}
    return {k: float(v) for k, v in zip(keys, np.quantile(arr, list(qs)))}


def bucket_label(lo: int, hi: int | None) -> str:
    """`"128-255"` for [128, 256), `"4096+"` for the open last bucket."""
    return f"{lo}+" if hi is None else f"{lo}-{hi - 1}"


def bucketize(values: Any, edges: Sequence[int] = LENGTH_EDGES) -> list[str]:
    """The bucket label of each value (ints >= 0) for the lower `edges`."""
    if list(edges) != sorted(edges) or not edges or edges[0] != 0:
        raise ConfigError(f"edges={list(edges)!r}: must be increasing and start at 0")
    out = []
    for v in np.asarray(values, dtype=np.int64).reshape(-1):
        if v < 0:
            raise ConfigError(f"bucketize: negative value {int(v)}")
        i = int(np.searchsorted(edges, v, side="right")) - 1
        out.append(bucket_label(int(edges[i]), int(edges[i + 1]) if i + 1 < len(edges) else None))
    return out


def _group(labels: list[str], diffs: np.ndarray, ratios: np.ndarray, clip: float) -> list[dict[str, Any]]:
    rows = []
    for label in dict.fromkeys(sorted(set(labels), key=lambda s: int(s.split("-")[0].rstrip("+")))):
        sel = np.array([lab == label for lab in labels])
        d, r = diffs[sel], ratios[sel]
        fin = np.isfinite(d)
        rows.append({
            "bucket": label, "tokens": int(sel.sum()),
            "mean_abs_diff": _f(np.abs(d[fin]).mean()) if fin.any() else None,
            "ratio_p1": quantiles(r, (0.01,))["p1"], "ratio_p50": quantiles(r, (0.5,))["p50"],
            "ratio_p99": quantiles(r, (0.99,))["p99"],
            "tis_share": float(tis_touched(r, clip).mean()),
        })
    return rows


def _paired_place(step: Any) -> tuple[str, int]:
    """Where a step sits whatever its arm: its log with the arm folder left out (`<run>/episodes/<arm>/<task>-<seed>.jsonl`,
    the same task and seed under every arm), and its index."""
    path = Path(step.log)
    if step.arm is not None and path.parent.name == step.arm:
        return str(path.parent.parent / path.name), step.index
    return step.log, step.index


def kind_stats(steps: Sequence[Any], *, clip: float = 2.0, mask_low: float = 0.5, mask_high: float = 2.0,
               top: int = 10, decode: Callable[[int], str] | None = None) -> dict[str, Any]:
    """Statistics of steps that share one logprob kind (behaviour vs recomputed of that kind)."""
    if not steps:
        raise ConfigError("kind_stats: no steps")
    diffs_per_seq = [np.asarray(s.recomputed, dtype=np.float64) - s.behaviour for s in steps]
    diffs = np.concatenate(diffs_per_seq)
    with np.errstate(over="ignore"):
        ratios = np.exp(diffs)
    positions = np.concatenate([s.context_length + np.arange(len(s.token_ids)) for s in steps])
    seq_len = np.concatenate([np.full(len(s.token_ids), s.context_length + len(s.token_ids)) for s in steps])
    tis = tis_touched(ratios, clip)
    keep = token_mask_keep(ratios, mask_low, mask_high)
    seq_keep = sequence_mask_keep(diffs_per_seq, clip_max=TRL_SEQUENCE_CLIP_MAX)
    bounds = np.cumsum([0] + [len(d) for d in diffs_per_seq])
    seq_tis = np.array([tis[a:b].any() for a, b in zip(bounds[:-1], bounds[1:])])
    seq_masked_tok = np.array([(~keep[a:b]).any() for a, b in zip(bounds[:-1], bounds[1:])])
    seq_tokens = np.array([len(d) for d in diffs_per_seq])
    order = np.argsort(-np.abs(np.nan_to_num(diffs, nan=0.0, posinf=np.inf, neginf=np.inf)), kind="stable")
    owner = np.searchsorted(bounds, order, side="right") - 1
    extremes: dict[tuple, dict[str, Any]] = {}
    for flat, k in zip(order, owner):
        s = steps[int(k)]
        i = int(flat - bounds[k])
        tid = int(s.token_ids[i])
        position, behaviour, recomputed = int(s.context_length + i), _f(s.behaviour[i]), _f(s.recomputed[i])
        key = (*_paired_place(s), position, tid, behaviour, recomputed)
        if key in extremes:
            if s.arm is not None and s.arm not in extremes[key]["arms"]:
                extremes[key]["arms"].append(s.arm)
            continue
        if len(extremes) == top:
            break
        extremes[key] = {
            "log": s.log, "arms": [] if s.arm is None else [s.arm], "step": s.index, "seq": s.seq,
            "position": position, "index_in_turn": i, "token_id": tid, "text": decode(tid) if decode is not None else None,
            "behaviour": behaviour, "recomputed": recomputed, "diff": _f(diffs[flat]), "ratio": _f(ratios[flat]),
        }
    return {
        "steps": len(steps), "tokens": int(diffs.size),
        "non_finite_diffs": int((~np.isfinite(diffs)).sum()),
        "max_abs_diff": _f(np.abs(diffs[np.isfinite(diffs)]).max()) if np.isfinite(diffs).any() else None,
        "diff_quantiles": quantiles(diffs), "ratio_quantiles": quantiles(ratios),
        "extremes": list(extremes.values()),
        "by_position": _group(bucketize(positions), diffs, ratios, clip),
        "by_sequence_length": _group(bucketize(seq_len), diffs, ratios, clip),
        "tis": {"clip": clip, "token_share": float(tis.mean()), "tokens": int(tis.sum()),
                "sequence_share": float(seq_tis.mean()), "sequences": int(seq_tis.sum())},
        "token_mask": {"low": mask_low, "high": mask_high, "token_share": float((~keep).mean()), "tokens": int((~keep).sum()),
                       "sequence_share": float(seq_masked_tok.mean()), "sequences": int(seq_masked_tok.sum())},
        "sequence_mask": {"clip_max": TRL_SEQUENCE_CLIP_MAX, "clip_min": None,
                          "sequence_share": float((~seq_keep).mean()), "sequences": int((~seq_keep).sum()),
                          "token_share": float(seq_tokens[~seq_keep].sum() / seq_tokens.sum()),
                          "tokens": int(seq_tokens[~seq_keep].sum())},
    }


def trap_stats(steps: Sequence[Any], *, mask_low: float = 0.5, mask_high: float = 2.0) -> dict[str, Any]:
    """The raw-denominator trap over the steps with a non-identity transform and recorded raw log-probs."""
    use = [s for s in steps if s.transformed and s.behaviour_raw is not None]
    out: dict[str, Any] = {"steps": len(use), "tokens": int(sum(len(s.token_ids) for s in use))}
    if not use:
        out["note"] = "no step with a non-identity sampling transform and recorded raw log-probs"
        return out
    wrong = np.concatenate([s.recomputed_processed - s.behaviour_raw for s in use])
    right = np.concatenate([s.recomputed_raw - s.behaviour_raw for s in use])
    outside = np.concatenate([np.isneginf(s.recomputed_processed) for s in use])
    with np.errstate(over="ignore"):
        wrong_r, right_r = np.exp(wrong), np.exp(right)
    configs = sorted({tuple(sorted((k, s.sampling.get(k)) for k in ("temperature", "top_p", "top_k", "min_p", "order")))
                      for s in use}, key=str)
    out.update({
        "sampling": [dict(c) for c in configs],
        "outside_support": int(outside.sum()),
        "outside_support_share": float(outside.mean()),
        "trap_ratio_quantiles": quantiles(wrong_r), "matched_ratio_quantiles": quantiles(right_r),
        "trap_token_mask_share": float((~token_mask_keep(wrong_r, mask_low, mask_high)).mean()),
        "matched_token_mask_share": float((~token_mask_keep(right_r, mask_low, mask_high)).mean()),
    })
    return out


def analyze(steps: Sequence[Any], *, clip: float = 2.0, mask_low: float = 0.5, mask_high: float = 2.0,
            top: int = 10, decode: Callable[[int], str] | None = None) -> dict[str, Any]:
    """The whole report as a dict: per logprob kind (`kinds`), and the trap (`trap`)."""
    kinds: dict[str, Any] = {}
    for kind in ("processed", "raw"):
        sel = [s for s in steps if s.logprob_kind == kind]
        if sel:
            kinds[kind] = kind_stats(sel, clip=clip, mask_low=mask_low, mask_high=mask_high, top=top, decode=decode)
    # Processed-kind steps that also recorded raw log-probs give a raw-vs-raw comparison too.
    extra = [s for s in steps if s.logprob_kind == "processed" and s.behaviour_raw is not None]
    if extra:
        as_raw = [replace(s, logprob_kind="raw", behaviour=s.behaviour_raw) for s in extra]
        kinds["raw (recorded beside processed)"] = kind_stats(as_raw, clip=clip, mask_low=mask_low, mask_high=mask_high,
                                                              top=top, decode=decode)
    return {"kinds": kinds, "trap": trap_stats(steps, mask_low=mask_low, mask_high=mask_high)}
