"""`measure(logs, ...)`: score the logs, analyze, and return the report dict with its header.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from ctxkit.training.context_replay import load_events
from ctxkit.training.mismatch.attribution import DEFAULT_BOUNDARY_TOKENS, attribute
from ctxkit.training.mismatch.scoring import ScoredStep, score_logs
from ctxkit.training.mismatch.stats import analyze

__all__ = ["MismatchResult", "measure"]


@dataclass(frozen=True)
class MismatchResult:
    """A measured mismatch: the JSON-able report and the scored steps it was computed from."""

    report: dict
    """`{"header": ..., "kinds": ..., "trap": ..., "attribution": ...}` (see `ctxkit.training.mismatch.stats.analyze`
    and `ctxkit.training.mismatch.attribution.attribute`)."""
    steps: tuple[ScoredStep, ...]
    """Every scored step, in log order."""


def measure(logs: Sequence[str | os.PathLike], *, model: Any = None, device: str = "cpu", dtype: str = "float32",
            clip: float = 2.0, mask_low: float = 0.5, mask_high: float = 2.0, top: int = 10,
            order: str | None = None, policy_version: str | int | None = None,
            boundary_tokens: int = DEFAULT_BOUNDARY_TOKENS) -> MismatchResult:
    """Re-score every sampled token of `logs` with `model` (None: SmolLM2-135M) and analyze the mismatch.

    `order`: recompute processed log-probs in this transform order instead of each step's recorded one.
    `policy_version` / `boundary_tokens`: of the attribution (`attribute`); `policy_version="scorer"` means the
    scoring model's id (`LoadedLM.id`, what the transformers agent records by default); None: lag not checked."""
    lm, steps, skipped = score_logs(logs, model=model, device=device, dtype=dtype, order=order)
    tok = lm.hf_tokenizer

    def decode(tid: int) -> str:
        return tok.decode([tid], skip_special_tokens=False)

    report = analyze(steps, clip=clip, mask_low=mask_low, mask_high=mask_high, top=top, decode=decode)
    version = lm.id if policy_version == "scorer" else policy_version
    events = {str(log): load_events(log)[0] for log in logs}
    report["attribution"] = attribute(steps, events, clip=clip, mask_low=mask_low, mask_high=mask_high,
                                      policy_version=version, boundary_tokens=boundary_tokens)
    header = {"model": lm.id, "model_path": lm.path, "device": lm.device, "dtype": lm.dtype,
              "logs": len(logs), "order_override": order, "steps": len(steps), "skipped": skipped,
              "tokens": int(sum(len(s.token_ids) for s in steps))}
    return MismatchResult(report={"header": header, **report}, steps=tuple(steps))
