"""Per-episode cost of each arm of an ablation grid: the rule-based arms against the embedding arms.

Runs a grid (`experiments/quickstart.toml` by default) into a fresh run folder, so the embedding cache
starts cold, or reads an existing run folder (`--run DIR`), and reports per arm, from the `timing` of each
`results.jsonl` row: episodes, wall seconds per episode (p50, p99, mean) and build seconds per episode
(the same), and the ratio of the arm's mean wall time to the mean over the rule-based arms.

- Rule-based arms: every arm whose compressor (or any stage of it) is not model-backed; model-backed
  means a `summarize*` or `retrieve*` compressor (`MODEL_BACKED`: they embed with MiniLM). A rule-based
  arm whose episodes end truncated by the context (`TRUNCATION_CAUSES`: keep-all over its budget) stops
  early and would flatter the baseline, so it is left out of the rule-based mean (the table says so).
- One-time model loads: a run records, per row, the seconds the episode spent loading models
  (`timing.model_load_s`, `ctxkit.context.models.model_load_seconds`) and the worker process that ran it
  (`timing.worker_pid`). The per-episode figures have that load taken out (it is paid once per worker,
  by whichever episode needs the model first), and the loads are listed separately, per worker. Rows of an
  older run lack both fields: their figures then include the load (the header says so).

Nearest-rank percentiles (`ctxkit.benchmarks.workload.percentile`; with 12 episodes an arm's p99 is its
slowest). Absolute times depend on the machine and its load (the 1-minute load average before and after
is printed); the ratios are side by side.

Run: `python -m ctxkit.benchmarks.arm_costs [--config experiments/quickstart.toml] [--out DIR] [--workers N]`
or `python -m ctxkit.benchmarks.arm_costs --run DIR`; `--json` prints the result as JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import orjson

from ctxkit.benchmarks.bench_tables import table
from ctxkit.benchmarks.workload import percentile
from ctxkit.errors import ConfigError
from ctxkit.experiment.config import load_config
from ctxkit.experiment.run_folder import read_rows
from ctxkit.experiment.runner import run_experiment

DEFAULT_CONFIG = "experiments/quickstart.toml"
"""The grid run when neither `--config` nor `--run` is given."""
MODEL_BACKED: tuple[str, ...] = ("summarize", "retrieve")
"""Compressor name prefixes of the model-backed (embedding) strategies."""
TRUNCATION_CAUSES: frozenset[str] = frozenset({"context_budget", "context_limit"})
"""End causes that leave a rule-based arm out of the rule-based mean (the episode stopped early)."""
TARGET = 3.0
"""A model-backed arm should cost at most this multiple of the rule-based mean per episode."""


@dataclass(frozen=True)
class Stats:
    """Seconds per episode over one arm's episodes."""

    p50_s: float
    p99_s: float
    mean_s: float
    total_s: float


@dataclass(frozen=True)
class ArmCost:
    """The figures of one arm."""

    arm: str
    """The arm's name."""
    compressor: str
    """Its compressor's versioned name."""
    kind: str
    """`rule-based` or `model-backed`."""
    episodes: int
    """Episodes (rows) of the arm."""
    truncated: int
    """Episodes that ended truncated by the context (`TRUNCATION_CAUSES`)."""
    in_baseline: bool
    """Whether the arm counts in the rule-based mean."""
    wall: Stats
    """`timing.wall_s` per episode, model loads taken out."""
    build: Stats
    """`timing.build_s` per episode, model loads taken out (the embedders load inside a build)."""
    model_load_s: float
    """Model-load seconds this arm's episodes paid (once per worker, by the first that needed the model)."""
    vs_rule_based: float | None
    """Mean wall time over the rule-based mean (None when there is no rule-based arm)."""


@dataclass(frozen=True)
class WorkerLoad:
    """The one-time model loads of one worker process."""

    worker: int
    """The worker's process id."""
    episodes: int
    """Episodes it ran."""
    model_load_s: float
    """Seconds it spent loading models."""
    paid_by: tuple[str, ...]
    """Episodes (`arm/task-seed`) during which it loaded a model."""


@dataclass(frozen=True)
class ArmCostResult:
    """One `arm_costs` report."""

    run_dir: str
    """The run folder read."""
    config: str | None
    """The config the run was made from (from `run.json`)."""
    episodes: int
    """Rows read."""
    loads_recorded: bool
    """Every row records `timing.model_load_s` (else the figures include the loads)."""
    rule_based: tuple[str, ...]
    """Arms counted in the rule-based mean."""
    excluded: dict[str, str] = field(default_factory=dict)
    """Rule-based arms left out of the mean, and why."""
    rule_mean_wall_s: float | None = None
    """Mean wall seconds per episode over the rule-based arms' episodes."""
    arms: list[ArmCost] = field(default_factory=list)
    workers: list[WorkerLoad] = field(default_factory=list)
    grid_wall_s: float | None = None
    """Seconds the whole grid took when this benchmark ran it (None with `--run`)."""
    load_average: tuple[float, float] | None = None
    """The 1-minute load average before and after the grid ran (None with `--run`)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict."""
        return asdict(self)

    @property
    def model_load_s(self) -> float:
        """Model-load seconds over every worker."""
        return sum(w.model_load_s for w in self.workers)

    @property
    def ok(self) -> bool:
        """Every model-backed arm costs at most `TARGET` times the rule-based mean per episode."""
        return all(a.vs_rule_based is not None and a.vs_rule_based <= TARGET
                   for a in self.arms if a.kind == "model-backed")


def compressor_names(spec: Any) -> list[str]:
    """Every compressor name in a recorded spec (`{"name", "params"}`), the stages of a pipeline included."""
    out: list[str] = []
    if isinstance(spec, Mapping):
        name = spec.get("name")
        if isinstance(name, str):
            out.append(name)
        for value in spec.values():
            if isinstance(value, (Mapping, list, tuple)):
                out += compressor_names(value)
    elif isinstance(spec, (list, tuple)):
        for value in spec:
            out += compressor_names(value)
    return out


def is_model_backed(spec: Any) -> bool:
    """Whether a recorded compressor spec uses a model-backed strategy (`MODEL_BACKED`)."""
    return any(n.startswith(MODEL_BACKED) for n in compressor_names(spec))


def stats(values: Sequence[float]) -> Stats:
    """`Stats` of per-episode seconds (zeros for none)."""
    if not values:
        return Stats(0.0, 0.0, 0.0, 0.0)
    return Stats(percentile(values, 50), percentile(values, 99), sum(values) / len(values), sum(values))


def _load_s(row: Mapping[str, Any]) -> float:
    return float(row["timing"].get("model_load_s") or 0.0)


def analyze(rows: Iterable[Mapping[str, Any]], run_dir: str = "", config: str | None = None) -> ArmCostResult:
    """The report of results rows (see the module docstring); arms in the order they first appear."""
    rows = list(rows)
    if not rows:
        raise ConfigError(f"{run_dir or 'arm costs'}: no results rows to measure")
    by_arm: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_arm.setdefault(r["arm"], []).append(r)
    kinds = {arm: "model-backed" if is_model_backed(rs[0]["compressor"]) else "rule-based" for arm, rs in by_arm.items()}
    excluded: dict[str, str] = {}
    for arm, rs in by_arm.items():
        cut = sum(r["cause"] in TRUNCATION_CAUSES for r in rs)
        if kinds[arm] == "rule-based" and cut:
            excluded[arm] = f"{cut} of {len(rs)} episodes end truncated ({', '.join(sorted({r['cause'] for r in rs}))})"
    baseline = [arm for arm in by_arm if kinds[arm] == "rule-based" and arm not in excluded]
    walls = {arm: [r["timing"]["wall_s"] - _load_s(r) for r in rs] for arm, rs in by_arm.items()}
    base_walls = [w for arm in baseline for w in walls[arm]]
    rule_mean = sum(base_walls) / len(base_walls) if base_walls else None
    arms = []
    for arm, rs in by_arm.items():
        wall = stats(walls[arm])
        arms.append(ArmCost(
            arm=arm, compressor=str(rs[0]["compressor"].get("name")), kind=kinds[arm], episodes=len(rs),
            truncated=sum(r["cause"] in TRUNCATION_CAUSES for r in rs), in_baseline=arm in baseline, wall=wall,
            build=stats([max(0.0, r["timing"]["build_s"] - _load_s(r)) for r in rs]),
            model_load_s=sum(_load_s(r) for r in rs),
            vs_rule_based=wall.mean_s / rule_mean if rule_mean else None,
        ))
    workers: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        pid = r["timing"].get("worker_pid")
        if isinstance(pid, int):
            workers.setdefault(pid, []).append(r)
    loads = [WorkerLoad(pid, len(rs), sum(_load_s(r) for r in rs),
                        tuple(f"{r['arm']}/{r['task']}-{r['seed']}" for r in rs if _load_s(r) > 0))
             for pid, rs in workers.items()]
    recorded = all("model_load_s" in r["timing"] and "worker_pid" in r["timing"] for r in rows)
    return ArmCostResult(run_dir=run_dir, config=config, episodes=len(rows), loads_recorded=recorded,
                         rule_based=tuple(baseline), excluded=excluded, rule_mean_wall_s=rule_mean, arms=arms,
                         workers=loads)


def read_run(run_dir: str | os.PathLike) -> ArmCostResult:
    """The report of an existing run folder (its `results.jsonl`; `run.json` names the config)."""
    path = Path(run_dir)
    if not (path / "results.jsonl").is_file():
        raise ConfigError(f"{path}: no results.jsonl here; expected a run folder written by `ctxkit ablate`")
    config = None
    info = path / "run.json"
    if info.is_file():
        try:
            config = orjson.loads(info.read_bytes()).get("config")
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"{info}: not JSON: {exc}") from None
    return analyze(read_rows(path), run_dir=str(path), config=config)


def run(config_path: str | os.PathLike = DEFAULT_CONFIG, out_dir: str | os.PathLike | None = None,
        workers: int = 1) -> ArmCostResult:
    """Run the grid of `config_path` into `out_dir` (a new, empty folder: the embedding cache starts cold;
    default a fresh temporary folder, kept) and report it."""
    if out_dir is None:
        out_dir = tempfile.mkdtemp(prefix="ctxkit-arm-costs-")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: not an empty folder; the arm-cost run needs a fresh one (a cold embedding cache)")
    config = load_config(config_path)
    before = os.getloadavg()[0]
    start = time.perf_counter()
    run_experiment(config, out, workers=workers, progress=False, report=False)
    wall = time.perf_counter() - start
    result = read_run(out)
    return replace(result, grid_wall_s=wall, load_average=(before, os.getloadavg()[0]))


def cost_table(result: ArmCostResult) -> str:
    """The report as text: one row per arm, then the model loads per worker."""
    header = ["arm", "kind", "episodes", "wall p50 s", "wall p99 s", "wall mean s", "vs rule-based",
              "build p50 s", "build p99 s", "build mean s", "load s", "truncated"]
    rows = []
    for a in result.arms:
        kind = a.kind if a.in_baseline or a.kind == "model-backed" else "rule-based (excluded)"
        ratio = "-" if a.vs_rule_based is None else f"{a.vs_rule_based:.2f}x"
        rows.append([a.arm, kind, str(a.episodes), f"{a.wall.p50_s:.3f}", f"{a.wall.p99_s:.3f}", f"{a.wall.mean_s:.3f}",
                     ratio, f"{a.build.p50_s:.3f}", f"{a.build.p99_s:.3f}", f"{a.build.mean_s:.3f}",
                     f"{a.model_load_s:.2f}", str(a.truncated)])
    head = [f"arm costs: {result.run_dir} ({result.config or 'config unknown'}), {result.episodes} episodes"]
    if result.grid_wall_s is not None and result.load_average is not None:
        head.append(f"grid wall {result.grid_wall_s:.1f} s; 1-min load average {result.load_average[0]:.2f} before, "
                    f"{result.load_average[1]:.2f} after")
    head.append("per episode, model loads taken out (listed below, once per worker)" if result.loads_recorded
                else "per episode, model loads INCLUDED (the rows do not record timing.model_load_s)")
    base = ", ".join(result.rule_based) or "none"
    mean = "-" if result.rule_mean_wall_s is None else f"{result.rule_mean_wall_s:.3f} s"
    lines = [*head, table(header, rows, left=(0, 1)), f"rule-based mean (over {base}): {mean} per episode"]
    lines += [f"left out of the rule-based mean: {arm}: {why}" for arm, why in result.excluded.items()]
    if result.workers:
        lines += ["", "model loads per worker:",
                  table(["worker pid", "episodes", "load s", "paid by"],
                        [[str(w.worker), str(w.episodes), f"{w.model_load_s:.2f}", ", ".join(w.paid_by) or "-"]
                         for w in result.workers], left=(3,))]
    lines.append(f"model loads in all: {result.model_load_s:.2f} s")
    verdict = "yes" if result.ok else "NO"
    lines.append(f"every model-backed arm <= {TARGET:g}x the rule-based mean per episode: {verdict}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run the grid (or read `--run DIR`) and print the table (or `--json`); exit 0, or 1 with
    `--check` when a model-backed arm costs more than `TARGET` times the rule-based mean."""
    parser = argparse.ArgumentParser(prog="python -m ctxkit.benchmarks.arm_costs", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"experiment config to run (default {DEFAULT_CONFIG})")
    parser.add_argument("--out", default=None, help="new run folder for the grid (default: a fresh temporary folder)")
    parser.add_argument("--run", default=None, metavar="DIR", help="read this existing run folder instead of running")
    parser.add_argument("--workers", type=int, default=1, help="parallel episodes (local processes); default 1")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--check", action="store_true", help=f"exit 1 when a model-backed arm is over {TARGET:g}x")
    args = parser.parse_args(argv)
    if args.run is not None:
        result = read_run(args.run)
    else:
        result = run(args.config, args.out, workers=args.workers)
    if args.json:
        sys.stdout.write(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(cost_table(result))
    return 1 if args.check and not result.ok else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
