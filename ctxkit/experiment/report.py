"""The A/B report: per-arm tables, paired bootstrap CIs against the baseline, where time goes, plots (L4).

`summarize(rows, baseline=...)` computes everything from results rows (pure); `write_report(run_dir)`
reads `results.jsonl` and `run.json` and writes `report.md`, `quality_vs_tokens.png` and
`latency_breakdown.png` (matplotlib, Agg backend). `ctxkit report DIR` calls `write_report`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ctxkit.errors import ConfigError
from ctxkit.experiment.stats import paired_bootstrap, quantiles, rate, stage_bound

__all__ = ["summarize", "render_markdown", "write_report", "COMPARED", "PLOTS"]

COMPARED: tuple[tuple[str, str], ...] = (
    ("quality", "quality"),
    ("completed", "completion"),
    ("violations", "violations"),
    ("prompt_tokens_total", "prompt tokens"),
    ("tool_calls", "tool calls"),
    ("timing.wall_s", "wall s"),
)
"""(row field, label) of the metrics compared against the baseline with paired CIs."""

PLOTS: tuple[str, ...] = ("quality_vs_tokens.png", "latency_breakdown.png")
"""Plot files written next to `report.md`."""


def _get(row: Mapping[str, Any], field: str) -> float:
    value: Any = row
    for part in field.split("."):
        value = value[part]
    return float(value)


def _arm_order(rows: Sequence[Mapping[str, Any]], arms: Sequence[str] | None) -> list[str]:
    seen = list(dict.fromkeys(r["arm"] for r in rows))
    if arms:
        return [a for a in arms if a in seen] + [a for a in seen if a not in arms]
    return seen


def summarize(
    rows: Sequence[Mapping[str, Any]],
    *,
    baseline: str | None = None,
    arms: Sequence[str] | None = None,
    n_resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Per-arm aggregates, paired CIs against `baseline` (pairs: same task and seed), time breakdown."""
    order = _arm_order(rows, arms)
    if not order:
        return {"arms": [], "per_arm": {}, "diffs": {}, "per_task": {}, "baseline": baseline, "n_episodes": 0}
    baseline = baseline if baseline in order else order[0]
    by_arm: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by_arm[r["arm"]].append(r)
    per_arm: dict[str, dict[str, Any]] = {}
    for arm in order:
        rs = by_arm[arm]
        t = [r["timing"] for r in rs]
        gen_s = sum(x["generate_s"] for x in t)
        wall = sum(x["wall_s"] for x in t)
        waits = [w for x in t for w in x.get("tool_waits", [])]
        stages = {"build": sum(x["build_s"] for x in t), "generate": gen_s, "tool": sum(x["tool_s"] for x in t)}
        bound = stage_bound(stages, {"other": sum(x["other_s"] for x in t)})
        causes: dict[str, int] = defaultdict(int)
        for r in rs:
            causes[f"{r['outcome']}/{r['cause']}"] += 1
        first = rs[0]
        per_arm[arm] = {
            "n": len(rs),
            "compressor": first["compressor"],
            "pins_detection": first.get("pins_detection"),
            "budget": first.get("budget"),
            "agent": first.get("agent"),
            "completion": rate([bool(r["completed"]) for r in rs]),
            "quality": float(np.mean([r["quality"] for r in rs])),
            "violations": int(sum(r["violations"] for r in rs)),
            "truncated": rate([r["outcome"] == "truncated" for r in rs]),
            "causes": dict(sorted(causes.items())),
            "tool_calls": float(np.mean([r["tool_calls"] for r in rs])),
            "repeated_tool_calls": float(np.mean([r["repeated_tool_calls"] for r in rs])),
            "steps": float(np.mean([r["steps"] for r in rs])),
            "prompt_tokens_total": quantiles([r["prompt_tokens_total"] for r in rs]),
            "prompt_tokens_mean": float(np.mean([r["prompt_tokens_total"] for r in rs])),
            "peak_context": quantiles([r["peak_context"] for r in rs]),
            "compression_ratio": float(np.mean([r["compression_ratio"] for r in rs])),
            "prefix_reuse": float(np.mean([r["prefix_reuse"] for r in rs])),
            "wall_s": quantiles([x["wall_s"] for x in t]),
            "time": {
                "build_s": stages["build"], "generate_s": gen_s, "prefill_s": sum(x["prefill_s"] for x in t),
                "decode_s": sum(x["decode_s"] for x in t), "tool_s": stages["tool"], "other_s": sum(x["other_s"] for x in t),
                "wall_s": wall,
                "generated_tok_per_s": (sum(r["generated_tokens"] for r in rs) / gen_s) if gen_s > 0 else None,
                "loss_tok_per_s": (sum(r["loss_tokens"] for r in rs) / wall) if wall > 0 else None,
                "tool_wait": quantiles(waits),
                "timeout_rate": rate([bool(r["timed_out"]) for r in rs]),
                "discard_rate": rate([bool(r["discarded"]) for r in rs]),
                "serial_s": bound.serial_s, "bound_s": bound.bound_s, "speedup": bound.speedup,
                "bottleneck": bound.bottleneck,
            },
        }
    diffs: dict[str, dict[str, Any]] = {}
    base_rows = {(r["task"], r["seed"]): r for r in by_arm[baseline]}
    for arm in order:
        if arm == baseline:
            continue
        arm_rows = {(r["task"], r["seed"]): r for r in by_arm[arm]}
        diffs[arm] = {}
        for field, label in COMPARED:
            ci = paired_bootstrap({k: _get(r, field) for k, r in base_rows.items()},
                                  {k: _get(r, field) for k, r in arm_rows.items()},
                                  n_resamples=n_resamples, seed=seed, confidence=confidence)
            diffs[arm][label] = ci
    per_task: dict[str, dict[str, float]] = defaultdict(dict)
    for arm in order:
        tasks: dict[str, list[float]] = defaultdict(list)
        for r in by_arm[arm]:
            tasks[r["task"]].append(r["quality"])
        for task, qs in tasks.items():
            per_task[task][arm] = float(np.mean(qs))
    task_diffs: dict[str, dict[str, Any]] = defaultdict(dict)
    for task in per_task:
        base = {r["seed"]: r["quality"] for r in by_arm[baseline] if r["task"] == task}
        for arm in order:
            if arm != baseline:
                other = {r["seed"]: r["quality"] for r in by_arm[arm] if r["task"] == task}
                task_diffs[task][arm] = paired_bootstrap(base, other, n_resamples=n_resamples, seed=seed,
                                                         confidence=confidence)
    return {"arms": order, "per_arm": per_arm, "diffs": diffs, "per_task": dict(sorted(per_task.items())),
            "per_task_diffs": dict(sorted(task_diffs.items())),
            "baseline": baseline, "n_episodes": len(rows), "confidence": confidence, "n_resamples": n_resamples}


def _f(x: Any, digits: int = 3) -> str:
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


def _q(q: Mapping[str, Any], digits: int = 3) -> str:
    return " / ".join(_f(q[k], digits) for k in ("p50", "p90", "p99"))


def _comp(c: Mapping[str, Any]) -> str:
    params = ", ".join(f"{k}={v}" for k, v in sorted(c.get("params", {}).items())
                       if k not in ("trigger", "trigger_tokens", "trigger_fraction"))
    return f"`{c['name']}`" + (f" ({params})" if params else "")


def render_markdown(summary: Mapping[str, Any], *, title: str, run_dir: str = ".", notes: Sequence[str] = ()) -> str:
    """The report text for a `summarize` result."""
    arms, per, base = summary["arms"], summary["per_arm"], summary["baseline"]
    out = [f"# {title}", ""]
    out += [f"{summary['n_episodes']} episodes, {len(arms)} arms, baseline `{base}`. "
            "Pairs are the same task and seed under two arms; intervals are paired percentile bootstraps "
            f"({summary.get('n_resamples')} resamples, {int(100 * summary.get('confidence', 0.95))}%).", ""]
    out += list(notes) + ([""] if notes else [])
    out += ["## Arms", "", "| arm | compressor | pins | budget | n | completion | quality | violations | truncated | "
            "tool calls | re-queries | prompt tokens p50/p90/p99 | peak context p50/p90/p99 | compression | prefix reuse |",
            "|" + "---|" * 15]
    for a in arms:
        p = per[a]
        out.append(f"| {a} | {_comp(p['compressor'])} | {'on' if p['pins_detection'] else 'off'} | {p['budget']} | {p['n']} | "
                   f"{_f(p['completion'])} | {_f(p['quality'])} | {p['violations']} | {_f(p['truncated'])} | "
                   f"{_f(p['tool_calls'], 2)} | {_f(p['repeated_tool_calls'], 2)} | {_q(p['prompt_tokens_total'], 0)} | "
                   f"{_q(p['peak_context'], 0)} | {_f(p['compression_ratio'], 2)}x | {_f(p['prefix_reuse'], 2)} |")
    out += ["", "## Ends", "", "| arm | outcome/cause: count |", "|---|---|"]
    for a in arms:
        out.append(f"| {a} | " + ", ".join(f"{k}: {v}" for k, v in per[a]["causes"].items()) + " |")
    out += ["", f"## Difference against `{base}` (arm minus baseline, mean over pairs, CI)", ""]
    labels = [label for _, label in COMPARED]
    out += ["| arm | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for a, d in summary["diffs"].items():
        cells = []
        for label in labels:
            ci = d[label]
            star = " *" if ci.excludes_zero() else ""
            cells.append("–" if ci.mean_diff is None else f"{_f(ci.mean_diff, 3)} [{_f(ci.low, 3)}, {_f(ci.high, 3)}]{star}")
        out.append(f"| {a} | " + " | ".join(cells) + " |")
    out += ["", "`*`: the interval excludes zero.", "", "## Quality per task", "",
            f"Mean quality; below it, the paired difference against `{base}` on that task's seeds, with its CI.", "",
            "| task | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for task, qs in summary["per_task"].items():
        out.append(f"| {task} | " + " | ".join(_f(qs.get(a)) for a in arms) + " |")
        cis = summary.get("per_task_diffs", {}).get(task, {})
        cells = []
        for a in arms:
            ci = cis.get(a)
            if ci is None or ci.mean_diff is None:
                cells.append("–" if a != base else "(baseline)")
            else:
                cells.append(f"{_f(ci.mean_diff)} [{_f(ci.low)}, {_f(ci.high)}]" + (" *" if ci.excludes_zero() else ""))
        out.append("| vs baseline | " + " | ".join(cells) + " |")
    out += ["", "## Where time goes", "",
            "Seconds summed over each arm's episodes. Stages `build` (context building and compression), `generate` "
            "(the agent: prefill + decode) and `tool` could overlap across batches in a pipelined collector; "
            "`other` (log writes with fsync, state snapshots, scoring, and the harness's own render of the uncompressed "
            "history for the compression ratio) is counted as not overlappable. Bound = largest stage + other.",
            "", "| arm | build | generate (prefill / decode) | tool | other | generated tok/s | loss tok/s | "
            "tool wait p50/p90/p99 | timeout rate | discard rate | serial | bound | speedup | wall p50/p90/p99 |",
            "|" + "---|" * 15]
    for a in arms:
        t = per[a]["time"]
        out.append(f"| {a} | {_f(t['build_s'])} | {_f(t['generate_s'])} ({_f(t['prefill_s'])} / {_f(t['decode_s'])}) | "
                   f"{_f(t['tool_s'])} | {_f(t['other_s'])} | {_f(t['generated_tok_per_s'], 0)} | {_f(t['loss_tok_per_s'], 0)} | "
                   f"{_q(t['tool_wait'], 5)} | {_f(t['timeout_rate'])} | {_f(t['discard_rate'])} | {_f(t['serial_s'])} | "
                   f"{_f(t['bound_s'])} ({t['bottleneck']}) | {_f(t['speedup'], 2)}x | {_q(per[a]['wall_s'])} |")
    out += ["", "Discarded: ends a trainer would drop (over the context budget or window, cut by the generation "
            "limit). Timeouts: wall-time truncations and tool timeouts. Loss tokens/s counts sampled tokens of kept "
            "episodes over wall time.", "",
            "## Replaying these contexts", "",
            f"Every episode's event log is `{run_dir}/episodes/<arm>/<task>-<seed>.jsonl` (`log` in `results.jsonl`). "
            "Every step's context is a pure function of its log, so each one can be rebuilt and checked token for "
            "token against the hash its `Step` recorded:", "",
            "```", f"ctxkit replay --verify {run_dir}/episodes/<arm>/<task>-<seed>.jsonl   # one episode",
            f"ctxkit audit {run_dir}                                              # every log of the run", "```", "",
            "![quality vs tokens](quality_vs_tokens.png)", "", "![latency breakdown](latency_breakdown.png)", ""]
    return "\n".join(out)


def plot(summary: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write the two PNG plots; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms, per = summary["arms"], summary["per_arm"]
    paths = []
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    markers = "osD^vP*Xh<>"
    for i, a in enumerate(arms):
        x, y = per[a]["prompt_tokens_mean"], per[a]["quality"]
        ax.scatter([x], [y], s=70, marker=markers[i % len(markers)], label=a, alpha=0.85)
    ax.legend(fontsize=8, loc="best")
    ax.set_xlabel("prompt tokens per episode (mean, all steps)")
    ax.set_ylabel("quality (mean)")
    ax.set_ylim(-0.05, 1.1)
    ax.set_title("Quality vs tokens per arm")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out_dir / PLOTS[0])
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    parts = (("build_s", "build"), ("prefill_s", "prefill"), ("decode_s", "decode"), ("tool_s", "tool"), ("other_s", "other"))
    bottom = np.zeros(len(arms))
    for key, label in parts:
        vals = np.array([per[a]["time"][key] / max(1, per[a]["n"]) for a in arms])
        ax.bar(arms, vals, bottom=bottom, label=label)
        bottom += vals
    ax.set_ylabel("seconds per episode (mean)")
    ax.set_title("Latency breakdown per arm")
    ax.legend(fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / PLOTS[1])
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def write_report(run_dir: str | Path) -> Path:
    """Re-render `report.md` and the plots of a run folder from its `results.jsonl` and `run.json`."""
    from ctxkit.experiment.runner import RUN_INFO, read_rows

    run = Path(run_dir)
    rows = read_rows(run)
    if not rows:
        raise ConfigError(f"{run}: no results rows (results.jsonl is missing or empty)")
    info: dict[str, Any] = {}
    if (run / RUN_INFO).exists():
        info = json.loads((run / RUN_INFO).read_text()).get("experiment", {})
    report_cfg = info.get("report", {})
    summary = summarize(
        rows, baseline=info.get("baseline"), arms=[a["name"] for a in info.get("arms", [])],
        n_resamples=int(report_cfg.get("bootstrap_resamples", 2000)), seed=int(report_cfg.get("bootstrap_seed", 0)),
        confidence=float(report_cfg.get("confidence", 0.95)),
    )
    title = f"ctxkit ablation: {info.get('name', run.name)}"
    notes = []
    if info:
        lim = info.get("limits", {})
        notes.append(f"Config `{info.get('path')}`; tokenizer `{info.get('tokenizer')}`; template "
                     f"`{info.get('template') or 'tokenizer default'}`; limits: {lim.get('max_steps')} steps, "
                     f"{lim.get('max_context')} context tokens, {lim.get('wall_time_s')} s.")
    text = render_markdown(summary, title=title, run_dir=str(run), notes=notes)
    plot(summary, run)
    path = run / "report.md"
    path.write_text(text, encoding="utf-8")
    return path
