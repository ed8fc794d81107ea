"""The A/B report: per-arm tables, paired bootstrap CIs against the baseline, where time goes, plots.

`summarize(rows, baseline=...)` computes everything from results rows (pure); `write_report(run_dir)`
reads `results.jsonl` and `run.json` and writes `report.md`, `quality_vs_tokens.png` and
`latency_breakdown.png` (matplotlib, Agg backend). `ctxkit report DIR` calls `write_report`.

Every table goes through `markdown_table`, which refuses a row whose cell count differs from the header's
(GitHub renders no table at all then). Column names carry their unit: `(fraction)` for a share of episodes
in [0, 1], `(count)` for a number of things, `s` for seconds, `(mean)` for a per-episode mean.

The report opens with findings computed from the numbers (`ctxkit.experiment.findings`). An arm most of whose
episodes a limit cut (`findings.cut_short`) cannot complete: the Arms table notes it, its cost differences
(prompt tokens, tool calls, wall s) carry no figure and no star, and the plot draws it hollow, off the frontier.
"Discarded" is `ctxkit.training.preflight.is_discarded`, the definition `ctxkit audit` uses.
"""

from __future__ import annotations

import os
import tempfile
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ctxkit.errors import ConfigError
from ctxkit.experiment.findings import (COST_LABELS, completion_note, cut_short, findings, fmt_ci, fmt_number,
                                        frontier, savings_comparable)
from ctxkit.experiment.run_folder import read_rows, read_run_info
from ctxkit.experiment.same_contexts import decision_trace, same_context_pairs
from ctxkit.experiment.stats import paired_bootstrap, quantiles, rate, stage_bound

__all__ = ["summarize", "render_markdown", "valid_call_rate", "markdown_table", "write_report", "plot", "quality_figure", "latency_figure",
           "stage_seconds", "COMPARED", "PLOTS", "STAGES"]

COMPARED: tuple[tuple[str, str], ...] = (
    ("quality", "quality"),
    ("completed", "completion"),
    ("violations", "violations"),
    ("prompt_tokens_total", "prompt tokens"),
    ("tool_calls", "tool calls"),
    ("timing.wall_s", "wall s"),
)
"""(row field, label) of the metrics compared against the baseline with paired CIs."""

_HEADINGS = {"quality": "quality (0-1)", "completion": "completion (fraction)", "violations": "violations (count)",
             "prompt tokens": "prompt tokens (count)", "tool calls": "tool calls (count)", "wall s": "wall s"}
"""Column headings (with units) of the `COMPARED` labels in the difference table."""

STAGES: tuple[tuple[str, str], ...] = (
    ("build_s", "build"), ("prefill_s", "prefill"), ("decode_s", "decode"), ("generate_rest_s", "generate (not split)"),
    ("tool_s", "tool wait"), ("other_s", "other"),
)
"""(key, label) of the stages in the latency plot; `generate_rest_s` is generation time an agent did not split
into prefill and decode."""

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
            "valid_call_rate": valid_call_rate(rs),
            "steps": float(np.mean([r["steps"] for r in rs])),
            "prompt_tokens_total": quantiles([r["prompt_tokens_total"] for r in rs]),
            "prompt_tokens_mean": float(np.mean([r["prompt_tokens_total"] for r in rs])),
            "peak_context": quantiles([r["peak_context"] for r in rs]),
            "peak_context_mean": float(np.mean([r["peak_context"] for r in rs])),
            "cut_short": cut_short(rs),
            "compression_ratio": float(np.mean([r["compression_ratio"] for r in rs])),
            "prefix_reuse": float(np.mean([r["prefix_reuse"] for r in rs])),
            "wall_s": quantiles([x["wall_s"] for x in t]),
            "wall_s_mean": float(np.mean([x["wall_s"] for x in t])),
            "time": {
                "build_s": stages["build"], "generate_s": gen_s, "prefill_s": sum(x["prefill_s"] for x in t),
                "decode_s": sum(x["decode_s"] for x in t), "tool_s": stages["tool"], "other_s": sum(x["other_s"] for x in t),
                "wall_s": wall,
                "generated_tok_per_s": (sum(r["generated_tokens"] for r in rs) / gen_s) if gen_s > 0 else None,
                "loss_tok_per_s": (sum(r["loss_tokens"] for r in rs) / wall) if wall > 0 else None,
                "tool_wait": quantiles(waits),
                "tool_wait_mean": float(np.mean(waits)) if waits else None,
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


_f = fmt_number


def _q(q: Mapping[str, Any], digits: int = 3) -> str:
    return " / ".join(_f(q[k], digits) for k in ("p50", "p90", "p99"))


def _comp(c: Mapping[str, Any]) -> str:
    params = ", ".join(f"{k}={v}" for k, v in sorted(c.get("params", {}).items())
                       if k not in ("trigger", "trigger_tokens", "trigger_fraction"))
    return f"`{c['name']}`" + (f" ({params})" if params else "")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of a GitHub markdown table (`|` inside a cell escaped); `ValueError` when a row's cell count differs
    from the header's."""
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    lines = [line(header), "|" + "---|" * len(header)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"markdown table row has {len(row)} cells, the header {len(header)}: {list(row)}")
        lines.append(line(row))
    return lines


def valid_call_rate(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """Parsed tool calls over all attempted ones (parsed plus malformed `<tool_call>` blocks) across an arm's
    episodes; None when no episode attempted a call. Rows written before `malformed_tool_calls` count 0."""
    parsed = sum(int(r["tool_calls"]) for r in rows)
    attempted = parsed + sum(int(r.get("malformed_tool_calls", 0)) for r in rows)
    return parsed / attempted if attempted else None


def render_markdown(summary: Mapping[str, Any], *, title: str, run_dir: str = ".", notes: Sequence[str] = ()) -> str:
    """The report text for a `summarize` result."""
    arms, per, base = summary["arms"], summary["per_arm"], summary["baseline"]
    out = [f"# {title}", ""] + findings(summary)
    out += [f"{summary['n_episodes']} episodes, {len(arms)} arms, baseline `{base}`. "
            "Pairs are the same task and seed under two arms; intervals are paired percentile bootstraps "
            f"({summary.get('n_resamples')} resamples, {int(100 * summary.get('confidence', 0.95))}%).", ""]
    out += list(notes) + ([""] if notes else [])
    out += ["## Arms", "", "Per episode: tool calls and re-queries are means (count per episode), tokens are the "
            "mean beside p50/p90/p99 over episodes; valid calls is the share of attempted `<tool_call>` blocks that "
            "parsed (– when none was attempted); violations is the total count over the arm's episodes. An arm "
            "with a majority of truncated episodes cannot complete (see note): its episodes stop early, so its "
            "token counts are not savings.", ""]
    out += markdown_table(
        ["arm", "compressor", "pins", "budget (tokens)", "episodes (count)", "completion (fraction)", "quality (0-1)",
         "violations (count)", "truncated (fraction)", "tool calls (mean)", "valid calls (fraction)", "re-queries (mean)", "prompt tokens (mean)",
         "prompt tokens p50/p90/p99", "peak context (mean, tokens)", "peak context p50/p90/p99 (tokens)",
         "compression (ratio)", "prefix reuse (fraction)", "note"],
        [[a, _comp(per[a]["compressor"]), "on" if per[a]["pins_detection"] else "off", str(per[a]["budget"]), str(per[a]["n"]),
          _f(per[a]["completion"]), _f(per[a]["quality"]), str(per[a]["violations"]), _f(per[a]["truncated"]),
          _f(per[a]["tool_calls"], 2), _f(per[a]["valid_call_rate"]) if per[a]["valid_call_rate"] is not None else "–",
          _f(per[a]["repeated_tool_calls"], 2), _f(per[a]["prompt_tokens_mean"], 0),
          _q(per[a]["prompt_tokens_total"], 0), _f(per[a]["peak_context_mean"], 0), _q(per[a]["peak_context"], 0),
          f"{_f(per[a]['compression_ratio'], 2)}x", _f(per[a]["prefix_reuse"], 2), completion_note(per[a]) or "–"]
         for a in arms])
    out += ["", "## Ends", ""]
    out += markdown_table(["arm", "outcome/cause: episodes (count)"],
                          [[a, ", ".join(f"{k}: {v}" for k, v in per[a]["causes"].items())] for a in arms])
    out += ["", f"## Difference against `{base}` (arm minus baseline, mean over pairs, CI)", ""]
    labels = [label for _, label in COMPARED]
    diff_rows = []
    for a, d in summary["diffs"].items():
        cells = [a]
        for label in labels:
            ci = d[label]
            if label in COST_LABELS and not savings_comparable(summary, a):
                who = "cannot complete" if per[a]["cut_short"]["cannot_complete"] else "baseline cannot complete"
                cells.append(f"– ({who})")
            else:
                cells.append(fmt_ci(ci) + (" *" if ci.excludes_zero() else ""))
        diff_rows.append(cells)
    out += markdown_table(["arm"] + [_HEADINGS.get(label, label) for label in labels], diff_rows)
    out += ["", "`*`: the interval excludes zero. `– (cannot complete)`: most of the arm's (or the baseline's) episodes "
            "were truncated, so fewer tokens, tool calls or seconds are not a saving and get no figure.", "",
            "## Quality per task", "",
            f"Mean quality (0-1); below it, the paired difference against `{base}` on that task's seeds, with its CI.", ""]
    task_rows = []
    for task, qs in summary["per_task"].items():
        task_rows.append([task] + [_f(qs.get(a)) for a in arms])
        cis = summary.get("per_task_diffs", {}).get(task, {})
        cells = []
        for a in arms:
            ci = cis.get(a)
            if ci is None or ci.mean_diff is None:
                cells.append("–" if a != base else "(baseline)")
            else:
                cells.append(f"{_f(ci.mean_diff)} [{_f(ci.low)}, {_f(ci.high)}]" + (" *" if ci.excludes_zero() else ""))
        task_rows.append(["vs baseline"] + cells)
    out += markdown_table(["task"] + list(arms), task_rows)
    out += ["", "## Where time goes", "",
            "Seconds summed over each arm's episodes. Stages `build` (context building and compression), `generate` "
            "(the agent: prefill + decode) and `tool` could overlap across batches in a pipelined collector; "
            "`other` (log writes with fsync, state snapshots, scoring, and the harness's own render of the uncompressed "
            "history for the compression ratio) is counted as not overlappable. Bound = largest stage + other. "
            "Columns ending in `s` are seconds; `(fraction)` columns are shares of the arm's episodes.", ""]
    time_rows = []
    for a in arms:
        t = per[a]["time"]
        time_rows.append([
            a, _f(t["build_s"]), f"{_f(t['generate_s'])} ({_f(t['prefill_s'])} / {_f(t['decode_s'])})", _f(t["tool_s"]),
            _f(t["other_s"]), _f(t["generated_tok_per_s"], 0), _f(t["loss_tok_per_s"], 0), _f(t["tool_wait_mean"], 5), _q(t["tool_wait"], 5),
            _f(t["timeout_rate"]), _f(t["discard_rate"]), _f(t["serial_s"]), f"{_f(t['bound_s'])} ({t['bottleneck']})",
            f"{_f(t['speedup'], 2)}x", _f(per[a]["wall_s_mean"]), _q(per[a]["wall_s"]),
        ])
    out += markdown_table(
        ["arm", "build s", "generate s (prefill / decode)", "tool s", "other s", "generated tok/s", "loss tok/s",
         "tool wait s (mean)", "tool wait s p50/p90/p99", "timed out (fraction)", "discarded (fraction)", "serial s",
         "bound s (bottleneck)", "speedup (ratio)", "wall s (mean)", "wall s p50/p90/p99"], time_rows)
    out += ["", "Discarded: episodes a trainer would drop from training (`ctxkit.training.preflight.is_discarded`, the "
            "same definition as `ctxkit audit`'s discard_rate): no sampled step, no end, an unscored end (a harness "
            "error), or a length truncation (over the context budget or window, cut by the generation limit). Limit "
            "truncations (max steps, wall time) are kept: their steps train with a bootstrapped value. Timeouts: "
            "wall-time truncations and tool timeouts. Loss tokens/s counts sampled tokens of kept episodes over wall "
            "time.", "",
            "## Replaying these contexts", "",
            f"Every episode's event log is `{run_dir}/episodes/<arm>/<task>-<seed>.jsonl` (`log` in `results.jsonl`). "
            "Every step's context is a pure function of its log, so each one can be rebuilt and checked token for "
            "token against the hash its `Step` recorded:", "",
            "```", f"ctxkit replay --verify {run_dir}/episodes/<arm>/<task>-<seed>.jsonl   # one episode",
            f"ctxkit audit {run_dir}                                              # every log of the run", "```", "",
            "![quality vs tokens](quality_vs_tokens.png)", "", "![latency breakdown](latency_breakdown.png)", ""]
    return "\n".join(out)


def _pyplot() -> Any:
    try:
        import matplotlib  # lazy: matplotlib loads on first use
    except ImportError:
        raise ConfigError("the report's plots need matplotlib: pip install 'ctxkit[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib loads on first use

    return plt


def stage_seconds(summary: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Mean seconds per episode of each `STAGES` key, per arm (`generate_rest_s`: generate minus prefill and decode)."""
    out: dict[str, dict[str, float]] = {}
    for a in summary["arms"]:
        t, n = summary["per_arm"][a]["time"], max(1, summary["per_arm"][a]["n"])
        rest = max(0.0, t["generate_s"] - t["prefill_s"] - t["decode_s"])
        values = {**t, "generate_rest_s": rest}
        out[a] = {key: float(values[key]) / n for key, _ in STAGES}
    return out


def quality_figure(summary: Mapping[str, Any]) -> Any:
    """Quality against prompt tokens per episode, one point per arm (a matplotlib Figure). Arms that cannot
    complete are drawn hollow and labelled so; the dashed frontier (`findings.frontier`) joins only arms that do."""
    plt = _pyplot()
    arms, per = summary["arms"], summary["per_arm"]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    markers = "osD^vP*Xh<>"
    for i, a in enumerate(arms):
        x, y = per[a]["prompt_tokens_mean"], per[a]["quality"]
        color = f"C{i % 10}"
        if per[a]["cut_short"]["cannot_complete"]:
            ax.scatter([x], [y], s=70, marker=markers[i % len(markers)], facecolors="none", edgecolors=color,
                       linewidths=1.5, label=f"{a} (cannot complete: not a saving, off the frontier)")
        else:
            ax.scatter([x], [y], s=70, marker=markers[i % len(markers)], color=color, label=a, alpha=0.85)
    front = frontier(summary)
    if front:  # a staircase: the best quality reached at each token count, run on to the largest arm's tokens
        xs, ys = [per[a]["prompt_tokens_mean"] for a in front], [per[a]["quality"] for a in front]
        right = max(per[a]["prompt_tokens_mean"] for a in arms)
        if right > xs[-1]:
            xs, ys = xs + [right], ys + [ys[-1]]
        ax.plot(xs, ys, ls="--", lw=1, color="0.4", drawstyle="steps-post", label="frontier (arms that complete)",
                zorder=0)
    ax.legend(fontsize=8, loc="best")
    ax.set_xlabel("prompt tokens per episode (mean, all steps)")
    ax.set_ylabel("quality (mean)")
    ax.set_ylim(-0.05, 1.1)
    ax.set_title("Quality vs tokens per arm (hollow: cannot complete)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def latency_figure(summary: Mapping[str, Any]) -> Any:
    """Seconds per episode of every stage, grouped bars per arm on a log scale, so stages a thousand times
    smaller than `build` (prefill, decode, tool wait) still show (a matplotlib Figure). A stage at 0 s has no bar."""
    plt = _pyplot()
    arms = list(summary["arms"])
    seconds = stage_seconds(summary)
    fig, ax = plt.subplots(figsize=(max(8.0, 1.2 * len(arms) + 4), 4.8))
    width = 0.8 / len(STAGES)
    positive = [v for a in arms for v in seconds[a].values() if v > 0]
    for k, (key, label) in enumerate(STAGES):
        xs = np.arange(len(arms)) + (k - (len(STAGES) - 1) / 2) * width
        heights = [seconds[a][key] for a in arms]
        ax.bar(xs, [h if h > 0 else np.nan for h in heights], width=width, label=label)
    ax.set_yscale("log")
    if positive:
        ax.set_ylim(min(positive) / 3, max(positive) * 3)
    ax.set_xticks(np.arange(len(arms)))
    ax.set_xticklabels(arms, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("seconds per episode (mean, log scale)")
    ax.set_title("Where time goes per arm (stages at 0 s have no bar)")
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="stage", title_fontsize=8)
    fig.tight_layout()
    return fig


def plot(summary: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write the two PNG plots (`PLOTS`) into `out_dir`; returns their paths."""
    paths = [Path(out_dir) / name for name in PLOTS]
    _save_plots(summary, paths)
    return paths


def write_report(run_dir: str | Path) -> Path:
    """Re-render `report.md` and the plots of a run folder from its `results.jsonl` and `run.json`.

    The rows are read strictly (`run_folder.read_rows`: foreign rows, binary content, a cut line and
    duplicate episodes are `ConfigError`s naming the file and line). Files are written to temporaries in
    the folder and moved into place only once all are written, so a failure leaves the old report as it was."""
    run = Path(run_dir)
    if not run.is_dir():
        raise ConfigError(f"{run}: {'not a folder' if run.exists() else 'no such folder'}; expected a run folder "
                          "written by `ctxkit ablate`")
    rows = read_rows(run)
    if not rows:
        raise ConfigError(f"{run}: no results rows (results.jsonl is missing or empty)")
    info: dict[str, Any] = (read_run_info(run) or {}).get("experiment", {})
    if not isinstance(info, dict):
        raise ConfigError(f"{run / 'run.json'}: 'experiment' is not an object")
    report_cfg = info.get("report", {})
    summary = summarize(
        rows, baseline=info.get("baseline"), arms=[a["name"] for a in info.get("arms", [])],
        n_resamples=int(report_cfg.get("bootstrap_resamples", 2000)), seed=int(report_cfg.get("bootstrap_seed", 0)),
        confidence=float(report_cfg.get("confidence", 0.95)),
    )
    summary["same_contexts"] = [asdict(p) for p in same_context_pairs(decision_traces(run, rows, summary["arms"]))]
    title = f"ctxkit ablation: {info.get('name', run.name)}"
    notes = []
    if info:
        lim = info.get("limits", {})
        notes.append(f"Config `{info.get('path')}`; tokenizer `{info.get('tokenizer')}`; template "
                     f"`{info.get('template') or 'tokenizer default'}`; limits: {lim.get('max_steps')} steps, "
                     f"{lim.get('max_context')} context tokens, {lim.get('wall_time_s')} s.")
    text = render_markdown(summary, title=title, run_dir=str(run), notes=notes)
    targets = [run / "report.md", *(run / name for name in PLOTS)]
    for target in targets:
        if target.is_dir():
            raise ConfigError(f"{target}: is a folder; cannot write the report there")
    temps: list[Path] = []
    try:
        for target in targets:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=run)
            os.close(fd)
            temps.append(Path(tmp))
        temps[0].write_text(text, encoding="utf-8")
        _save_plots(summary, temps[1:])
        for tmp, target in zip(temps, targets):
            os.replace(tmp, target)
    except OSError as exc:
        raise ConfigError(f"{run}: cannot write the report: {exc.strerror or exc}") from None
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    return targets[0]


def decision_traces(run: Path, rows: Sequence[Mapping[str, Any]],
                    arms: Sequence[str]) -> dict[str, dict[tuple[str, int], tuple[str, ...]]]:
    """Per arm, (task, seed) -> the context hashes of the episode's decisions, read from the logs the rows name;
    an episode whose log is not in the folder is left out (its arm is then compared on no episode it lacks)."""
    traces: dict[str, dict[tuple[str, int], tuple[str, ...]]] = {arm: {} for arm in arms}
    for row in rows:
        path = run / str(row.get("log", ""))
        if row.get("arm") in traces and row.get("log") and path.is_file():
            traces[row["arm"]][(row["task"], row["seed"])] = decision_trace(path)
    return traces


def _save_plots(summary: Mapping[str, Any], paths: Sequence[Path]) -> None:
    plt = _pyplot()
    for path, make in zip(paths, (quality_figure, latency_figure)):
        fig = make(summary)
        try:
            fig.savefig(path, dpi=110, format="png")
        finally:
            plt.close(fig)
