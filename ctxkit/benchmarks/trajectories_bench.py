"""`ctxkit bench build --trajectories [FOLDER]`: `bench build` over every trajectory file of a folder.

Default folder: `../shared/trajectories`. Each data file is read with `read_episodes(format="auto")`; a tool
schema file (`<source>__*_tools.json`, a JSON list of tool schemas) is given to the trajectory files of the
same source (the text before the first `__`), as tests/training/test_trajectories.py does for tau-bench. On a spread
of episodes per file (all of a file with up to 20, else every 20th) every arm builds every decision at a
fraction of the episode's full length (default 50 %, raised in 256-token steps where that is below the fixed
prefix + newest turn). One table: per file and arm, the total over the spread, the ratios of those totals,
the worst p99 and max per build, compactions, over-budget builds, ids identical to a full render.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ctxkit.benchmarks import build_bench
from ctxkit.benchmarks.workload import budget_from_fraction, episode_workloads
from ctxkit.errors import ConfigError
from ctxkit.log.importers import read_episodes
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.tokenizer.loader import load_tokenizer

NOT_YET_IMPORTED: tuple[str, ...] = ()
"""Files of `../shared/trajectories` in formats no importer reads yet (its SOURCES.md): skipped by name, and
each skip is said (`skipped_files`, the progress lines and the table's closing note). Empty: every shared
file imports."""
SPREAD_EVERY = 20
"""A file with more episodes than this is sampled every `SPREAD_EVERY`-th episode."""


def spread(n: int) -> list[int]:
    """Indexes of the episodes benchmarked in a file of `n`: all of a small file, every 20th of a large one."""
    return list(range(0, n, SPREAD_EVERY)) if n > SPREAD_EVERY else list(range(n))


def trajectory_files(folder: str | Path) -> list[tuple[Path, Path | None]]:
    """`(data file, its tool schema file or None)` for every trajectory file in `folder`, sorted by name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"--trajectories {folder}: not a directory")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".json", ".jsonl", ".traj")
                   and p.name not in NOT_YET_IMPORTED)
    tools = {p.name.split("__")[0]: p for p in files if p.name.endswith("_tools.json")}
    return [(p, tools.get(p.name.split("__")[0])) for p in files if not p.name.endswith("_tools.json")]


def skipped_files(folder: str | Path) -> list[str]:
    """Names of the files in `folder` that `trajectory_files` leaves out because no importer reads them yet."""
    return sorted(p.name for p in Path(folder).iterdir() if p.name in NOT_YET_IMPORTED)


def run(tokenizer_spec: str, folder: str | Path, *, fraction: float = 0.5, compressors=None, repeats: int = 1,
        progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Rows of the table (see the module docstring); `compressors` default to `build_bench.DEFAULT_COMPRESSORS`."""
    build_bench.require_langchain()
    tok = load_tokenizer(tokenizer_spec)
    tpl = load_template(None, tok)
    names = tuple(compressors or build_bench.DEFAULT_COMPRESSORS)
    say = progress or (lambda msg: None)
    rows: list[dict[str, Any]] = []
    for name in skipped_files(folder):
        say(f"{name}: skipped (its format has no importer yet)")
    for path, tools in trajectory_files(folder):
        n = len(read_episodes(path))  # count first: only the spread is made into offline steps
        picked = episode_workloads(str(path), tok, tpl, select=",".join(map(str, spread(n))),
                                   tools_file=str(tools) if tools else None)
        results = []
        for wl in picked:
            budget, note = budget_from_fraction(wl, tok, tpl, fraction, build_bench.fits_with(tok, tpl, "window", wl))
            say(f"{wl.name}: {len(wl.turns)} decisions, budget {budget} ({note})")
            results.append(build_bench.run_workload(tok, tpl, wl, budget=budget, budget_note=note, compressors=names,
                                                    repeats=repeats, progress=say))
        rows += _file_rows(path.name, results)
    return rows


def _file_rows(name: str, results: list) -> list[dict[str, Any]]:
    budgets = sorted({r.budget * 100 // max(1, r.episode_tokens) for r in results})
    pct = f"{budgets[0]}%" if len(budgets) == 1 else f"{budgets[0]}-{budgets[-1]}%"
    by_arm: dict[str, list] = {}
    for r in results:
        for a in r.arms:
            by_arm.setdefault(a.name, []).append(a)
    total = {k: sum(a.timing.total_s for a in v) for k, v in by_arm.items()}
    peer = next((k for k, v in by_arm.items() if v[0].kind == "peer"), None)
    ref = next((k for k, v in by_arm.items() if v[0].kind == "reference"), None)
    rows = []
    for arm, items in by_arm.items():
        complete = all(a.error is None for a in items)
        t = total[arm]
        kind = items[0].kind
        ids = None if kind in ("peer", "reference") else all(a.ids_identical is not False for a in items)
        rows.append({
            "file": name, "episodes": len(results), "builds": sum(a.timing.decisions for a in items), "arm": arm,
            "kind": kind, "total_s": t,
            "vs_peer": total[peer] / t if peer and t and complete else None,
            "vs_encode_only": t / total[ref] if ref and total[ref] and complete else None,
            "p99_ms": max(a.timing.p99_ms for a in items), "max_ms": max(a.timing.max_ms for a in items),
            "compactions": sum(a.compactions for a in items) if kind.startswith("ctxkit") else None,
            "over_budget": None if kind == "reference" else sum(a.over_budget for a in items),
            "ids_identical": ids, "budgets": pct,
            "errors": [a.error for a in items if a.error],
        })
    return rows
