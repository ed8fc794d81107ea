"""The mismatch report as text (markdown tables), and as a matplotlib plot.

Both read the dict `ctxkit.training.mismatch.stats.analyze` returns (plus the header the command adds: model,
device, dtype, logs). matplotlib is imported inside `write_plot` only (Agg backend, no display).

"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from ctxkit.training.mismatch.attribution import render_attribution

__all__ = ["render_text", "write_plot"]


def _num(x: Any, fmt: str = ".4g") -> str:
    return "-" if x is None else format(x, fmt)


def _qrow(name: str, q: Mapping[str, Any], fmt: str) -> str:
    return f"| {name} | " + " | ".join(_num(v, fmt) for v in q.values()) + " |"


def _kind_text(kind: str, k: Mapping[str, Any]) -> list[str]:
    lines = [f"### logprob kind: {kind} ({k['steps']} sequences, {k['tokens']} tokens)", ""]
    keys = list(k["diff_quantiles"])
    lines += ["| | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    lines.append(_qrow("diff (recomputed - behaviour)", k["diff_quantiles"], ".3g"))
    lines.append(_qrow("ratio", k["ratio_quantiles"], ".5g"))
    lines += ["", f"max |diff| {_num(k['max_abs_diff'], '.3g')}; non-finite diffs {k['non_finite_diffs']}", ""]
    t, m, s = k["tis"], k["token_mask"], k["sequence_mask"]
    lines += [
        "| correction | tokens touched | sequences touched |", "|---|---|---|",
        f"| TIS, ratio > {t['clip']:g} | {t['tokens']} ({t['token_share']:.2%}) | {t['sequences']} ({t['sequence_share']:.2%}) |",
        f"| token mask, ratio outside [{m['low']:g}, {m['high']:g}] | {m['tokens']} ({m['token_share']:.2%}) | "
        f"{m['sequences']} ({m['sequence_share']:.2%}) |",
        f"| TRL sequence_mask, seq ratio > {s['clip_max']:g} | {s['tokens']} ({s['token_share']:.2%}) | {s['sequences']} ({s['sequence_share']:.2%}) |",
        "",
    ]
    for title, rows in (("position", k["by_position"]), ("sequence length", k["by_sequence_length"])):
        lines += [f"| {title} | tokens | mean abs diff | ratio p1 | ratio p50 | ratio p99 | TIS share |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['bucket']} | {r['tokens']} | {_num(r['mean_abs_diff'], '.3g')} | {_num(r['ratio_p1'], '.4g')} | "
                         f"{_num(r['ratio_p50'], '.5g')} | {_num(r['ratio_p99'], '.4g')} | {r['tis_share']:.2%} |")
        lines.append("")
    lines += ["| extreme | arm | position | token | behaviour | recomputed | ratio | where |", "|---|" + "---|" * 7]
    for i, e in enumerate(k["extremes"], 1):
        text = repr(e["text"]) if e["text"] is not None else str(e["token_id"])
        arms = ", ".join(e["arms"]).replace("|", "¦") or "-"
        lines.append(f"| {i} | {arms} | {e['position']} | {text.replace('|', '¦')} ({e['token_id']}) | "
                     f"{_num(e['behaviour'], '.6f')} | {_num(e['recomputed'], '.6f')} | {_num(e['ratio'], '.6g')} | "
                     f"{os.path.basename(e['log'])} step {e['step']} |")
    lines.append("")
    return lines


def render_text(report: Mapping[str, Any]) -> str:
    """The report as markdown: a header, one section per logprob kind, the attribution (when the report has
    one), then the trap."""
    head = report.get("header", {})
    lines = ["## log-prob mismatch: behaviour vs trainer recompute", ""]
    if head:
        lines += [f"model {head.get('model')} on {head.get('device')} ({head.get('dtype')}); "
                  f"{head.get('logs')} log(s), {head.get('steps')} steps scored, {head.get('skipped')} skipped"
                  + (f"; processed log-probs recomputed in the {head['order_override']} order, not the recorded one"
                     if head.get("order_override") else ""), ""]
    for kind, k in report["kinds"].items():
        lines += _kind_text(kind, k)
    if report.get("attribution"):
        lines += render_attribution(report["attribution"])
    trap = report["trap"]
    lines += ["### the raw-denominator trap (processed recompute / raw behaviour)", ""]
    if not trap["steps"]:
        lines += [trap.get("note", "no steps"), ""]
        return "\n".join(lines)
    cfgs = "; ".join(", ".join(f"{k}={v}" for k, v in c.items() if v is not None) for c in trap["sampling"])
    keys = list(trap["trap_ratio_quantiles"])
    lines += [f"{trap['steps']} steps, {trap['tokens']} tokens sampled with {cfgs}", "",
              "| ratio | " + " | ".join(keys) + " | token mask share |", "|---|" + "---|" * (len(keys) + 1),
              _qrow("trap: exp(processed recompute - raw behaviour)", trap["trap_ratio_quantiles"], ".4g")
              + f" {trap['trap_token_mask_share']:.2%} |",
              _qrow("matched: exp(raw recompute - raw behaviour)", trap["matched_ratio_quantiles"], ".4g")
              + f" {trap['matched_token_mask_share']:.2%} |", "",
              f"sampled tokens outside the trainer's kept support (processed log-prob -inf): "
              f"{trap['outside_support']} of {trap['tokens']} ({trap['outside_support_share']:.2%})", ""]
    return "\n".join(lines)


def write_plot(report: Mapping[str, Any], scored: Any, path: str | os.PathLike) -> None:
    """Save a PNG: per kind, the histogram of `diff` and `diff` against context position."""
    import matplotlib  # lazy: matplotlib loads on first use

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib loads on first use

    kinds = [k for k in ("processed", "raw") if any(s.logprob_kind == k for s in scored)]
    fig, axes = plt.subplots(len(kinds) or 1, 2, figsize=(11, 3.6 * max(1, len(kinds))), squeeze=False)
    for row, kind in enumerate(kinds):
        steps = [s for s in scored if s.logprob_kind == kind]
        diffs = np.concatenate([s.recomputed - s.behaviour for s in steps])
        pos = np.concatenate([s.context_length + np.arange(len(s.token_ids)) for s in steps])
        fin = np.isfinite(diffs)
        ax = axes[row][0]
        ax.hist(diffs[fin], bins=80, color="tab:blue")
        ax.set_yscale("log")
        ax.set_xlabel("recomputed - behaviour log-prob")
        ax.set_ylabel("tokens")
        ax.set_title(f"{kind}: {fin.sum()} tokens")
        ax = axes[row][1]
        ax.scatter(pos[fin], diffs[fin], s=4, alpha=0.5, color="tab:orange")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xlabel("position in the sequence")
        ax.set_ylabel("recomputed - behaviour")
        ax.set_title(f"{kind}: difference by position")
    head = report.get("header", {})
    fig.suptitle(f"log-prob mismatch: {head.get('model', '')} ({head.get('dtype', '')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
