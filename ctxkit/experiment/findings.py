"""What an ablation shows, in words computed from its numbers: arms that cannot complete, the quality-vs-tokens
frontier, arms that showed the policy identical contexts, and the findings that open `report.md`.

An arm *cannot complete* when more than `CUT_SHORT_SHARE` of its episodes end `truncated` (a limit cut them:
the context budget or window, the generation limit, steps, wall time, a harness error). Its episodes stop
early, so its fewer prompt tokens, tool calls and seconds are not savings: the report gives it a note, no
saving figure and no significance star on those columns, and leaves it off the plot's frontier.

Pure functions of a `report.summarize` result (or of results rows for `cut_short`): the same results give
the same words.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

from ctxkit.experiment.stats import BootstrapCI

__all__ = ["CUT_SHORT_SHARE", "COST_LABELS", "OUTCOME_LABELS", "fmt_number", "fmt_ci", "cut_short", "cannot_complete",
           "completion_note", "baseline_cut_note", "savings_comparable", "frontier", "findings"]

CUT_SHORT_SHARE = 0.5
"""An arm whose share of `truncated` episodes is above this (a strict majority) cannot complete."""

COST_LABELS: tuple[str, ...] = ("prompt tokens", "tool calls", "wall s")
"""`report.COMPARED` labels that measure cost: a lower value is a saving only when both arms run to their end."""

OUTCOME_LABELS: tuple[str, ...] = ("quality", "completion", "violations")
"""`report.COMPARED` labels that measure the result; reported for every arm, cut short or not."""


def fmt_number(x: Any, digits: int = 3) -> str:
    """A number for a table: thousands separators, `digits` decimals without trailing zeros."""
    if x is None:
        return "–"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) < 1e-3:
        return f"{x:.2g}"
    if abs(x) >= 1000 or digits == 0:
        return f"{x:,.0f}"
    text = f"{x:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt_ci(ci: BootstrapCI, digits: int = 3) -> str:
    """`mean [low, high]` of a paired interval (`–` without pairs)."""
    if ci.mean_diff is None:
        return "–"
    return f"{fmt_number(ci.mean_diff, digits)} [{fmt_number(ci.low, digits)}, {fmt_number(ci.high, digits)}]"


def _signed(x: float, digits: int = 3) -> str:
    return ("+" if x > 0 else "") + fmt_number(x, digits)


def cut_short(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How many of one arm's episodes a limit cut: `{"episodes", "truncated", "causes": {cause: count},
    "cannot_complete"}` (`cannot_complete`: more than `CUT_SHORT_SHARE` of the episodes truncated)."""
    cut = [r for r in rows if r["outcome"] == "truncated"]
    causes = Counter(str(r["cause"]) for r in cut)
    return {"episodes": len(rows), "truncated": len(cut),
            "causes": dict(sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))),
            "cannot_complete": bool(rows) and len(cut) > CUT_SHORT_SHARE * len(rows)}


def cannot_complete(summary: Mapping[str, Any]) -> list[str]:
    """The arms flagged as unable to complete, in report order."""
    return [a for a in summary["arms"] if summary["per_arm"][a]["cut_short"]["cannot_complete"]]


def _causes(cut: Mapping[str, Any]) -> str:
    """A `cut_short` result's truncation causes as `cause: count, ...`."""
    return ", ".join(f"{k}: {v}" for k, v in cut["causes"].items())


def completion_note(entry: Mapping[str, Any]) -> str:
    """The Arms table's note for one arm (`summary["per_arm"][arm]`): empty unless it cannot complete."""
    c = entry["cut_short"]
    if not c["cannot_complete"]:
        return ""
    return f"cannot complete: {c['truncated']}/{c['episodes']} episodes truncated ({_causes(c)}); fewer tokens are not a saving"


def baseline_cut_note(base: str, entry: Mapping[str, Any]) -> str:
    """The finding for a baseline that some limit cut short without it being unable to complete (a minority of
    its episodes truncated): empty when none was. A reference every episode completes under has none."""
    c = entry["cut_short"]
    if not c["truncated"] or c["cannot_complete"]:
        return ""
    return (f"- The baseline `{base}` was cut short on {c['truncated']}/{c['episodes']} episodes ({_causes(c)}): it is "
            "not a reference every episode completes under, so a gain against it can be its own failure (give it a "
            "budget and limits at which it finishes to compare against no compression).")


def savings_comparable(summary: Mapping[str, Any], arm: str) -> bool:
    """Whether `arm`'s cost differences against the baseline can be read as savings: both run to their end."""
    per = summary["per_arm"]
    return not per[arm]["cut_short"]["cannot_complete"] and not per[summary["baseline"]]["cut_short"]["cannot_complete"]


def frontier(summary: Mapping[str, Any]) -> list[str]:
    """Arms on the quality-vs-tokens frontier, by mean prompt tokens: arms that complete and that no other
    completing arm beats on both (no more tokens and at least the quality, one of them strictly)."""
    per = summary["per_arm"]
    pts = {a: (per[a]["prompt_tokens_mean"], per[a]["quality"]) for a in summary["arms"]
           if not per[a]["cut_short"]["cannot_complete"]}

    def dominated(a: str) -> bool:
        x, y = pts[a]
        return any(bx <= x and by >= y and (bx < x or by > y) for b, (bx, by) in pts.items() if b != a)

    return sorted((a for a in pts if not dominated(a)), key=lambda a: (pts[a][0], -pts[a][1], a))


def _outcome_claims(summary: Mapping[str, Any], arm: str) -> list[str]:
    claims = []
    for label in OUTCOME_LABELS:
        ci = summary["diffs"][arm][label]
        if ci.excludes_zero():
            claims.append(f"{label} {_signed(ci.mean_diff)} [{fmt_number(ci.low)}, {fmt_number(ci.high)}]")
    overall = summary["diffs"][arm]["quality"]
    for task, cis in summary.get("per_task_diffs", {}).items():  # a task's effect, unless the overall one says it
        ci = cis.get(arm)
        if ci is not None and ci.excludes_zero() and not (overall.excludes_zero() and ci.mean_diff == overall.mean_diff):
            claims.append(f"quality on `{task}` {_signed(ci.mean_diff)} [{fmt_number(ci.low)}, {fmt_number(ci.high)}]")
    return claims


def _cost_claims(summary: Mapping[str, Any], arm: str) -> list[str]:
    per, base = summary["per_arm"], summary["baseline"]
    claims = []
    tok = summary["diffs"][arm]["prompt tokens"]
    if tok.excludes_zero():
        base_mean = per[base]["prompt_tokens_mean"]
        share = f", {_signed(100 * tok.mean_diff / base_mean, 1)}% of the baseline's" if base_mean else ""
        verb = "saves" if tok.mean_diff < 0 else "uses"
        more = "" if tok.mean_diff < 0 else " more"
        claims.append(f"{verb} {fmt_number(abs(tok.mean_diff), 0)}{more} prompt tokens per episode "
                      f"({fmt_ci(tok, 0)}{share})")
    calls = summary["diffs"][arm]["tool calls"]
    if calls.excludes_zero():
        claims.append(f"{fmt_number(abs(calls.mean_diff), 2)} {'fewer' if calls.mean_diff < 0 else 'more'} tool calls "
                      f"per episode ({fmt_ci(calls, 2)})")
    wall = summary["diffs"][arm]["wall s"]
    if wall.excludes_zero():
        claims.append(f"{fmt_number(abs(wall.mean_diff), 2)} s {'less' if wall.mean_diff < 0 else 'more'} wall time "
                      f"per episode ({fmt_ci(wall, 2)})")
    return claims


def same_contexts_note(pair: Mapping[str, Any]) -> str:
    """The finding for two arms that showed the policy identical contexts (a `SameContexts` as a dict)."""
    return (f"- `{pair['first']}` and `{pair['second']}` showed the policy identical contexts at every decision "
            f"({pair['episodes']} of {pair['episodes']} shared episodes, {pair['decisions']} decisions, equal context "
            "hashes): here they are one context policy, and their difference measures nothing between them.")


def findings(summary: Mapping[str, Any]) -> list[str]:
    """The `## Findings` section (markdown lines) that opens the report: per arm against the baseline, the
    quality, completion and violation differences whose interval excludes zero (overall, and per task where a
    task's differs from the overall one), the cost differences of arms that complete (savings), and the arms
    that cannot complete (for the baseline, also any episode it did not finish); arms that showed identical
    contexts (`summary["same_contexts"]`, when given); then the frontier."""
    arms, per, base = summary["arms"], summary["per_arm"], summary["baseline"]
    if not arms:
        return ["## Findings", "", "No episodes.", ""]
    conf = int(round(100 * summary.get("confidence", 0.95)))
    out = ["## Findings", "",
           f"Computed from the tables below: arm minus baseline `{base}`, mean over pairs (same task and seed) "
           f"with its {conf}% paired interval; only differences whose interval excludes zero are named.", ""]
    flagged = cannot_complete(summary)
    if base in flagged:
        out.append(f"- The baseline `{base}` {completion_note(per[base])}: no cost difference against it is a "
                   "saving, so none is claimed.")
    elif note := baseline_cut_note(base, per[base]):
        out.append(note)
    for arm in arms:
        if arm == base:
            continue
        outcome = _outcome_claims(summary, arm)
        parts = ["; ".join(outcome) if outcome else "no significant difference in quality, completion or violations"]
        if per[arm]["cut_short"]["cannot_complete"]:
            parts.append(completion_note(per[arm]) + " (its token, tool-call and wall-time differences are left out)")
        elif savings_comparable(summary, arm):
            cost = _cost_claims(summary, arm)
            parts.append("; ".join(cost) if cost else "no significant difference in prompt tokens, tool calls or wall time")
        out.append(f"- `{arm}`: " + "; ".join(parts) + ".")
    if flagged:
        out.append("- Cannot complete (a majority of episodes truncated; no savings claimed, hollow markers off the "
                   "frontier in the plot): " + ", ".join(f"`{a}`" for a in flagged) + ".")
    else:
        out.append("- Every arm completes (no arm has a majority of truncated episodes).")
    out += [same_contexts_note(p) for p in summary.get("same_contexts", ())]
    front = frontier(summary)
    if front:
        out.append("- Quality-vs-tokens frontier among arms that complete, fewest tokens first: "
                   + ", ".join(f"`{a}` ({fmt_number(per[a]['quality'])} at {fmt_number(per[a]['prompt_tokens_mean'], 0)} "
                               "tokens)" for a in front) + ".")
    return out + [""]
