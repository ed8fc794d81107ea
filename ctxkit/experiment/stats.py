"""Statistics for the A/B report: quantiles, paired bootstrap confidence intervals, the pipelining bound.

All numpy, all seeded: the same results give the same report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

import numpy as np

__all__ = ["quantiles", "BootstrapCI", "paired_bootstrap", "StageBound", "stage_bound", "rate"]

QUANTILES: tuple[int, ...] = (50, 90, 99)
"""Percentiles reported for tokens and latency."""


def quantiles(values: Sequence[float], qs: Sequence[int] = QUANTILES) -> dict[str, float | None]:
    """`{"p50": ..., "p90": ..., "p99": ...}` (linear interpolation, numpy's default); None when empty."""
    if len(values) == 0:
        return {f"p{q}": None for q in qs}
    arr = np.asarray(values, dtype=float)
    return {f"p{q}": float(np.percentile(arr, q)) for q in qs}


def rate(flags: Sequence[bool]) -> float | None:
    """Fraction of true flags; None when empty."""
    return None if len(flags) == 0 else float(np.mean(np.asarray(flags, dtype=float)))


@dataclass(frozen=True)
class BootstrapCI:
    """Mean paired difference (arm minus baseline) with a percentile bootstrap interval."""

    mean_diff: float | None
    """Observed mean of the per-pair differences (None without pairs)."""
    low: float | None
    """Lower bound of the interval."""
    high: float | None
    """Upper bound of the interval."""
    n_pairs: int
    """Pairs present under both arms."""
    confidence: float
    """Interval coverage, e.g. 0.95."""
    n_resamples: int
    """Bootstrap resamples drawn."""

    def excludes_zero(self) -> bool:
        """Whether the interval lies entirely on one side of zero."""
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)


def paired_bootstrap(
    baseline: Mapping[Hashable, float],
    arm: Mapping[Hashable, float],
    *,
    n_resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> BootstrapCI:
    """Bootstrap CI of `mean(arm[k] - baseline[k])` over the keys present in both (pairs resampled whole).

    Keys are sorted before resampling so the result does not depend on dict order.
    """
    keys = sorted((k for k in arm if k in baseline), key=repr)
    n = len(keys)
    if n == 0:
        return BootstrapCI(None, None, None, 0, confidence, n_resamples)
    diffs = np.array([float(arm[k]) - float(baseline[k]) for k in keys], dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_resamples, n))
    means = diffs[idx].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.percentile(means, [100 * alpha, 100 * (1 - alpha)])
    return BootstrapCI(float(diffs.mean()), float(low), float(high), n, confidence, n_resamples)


@dataclass(frozen=True)
class StageBound:
    """Serial time of a pipeline's stages against its steady-state bound if stages overlapped across batches."""

    serial_s: float
    """Sum of every stage and the non-overlappable time (stages run one after another)."""
    bound_s: float
    """Largest overlappable stage plus the non-overlappable time (stages of different batches in parallel)."""
    speedup: float
    """`serial_s / bound_s` (1.0 when both are zero)."""
    bottleneck: str | None
    """Name of the largest overlappable stage."""


def stage_bound(stages: Mapping[str, float], serial: Mapping[str, float] | None = None) -> StageBound:
    """Serial sum and overlapped bound of `stages` (overlappable) plus `serial` (e.g. weight sync).

    Stages of 30, 10 and 20 s with a 5 s sync: 65 s serial, 35 s bound, 1.857x.
    """
    serial = serial or {}
    fixed = float(sum(serial.values()))
    total = float(sum(stages.values())) + fixed
    bottleneck = max(stages, key=lambda k: stages[k]) if stages else None
    bound = (float(stages[bottleneck]) if bottleneck else 0.0) + fixed
    return StageBound(total, bound, total / bound if bound > 0 else 1.0, bottleneck)
