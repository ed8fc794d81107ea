"""`measure(logs, ...)`: score the logs, analyze, and return the report dict with its header.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from ctxkit.training.mismatch.scoring import ScoredStep, score_logs
from ctxkit.training.mismatch.stats import analyze

__all__ = ["MismatchResult", "measure"]


@dataclass(frozen=True)
class MismatchResult:
    """A measured mismatch: the JSON-able report and the scored steps it was computed from."""

    report: dict
    """`{"header": ..., "kinds": ..., "trap": ...}` (see `ctxkit.training.mismatch.stats.analyze`)."""
    steps: tuple[ScoredStep, ...]
    """Every scored step, in log order."""


def measure(logs: Sequence[str | os.PathLike], *, model: Any = None, device: str = "cpu", dtype: str = "float32",
            clip: float = 2.0, mask_low: float = 0.5, mask_high: float = 2.0, top: int = 10,
            order: str | None = None) -> MismatchResult:
    """Re-score every sampled token of `logs` with `model` (None: SmolLM2-135M) and analyze the mismatch.

    `order`: recompute processed log-probs in this transform order instead of each step's recorded one."""
    lm, steps, skipped = score_logs(logs, model=model, device=device, dtype=dtype, order=order)
    tok = lm.hf_tokenizer

    def decode(tid: int) -> str:
        return tok.decode([tid], skip_special_tokens=False)

    report = analyze(steps, clip=clip, mask_low=mask_low, mask_high=mask_high, top=top, decode=decode)
    header = {"model": lm.id, "model_path": lm.path, "device": lm.device, "dtype": lm.dtype,
              "logs": len(logs), "order_override": order, "steps": len(steps), "skipped": skipped,
              "tokens": int(sum(len(s.token_ids) for s in steps))}
    return MismatchResult(report={"header": header, **report}, steps=tuple(steps))
