"""Mismatch attribution: which cause each token outside the TIS / token-mask bounds sits on.

A token is *out of bounds* when truncated IS touches it (`ratio > clip`) or the token mask drops it (`ratio`
outside `[mask_low, mask_high]`), `ratio = exp(recomputed - behaviour)` of the step's own logprob kind, as
`ctxkit.training.mismatch.stats` defines them. Each such token gets exactly one cause, the first that holds
in this fixed order (`CAUSES`):

1. `policy_version_lag`: a scorer version is given and the step's `Step.policy_version` is recorded and
   differs from it (compared as text): the trainer scores other weights than the ones that sampled.
2. `outside_kept_set`: the token sits outside a sampler's kept support, or the two supports differ: the
   step's recorded `Step.kept_set` lists its ids at that position and the token is not among them; or, on a
   `processed` step, the trainer-side processed log-prob is `-inf` (the trainer's top-k / top-p / min-p cut
   it), or the recorded support size differs from the trainer's (`ScoredStep.recomputed_support`), so the two
   renormalize over different sets.
3. `drift:<reason>`: the token lies in a drift of its turn (`ScoredStep.drift_spans`: a later context's
   template re-rendering would tokenize it differently), `<reason>` the drift's typed reason
   (`ctxkit.text.rendering.drift_reasons`; `unexplained` when no rule applies).
4. `compaction_boundary`: the step is the first one after a `Compaction` with edits (between the previous
   step and this one in its log), and the token is among its first `boundary_tokens` sampled tokens: the
   first tokens the policy drew from the compacted context.
5. `engine_numerics`: none of the above: the two forward passes disagree on the same inputs (kernels,
   dtype, batch shape).

`attribute(steps, events, ...)` is pure: scored steps plus each log's events in, a JSON-able dict out (per
logprob kind, one row per cause: tokens, share of the out-of-bounds tokens, mean |log-ratio| over the finite
ones). `render_attribution` turns it into a markdown table.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ctxkit.errors import ConfigError
from ctxkit.events import Compaction, Step
from ctxkit.training.rl_masks import tis_touched, token_mask_keep

__all__ = ["CAUSES", "DEFAULT_BOUNDARY_TOKENS", "attribute", "cause_of", "render_attribution"]

CAUSES: tuple[str, ...] = ("policy_version_lag", "outside_kept_set", "drift", "compaction_boundary", "engine_numerics")
"""The causes in priority order (`drift` stands for every `drift:<reason>`)."""

DEFAULT_BOUNDARY_TOKENS = 16
"""Default `boundary_tokens`: how many first tokens of the first step after a compaction count as at its boundary."""


def _step_facts(events: Sequence[Any]) -> dict[int, tuple[Step, bool]]:
    """Step seq -> (the step, whether a compaction with edits came between the previous step and it)."""
    out: dict[int, tuple[Step, bool]] = {}
    compacted = False
    for event in events:
        if isinstance(event, Compaction) and event.edits:
            compacted = True
        elif isinstance(event, Step):
            if event.seq is not None:
                out[int(event.seq)] = (event, compacted)
            compacted = False
    return out


def cause_of(scored: Any, step: Step | None, index: int, *, after_compaction: bool, policy_version: Any = None,
             boundary_tokens: int = DEFAULT_BOUNDARY_TOKENS) -> str:
    """The cause of token `index` of `scored` (a `ScoredStep`) sampled by `step` (its `Step` event, None when
    unknown), in the priority order of `CAUSES`."""
    recorded = step.policy_version if step is not None else None
    if policy_version is not None and recorded is not None and str(recorded) != str(policy_version):
        return "policy_version_lag"
    kept = step.kept_set if step is not None else None
    if kept is not None and index < len(kept) and kept.holds(index, scored.token_ids[index]) is False:
        return "outside_kept_set"
    if scored.logprob_kind == "processed":
        if np.isneginf(scored.recomputed_processed[index]):
            return "outside_kept_set"
        support = scored.recomputed_support
        if kept is not None and support is not None and index < len(kept) and int(support[index]) != kept.sizes[index]:
            return "outside_kept_set"
    for start, end, reason in scored.drift_spans:
        if start <= index < end:
            return f"drift:{reason}"
    if after_compaction and index < boundary_tokens:
        return "compaction_boundary"
    return "engine_numerics"


def _order(cause: str) -> tuple[int, str]:
    head = cause.split(":", 1)[0]
    return (CAUSES.index(head) if head in CAUSES else len(CAUSES), cause)


def _kind(steps: Sequence[Any], facts: Mapping[str, dict[int, tuple[Step, bool]]], *, clip: float, mask_low: float,
          mask_high: float, policy_version: Any, boundary_tokens: int) -> dict[str, Any]:
    found: dict[str, list[float]] = {c: [] for c in CAUSES if c != "drift"}
    total = out = kept_steps = 0
    for s in steps:
        diffs = np.asarray(s.recomputed, dtype=np.float64) - s.behaviour
        with np.errstate(over="ignore"):
            ratios = np.exp(diffs)
        outside = tis_touched(ratios, clip) | ~token_mask_keep(ratios, mask_low, mask_high)
        step, after = facts.get(s.log, {}).get(int(s.seq), (None, False))
        kept_steps += int(step is not None and step.kept_set is not None)
        total += len(diffs)
        for i in np.flatnonzero(outside):
            cause = cause_of(s, step, int(i), after_compaction=after, policy_version=policy_version,
                             boundary_tokens=boundary_tokens)
            found.setdefault(cause, []).append(float(diffs[i]))
            out += 1
    rows = []
    for cause in sorted(found, key=_order):
        d = np.asarray(found[cause], dtype=np.float64)
        fin = d[np.isfinite(d)]
        rows.append({"cause": cause, "tokens": int(d.size), "share": float(d.size / out) if out else 0.0,
                     "mean_abs_log_ratio": float(np.abs(fin).mean()) if fin.size else None,
                     "non_finite": int(d.size - fin.size)})
    return {"steps": len(steps), "tokens": total, "out_of_bounds": out, "steps_with_kept_set": kept_steps, "rows": rows}


def attribute(steps: Sequence[Any], events: Mapping[str, Sequence[Any]], *, clip: float = 2.0, mask_low: float = 0.5,
              mask_high: float = 2.0, policy_version: Any = None,
              boundary_tokens: int = DEFAULT_BOUNDARY_TOKENS) -> dict[str, Any]:
    """Attribute every out-of-bounds token of `steps` (`ScoredStep`s) to one cause (see the module docstring).

    `events`: each log's events, by the log path the steps name (`ScoredStep.log`); a step whose log or seq is
    missing is attributed without its `Step` (no version, no kept set, no compaction). `policy_version`: the
    version the trainer holds (None: lag is not checked). Returns `{"priority", "clip", "mask_low",
    "mask_high", "policy_version", "boundary_tokens", "kinds": {kind: {"steps", "tokens", "out_of_bounds",
    "steps_with_kept_set", "rows": [{"cause", "tokens", "share", "mean_abs_log_ratio", "non_finite"}]}}}`,
    rows in priority order, every fixed cause listed (0 tokens included), one `drift:<reason>` row per
    reason found."""
    if isinstance(boundary_tokens, bool) or not isinstance(boundary_tokens, int) or boundary_tokens < 0:
        raise ConfigError(f"mismatch attribution: boundary_tokens={boundary_tokens!r}; expected an integer >= 0")
    facts = {str(log): _step_facts(evs) for log, evs in events.items()}
    kinds = {}
    for kind in ("processed", "raw"):
        sel = [s for s in steps if s.logprob_kind == kind]
        if sel:
            kinds[kind] = _kind(sel, facts, clip=clip, mask_low=mask_low, mask_high=mask_high,
                                policy_version=policy_version, boundary_tokens=boundary_tokens)
    return {"priority": list(CAUSES), "clip": clip, "mask_low": mask_low, "mask_high": mask_high,
            "policy_version": None if policy_version is None else str(policy_version),
            "boundary_tokens": boundary_tokens, "kinds": kinds}


def render_attribution(att: Mapping[str, Any]) -> list[str]:
    """The attribution as markdown lines: one table per logprob kind."""
    version = att.get("policy_version")
    lines = ["### mismatch attribution: tokens outside the TIS / token-mask bounds, by cause", "",
             f"out of bounds: ratio > {att['clip']:g} or outside [{att['mask_low']:g}, {att['mask_high']:g}]; one cause "
             f"per token, first that holds in the order {' > '.join(att['priority'])}; policy version "
             + (f"{version}" if version is not None else "not given (lag not checked)")
             + f"; compaction boundary = first {att['boundary_tokens']} tokens of the first step after a compaction", ""]
    for kind, k in att["kinds"].items():
        lines += [f"{kind}: {k['out_of_bounds']} of {k['tokens']} tokens out of bounds; kept set recorded on "
                  f"{k['steps_with_kept_set']} of {k['steps']} steps", "",
                  "| cause | tokens | share | mean abs log-ratio |", "|---|---|---|---|"]
        for r in k["rows"]:
            mean = "-" if r["mean_abs_log_ratio"] is None else format(r["mean_abs_log_ratio"], ".3g")
            if r["non_finite"]:
                mean += f" ({r['non_finite']} infinite)"
            lines.append(f"| {r['cause']} | {r['tokens']} | {r['share']:.2%} | {mean} |")
        lines.append("")
    return lines
