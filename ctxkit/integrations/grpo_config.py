"""The GRPO-under-compression config (`ctxkit train grpo CONFIG`): one policy, one task, several runs that
differ in their context policy (compressor, pins) or their schedule (sync, one-step-off).

```toml
name = "grpo-smollm2"
model = "../runs/sft/checkpoint"    # the policy to train: a folder or .gguf, relative to this file; "default": SmolLM2
tokenizer = "../shared/tokenizers/smollm2-135m-instruct"   # resolved as an ablation config's tokenizer
task = "calculator-chain"
task_params = { n_steps = 3, lag = 2, lines_per_file = 6 }
seeds = [100, 101, 102, 103]        # training task seeds
eval_seeds = [0, 1, 2, 3]           # held out: none may be a training seed
threads = 2                         # torch CPU threads

[grpo]                              # GrpoSpec fields shared by every run (ctxkit.integrations.grpo)
steps = 8
budget = 1024

[[runs]]                            # each run: a name and any GrpoSpec field but task, task_params and seeds
name = "window-sync"
compressor = "window"
compressor_params = { keep_first = 1 }
pins = false

[quick]                             # --quick: these GrpoSpec fields replace [grpo]'s in every run
steps = 2
```
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ctxkit.errors import ConfigError
from ctxkit.experiment.config import resolve_tokenizer
from ctxkit.integrations.grpo import GrpoSpec
from ctxkit.integrations.sft_config import read_config_table

__all__ = ["GrpoConfig", "GrpoRun", "load_grpo_config"]

_TOP_KEYS = {"name", "model", "tokenizer", "task", "task_params", "seeds", "eval_seeds", "threads", "grpo", "runs",
             "quick"}
_SHARED_FIELDS = ("task", "task_params", "seeds")
_SPEC_FIELDS = {f.name for f in dataclasses.fields(GrpoSpec)} - set(_SHARED_FIELDS)


@dataclass(frozen=True)
class GrpoRun:
    """One run of a GRPO config."""

    name: str
    """The run's name (its folder under the output folder)."""
    spec: GrpoSpec
    """What it trains on and how."""


@dataclass(frozen=True)
class GrpoConfig:
    """A parsed GRPO config."""

    path: str
    """The config file."""
    name: str
    """The config's name."""
    model: str | None
    """The policy to train (a folder or `.gguf` file); None is the default SmolLM2-135M-Instruct."""
    tokenizer: str
    """Resolved tokenizer spec of the contexts."""
    eval_seeds: tuple[int, ...]
    """Held-out task seeds, disjoint from every run's training seeds."""
    threads: int | None
    """torch CPU threads; None leaves torch's default."""
    runs: tuple[GrpoRun, ...]
    """The runs, in file order."""


def _err(path: str, message: str) -> ConfigError:
    return ConfigError(f"{path}: {message}")


def _seeds(path: str, key: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value):
        raise _err(path, f"{key} is {value!r}; expected a non-empty list of integers >= 0")
    return tuple(value)


def _spec_fields(path: str, table: Any, where: str) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise _err(path, f"{where} must be a table")
    if bad := sorted(set(table) - _SPEC_FIELDS - ({"name"} if where.startswith("[[runs]]") else set())):
        raise _err(path, f"{where} has unknown key(s) {bad}; expected GrpoSpec fields {sorted(_SPEC_FIELDS)}")
    out = {k: v for k, v in table.items() if k != "name"}
    for key in ("compressor_params",):
        if key in out and not isinstance(out[key], Mapping):
            raise _err(path, f"{where} {key} must be a table")
    if "stop_token_ids" in out:
        out["stop_token_ids"] = tuple(out["stop_token_ids"])
    return out


def _runs(path: str, raw: Mapping[str, Any], shared: dict[str, Any], quick: dict[str, Any]) -> tuple[GrpoRun, ...]:
    """The `[[runs]]`, each a `GrpoSpec` of `shared`, then `[grpo]`, the run's own fields and `quick`, in that order."""
    tables = raw.get("runs")
    if not isinstance(tables, list) or not tables:
        raise _err(path, "[[runs]] is missing: give at least one run")
    runs: list[GrpoRun] = []
    for i, table in enumerate(tables):
        where = f"[[runs]] {i}"
        fields = {**_spec_fields(path, raw.get("grpo", {}), "[grpo]"), **_spec_fields(path, table, where)}
        name = table.get("name")
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise _err(path, f"{where} name is {name!r}; expected a folder name")
        if name in {r.name for r in runs}:
            raise _err(path, f"{where} name {name!r} is used twice")
        try:
            spec = GrpoSpec(**{**shared, **fields, **quick})
        except ConfigError as exc:
            raise _err(path, f"{where} ({name}): {exc}") from None
        except TypeError as exc:
            raise _err(path, f"{where} ({name}): {exc}") from None
        runs.append(GrpoRun(name, spec))
    return tuple(runs)


def load_grpo_config(path: str | os.PathLike, *, quick: bool = False) -> GrpoConfig:
    """Parse and check a GRPO config (module docstring); `quick` applies its `[quick]` table to every run.
    Every problem is a `ConfigError` naming the file and the key; a held-out seed that is also a training seed
    is refused."""
    where = os.fspath(path)
    raw = read_config_table(where, _TOP_KEYS)
    base = Path(where).resolve().parent
    for key in ("task", "tokenizer"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise _err(where, f"{key} is {raw.get(key)!r}; expected a non-empty string")
    params = raw.get("task_params", {})
    if not isinstance(params, Mapping):
        raise _err(where, "task_params must be a table")
    seeds = _seeds(where, "seeds", raw.get("seeds"))
    eval_seeds = _seeds(where, "eval_seeds", raw.get("eval_seeds"))
    if overlap := sorted(set(seeds) & set(eval_seeds)):
        raise _err(where, f"eval_seeds {overlap} are also training seeds; held-out seeds must be disjoint from them")
    quick_table = _spec_fields(where, raw.get("quick", {}), "[quick]")
    quick_fields = quick_table if quick else {}
    shared = {"task": raw["task"], "task_params": dict(params), "seeds": seeds}
    runs = _runs(where, raw, shared, quick_fields)
    threads = raw.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise _err(where, f"threads is {threads!r}; expected an integer >= 1")
    model = raw.get("model", "default")
    if not isinstance(model, str) or not model:
        raise _err(where, f"model is {model!r}; expected \"default\", a model folder or a .gguf file")
    name = raw.get("name", Path(where).stem)
    if not isinstance(name, str) or not name:
        raise _err(where, f"name is {name!r}; expected a non-empty string")
    return GrpoConfig(path=where, name=name, model=None if model == "default" else str((base / model).resolve()),
                      tokenizer=resolve_tokenizer(raw["tokenizer"], base), eval_seeds=eval_seeds, threads=threads,
                      runs=runs)
