"""A run folder from `ctxkit ablate` as the viewer's JSON data: the arms x tasks grid, plots.

The numbers are the report's: `experiment.report.summarize` over the rows `run_folder.read_rows` reads
(strictly), with the baseline, arm order and bootstrap settings of `run.json`, as `write_report` does.
Each grid cell (arm, task) lists its episodes (`<arm>/<task>-<seed>`), whose logs are
`episodes/<arm>/<task>-<seed>.jsonl` (`experiment.episode.log_path`); the page shows each of them as an
episode. Plots are the report's PNGs (`report.PLOTS`) read from the folder, or drawn from the summary
when the folder has none, inlined as data URIs.
"""

from __future__ import annotations

import base64
import io
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from ctxkit.errors import ConfigError
from ctxkit.experiment.config import EpisodeSpec
from ctxkit.experiment.run_folder import RESULTS, read_rows, read_run_info

__all__ = ["is_run_folder", "run_data", "episode_logs"]


def is_run_folder(path: str | Path) -> bool:
    """True for a folder holding a `results.jsonl` (a run folder written by `ctxkit ablate`)."""
    return Path(path).is_dir() and (Path(path) / RESULTS).is_file()


def _summary(run: Path, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    from ctxkit.experiment.report import summarize  # lazy: pulls numpy

    info: Any = (read_run_info(run) or {}).get("experiment", {})
    if not isinstance(info, dict):
        raise ConfigError(f"{run / 'run.json'}: 'experiment' is not an object")
    cfg = info.get("report", {})
    summary = summarize(rows, baseline=info.get("baseline"), arms=[a["name"] for a in info.get("arms", [])],
                        n_resamples=int(cfg.get("bootstrap_resamples", 2000)), seed=int(cfg.get("bootstrap_seed", 0)),
                        confidence=float(cfg.get("confidence", 0.95)))
    summary["name"] = info.get("name", run.name)
    return summary


def episode_logs(run: str | Path, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, Path]]:
    """`(episode key, log path)` of every row whose log exists, in row order sorted by key."""
    from ctxkit.experiment.episode import log_path  # lazy: pulls numpy

    out = []
    for r in sorted(rows, key=lambda r: (r["arm"], r["task"], r["seed"])):
        spec = EpisodeSpec(arm=r["arm"], task=r["task"], seed=r["seed"])
        path = log_path(Path(run), spec)
        if path.is_file():
            out.append((spec.key, path))
    return out


def _plots(run: Path, summary: Mapping[str, Any]) -> list[dict[str, str]]:
    from ctxkit.experiment.report import PLOTS, latency_figure, quality_figure  # lazy: pulls numpy

    out = []
    for name, make in zip(PLOTS, (quality_figure, latency_figure)):
        path = run / name
        if path.is_file():
            png = path.read_bytes()
        else:
            fig = make(summary)
            buf = io.BytesIO()
            fig.savefig(buf, dpi=110, format="png")
            import matplotlib.pyplot as plt  # lazy: matplotlib loads on first use

            plt.close(fig)
            png = buf.getvalue()
        out.append({"name": name, "src": "data:image/png;base64," + base64.b64encode(png).decode("ascii")})
    return out


def _ci(ci: Any) -> dict[str, Any]:
    return {k: getattr(ci, k) for k in ("mean_diff", "low", "high", "n_pairs") if hasattr(ci, k)}


def run_data(run: str | Path) -> tuple[dict[str, Any], list[tuple[str, Path]]]:
    """`(grid data, episode logs)` of a run folder (see the module docstring)."""
    run = Path(run)
    rows = read_rows(run)
    if not rows:
        raise ConfigError(f"{run}: no results rows (results.jsonl is missing or empty)")
    summary = _summary(run, rows)
    arms = list(summary["arms"])
    tasks = sorted({r["task"] for r in rows})
    cells: dict[str, dict[str, Any]] = {}
    grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        grouped[(r["arm"], r["task"])].append(r)
    for (arm, task), rs in grouped.items():
        ends: dict[str, int] = defaultdict(int)
        for r in rs:
            ends[f"{r['outcome']}/{r['cause']}"] += 1
        cells[f"{arm}\t{task}"] = {
            "quality": summary["per_task"].get(task, {}).get(arm),
            "ends": dict(sorted(ends.items())),
            "prompt_tokens": sum(r["prompt_tokens_total"] for r in rs) / len(rs),
            "wall_s": sum(r["timing"]["wall_s"] for r in rs) / len(rs),
            "episodes": [r["episode_id"] for r in sorted(rs, key=lambda r: r["seed"])],
        }
    per_arm = {}
    for arm in arms:
        a = summary["per_arm"][arm]
        per_arm[arm] = {"n": a["n"], "quality": a["quality"], "completion": a["completion"], "truncated": a["truncated"],
                        "violations": a["violations"], "prompt_tokens_mean": a["prompt_tokens_mean"],
                        "peak_context_p50": a["peak_context"].get("p50"), "wall_s": a["time"]["wall_s"],
                        "build_s": a["time"]["build_s"], "compressor": a["compressor"], "causes": a["causes"]}
    diffs = {arm: {label: _ci(ci) for label, ci in d.items()} for arm, d in summary["diffs"].items()}
    data = {"path": str(run), "name": summary["name"], "arms": arms, "tasks": tasks, "baseline": summary["baseline"],
            "cells": cells, "per_arm": per_arm, "diffs": diffs, "plots": _plots(run, summary),
            "n_episodes": summary["n_episodes"]}
    return data, episode_logs(run, rows)
