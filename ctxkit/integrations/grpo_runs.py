"""`ctxkit train grpo CONFIG --out DIR`: every run of a GRPO config, then one report comparing them.

Each run trains its own copy of the config's policy with `run_grpo` into `DIR/<run>/` (its episode logs and
`grpo_log.jsonl`). The report (`DIR/grpo.json`, `DIR/report.md`, `DIR/grpo.png`) reads the runs' logs back:

- per run: iterations, wall time, mean reward of the first and the last batch, samples per kept episode (more
  than one where a compaction split a history), generated tokens per second of sampling, loss-bearing tokens per
  wall second, mean policy-version lag and data age;
- at equal wall time: T is the shortest run's total wall time; each run is read up to T (the iterations that
  ended by then), so a faster schedule shows more updates and more data in the same time, and the mean reward
  of the batches it trained by T;
- runs that showed the policy identical contexts at every decision of every episode they share (same step folder
  and episode file; `ctxkit.experiment.same_contexts`): their difference measures nothing between their context
  policies.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ctxkit.errors import ConfigError
from ctxkit.experiment.same_contexts import SameContexts, decision_trace, same_context_pairs
from ctxkit.integrations.grpo_config import GrpoConfig
from ctxkit.text.tokenizer.loader import load_tokenizer

__all__ = ["RunSummary", "read_grpo_log", "run_grpo_config", "summarize_run", "write_report"]


@dataclass(frozen=True)
class RunSummary:
    """One run's figures over its iterations that ended by `until_s`."""

    run: str
    """The run's name."""
    mode: str
    """Its schedule (`sync` or `one-step-off`)."""
    context: str
    """Its context policy: the compressor, `+pins` when constraints are pinned."""
    until_s: float
    """Wall seconds read (the run's whole time, or the equal-wall-time cut)."""
    iterations: int
    """Iterations (updates) that ended by `until_s`."""
    episodes: int
    """Episodes trained on by then."""
    first_reward: float | None
    """Mean reward of the first batch (None when no iteration ended by `until_s`)."""
    last_reward: float | None
    """Mean reward of the last batch read (None as above)."""
    mean_reward: float | None
    """Mean reward over every batch read (None as above)."""
    samples_per_episode: float
    """Samples over kept episodes (1.0: no history was rewritten)."""
    generated_tokens_per_s: float
    """Sampled tokens over seconds of sampling."""
    loss_tokens_per_s: float
    """Loss-bearing tokens over wall seconds."""
    mean_lag: float
    """Mean policy-version lag of the batches (0: on-policy)."""
    mean_data_age_s: float
    """Mean seconds from the end of a batch's sampling to the start of its update."""


def read_grpo_log(path: str | Path) -> list[dict[str, Any]]:
    """The iterations of a `grpo_log.jsonl`; a `ConfigError` naming the file and line for a bad record."""
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: line {n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not {"mean_reward", "wall_s", "episodes"} <= set(row):
            raise ConfigError(f"{path}: line {n}: not a GRPO iteration record")
        rows.append(row)
    return rows


def summarize_run(run: str, mode: str, context: str, rows: Sequence[Mapping[str, Any]],
                  until_s: float | None = None) -> RunSummary:
    """A run's figures over the iterations whose cumulative wall time is at most `until_s` (None: all); a run
    with no iteration ended by then has 0 iterations and no rewards."""
    read, clock = [], 0.0
    for row in rows:
        clock += float(row["wall_s"])
        if until_s is not None and clock > until_s + 1e-9:
            break
        read.append(row)
    total = sum(float(r["wall_s"]) for r in read)
    kept = sum(int(r["episodes"]) - int(r["discarded"]) for r in read)
    generate_s = sum(float(r["generate_s"]) for r in read)

    def mean(key: str) -> float:
        return sum(float(r[key]) for r in read) / len(read) if read else 0.0

    return RunSummary(
        run=run, mode=mode, context=context, until_s=total if until_s is None else until_s, iterations=len(read),
        episodes=sum(int(r["episodes"]) for r in read),
        first_reward=float(read[0]["mean_reward"]) if read else None,
        last_reward=float(read[-1]["mean_reward"]) if read else None, mean_reward=mean("mean_reward") if read else None,
        samples_per_episode=sum(int(r["samples"]) for r in read) / kept if kept else 0.0,
        generated_tokens_per_s=sum(int(r["generated_tokens"]) for r in read) / generate_s if generate_s else 0.0,
        loss_tokens_per_s=sum(int(r["loss_tokens"]) for r in read) / total if total else 0.0,
        mean_lag=mean("lag"), mean_data_age_s=mean("data_age_s"))


def _context(spec: Any) -> str:
    return f"{spec.compressor}{'+pins' if spec.pins else ''}"


def run_grpo_config(config: GrpoConfig, out_dir: str | Path, *, force: bool = False,
                    log: Any = print) -> tuple[list[RunSummary], list[RunSummary]]:
    """Run every run of `config` into `out_dir/<run>/` (an existing run folder is refused unless `force`, which
    replaces it), then write the report; returns (whole-run summaries, equal-wall-time summaries)."""
    from ctxkit.integrations.grpo import run_grpo  # lazy: torch and TRL load on first use

    out = Path(out_dir)
    for run in config.runs:
        if (out / run.name).exists() and not force:
            raise ConfigError(f"--out {out}: run folder {run.name} already exists; pass --force to replace it")
    tok = load_tokenizer(config.tokenizer)
    for run in config.runs:
        folder = out / run.name
        if folder.exists():
            shutil.rmtree(folder)
        log(f"run {run.name}: {_context(run.spec)}, {run.spec.mode}, {run.spec.steps} iterations")
        for step in run_grpo(run.spec, folder, model_path=config.model, tokenizer=tok, threads=config.threads):
            log(f"  {run.name} step {step.step}: reward {step.mean_reward:.3f}, {step.samples} samples, "
                f"lag {step.lag}, {step.wall_s:.0f} s")
    return write_report(config, out)


def write_report(config: GrpoConfig, out_dir: str | Path) -> tuple[list[RunSummary], list[RunSummary]]:
    """Read every run's `grpo_log.jsonl` under `out_dir` and write `grpo.json`, `report.md` and `grpo.png`."""
    out = Path(out_dir)
    logs = {run.name: read_grpo_log(out / run.name / "grpo_log.jsonl") for run in config.runs}
    whole = [summarize_run(r.name, r.spec.mode, _context(r.spec), logs[r.name]) for r in config.runs]
    cut = min(s.until_s for s in whole)
    equal = [summarize_run(r.name, r.spec.mode, _context(r.spec), logs[r.name], until_s=cut) for r in config.runs]
    same = same_context_pairs({r.name: run_traces(out / r.name) for r in config.runs})
    (out / "grpo.json").write_text(json.dumps({"config": config.path, "name": config.name, "model": config.model,
                                               "equal_wall_time_s": cut, "runs": [asdict(s) for s in whole],
                                               "at_equal_wall_time": [asdict(s) for s in equal],
                                               "same_contexts": [asdict(p) for p in same]}, indent=2) + "\n")
    (out / "report.md").write_text(_markdown(config, whole, equal, cut, same))
    _plot(logs, out / "grpo.png")
    return whole, equal


def run_traces(folder: Path) -> dict[str, tuple[str, ...]]:
    """A run folder's episodes (`stepNNNN/<episode>.jsonl`, relative) -> the context hashes of their decisions."""
    return {p.relative_to(folder).as_posix(): decision_trace(p) for p in sorted(folder.glob("step*/*.jsonl"))}


def _markdown(config: GrpoConfig, whole: Sequence[RunSummary], equal: Sequence[RunSummary], cut: float,
              same: Sequence[SameContexts] = ()) -> str:
    head = ("| run | context | mode | iterations | wall s | reward first | reward last | reward mean | samples/episode "
            "| gen tok/s | loss tok/s | lag | data age s |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")

    def rows(summaries: Sequence[RunSummary]) -> str:
        return "".join(
            f"| {s.run} | {s.context} | {s.mode} | {s.iterations} | {s.until_s:.0f} | {_num(s.first_reward)} | "
            f"{_num(s.last_reward)} | {_num(s.mean_reward)} | {s.samples_per_episode:.2f} | {s.generated_tokens_per_s:.1f} | "
            f"{s.loss_tokens_per_s:.1f} | {s.mean_lag:.2f} | {s.mean_data_age_s:.1f} |\n" for s in summaries)

    return (f"# GRPO under compression: {config.name}\n\nConfig `{config.path}`, policy `{config.model or 'default'}`, "
            f"held-out seeds {list(config.eval_seeds)} (not trained on).\n\n## Whole runs\n\n{head}{rows(whole)}\n"
            f"## At equal wall time ({cut:.0f} s, the shortest run)\n\n{head}{rows(equal)}" + _same_section(same))


def _same_section(same: Sequence[SameContexts]) -> str:
    if not same:
        return ""
    lines = "".join(f"- `{p.first}` and `{p.second}`: identical contexts at every decision ({p.episodes} of "
                    f"{p.episodes} shared episodes, {p.decisions} decisions, equal context hashes)\n" for p in same)
    return ("\n## Runs that showed the policy the same contexts\n\nHere these context policies built the same "
            f"tokens, so their difference measures nothing between them:\n\n{lines}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _plot(logs: Mapping[str, Sequence[Mapping[str, Any]]], path: Path) -> None:
    import matplotlib  # lazy: the report extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after choosing the Agg backend

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rows in logs.items():
        clock, xs = 0.0, []
        for r in rows:
            clock += float(r["wall_s"])
            xs.append(clock)
        ax.plot(xs, [float(r["mean_reward"]) for r in rows], marker="o", label=name)
    ax.set_xlabel("wall seconds")
    ax.set_ylabel("mean batch reward")
    ax.set_title("GRPO reward by run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
