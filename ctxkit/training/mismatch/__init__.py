"""Measure the log-prob mismatch between the engine that sampled and a trainer-side recompute.

`measure(logs, model=..., device=..., dtype=...)` replays each step's context from the log, re-scores the
sampled tokens with a `transformers` forward pass under the recorded sampling transform, and returns the
report (`render_text` for markdown, `write_plot` for a PNG). Modules: `scoring` (replay + forward pass),
`stats` (quantiles, buckets, correction shares, the trap), `attribution` (the cause of each out-of-bounds token),
`report` (text, plot), `measure` (the whole).

"""

from ctxkit.training.mismatch.attribution import attribute
from ctxkit.training.mismatch.measure import MismatchResult, measure
from ctxkit.training.mismatch.report import render_text, write_plot
from ctxkit.training.mismatch.scoring import ScoredStep, processed_logprobs, score_logs
from ctxkit.training.mismatch.stats import analyze, quantiles

__all__ = ["MismatchResult", "ScoredStep", "analyze", "attribute", "measure", "processed_logprobs", "quantiles", "render_text",
           "score_logs", "write_plot"]
