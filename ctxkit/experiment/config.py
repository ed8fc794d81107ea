"""Experiment configs: a TOML file read into frozen dataclasses, every key checked.

```toml
name = "quickstart"
tokenizer = "../shared/tokenizers/qwen2.5-instruct"   # resolved, see `resolve_tokenizer`
template = ""              # optional: a template spec; empty = the tokenizer's own
template_kwargs = {}       # optional: template variables, e.g. { preserve_thinking = true } (a distinct template id)
history = "sampled"        # optional: "template" renders past turns as the template does (thinking templates)
seeds = [0, 1, 2]          # or a count: seeds = 3  (-> 0, 1, 2)
budget = 3072              # default token budget of every arm
baseline = "keep-all"      # arm the others are compared with

[limits]                   # every one optional
max_steps = 40
max_context = 3072         # context window of the policy, in tokens
wall_time_s = 120.0        # per episode

[agents.scripted]          # label; `kind` defaults to the label; other keys are the agent's params
                           # (an `openai` agent with server = "llama-cpp" gets a server the runner starts:
                           #  see `engine_server`; its keys: server_model, n_ctx, server_threads, ...)

[tasks.needle-recall]      # one table per task; keys are the task's parameters
n_files = 8

[[arms]]
name = "window"
compressor = "window"
params = { keep_first = 1 }
pins = false               # the constraint detector (default true)
budget = 2048              # optional override
agent = "scripted"         # optional when there is one agent

[report]
bootstrap_resamples = 2000
bootstrap_seed = 0
```

`load_config` checks names and types only; `runner.validate` then builds every task, agent class,
compressor and opening context before any episode runs.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ctxkit.errors import ConfigError
from ctxkit.text.rendering.output import HISTORY_MODES
from ctxkit.text.tokenizer.loader import SHARED_ENV, shared_dir

__all__ = [
    "Limits",
    "AgentConfig",
    "TaskConfig",
    "ArmConfig",
    "ReportConfig",
    "ExperimentConfig",
    "EpisodeSpec",
    "load_config",
    "parse_config",
    "resolve_tokenizer",
]

_TOP_KEYS = {"name", "tokenizer", "template", "template_kwargs", "history", "seeds", "budget", "baseline", "limits", "agents", "tasks", "arms", "report"}
_ARM_KEYS = {"name", "compressor", "params", "pins", "budget", "agent"}


@dataclass(frozen=True)
class Limits:
    """External limits; hitting one ends an episode `truncated`."""

    max_steps: int = 40
    """Policy steps per episode."""
    max_context: int = 32_768
    """Largest context the policy accepts, in tokens."""
    wall_time_s: float = 600.0
    """Wall-clock seconds per episode."""


@dataclass(frozen=True)
class AgentConfig:
    """One agent: a label, the registry kind, and its parameters."""

    label: str
    """Name used by arms and in results rows."""
    kind: str
    """Key of `agents.base.AGENTS`."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Constructor parameters."""


@dataclass(frozen=True)
class TaskConfig:
    """One task of the grid and its parameters."""

    name: str
    """Key of `tasks.base.TASKS`."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Task parameters."""


@dataclass(frozen=True)
class ArmConfig:
    """One arm: a compressor with parameters, a budget, pins on or off, and the agent."""

    name: str
    """Arm name (also its folder under `episodes/`)."""
    compressor: str
    """Key of `ctxkit.context.compress.COMPRESSORS`."""
    params: Mapping[str, Any]
    """Compressor parameters."""
    budget: int
    """Token budget of the builder."""
    pins: bool
    """Whether the builder's constraint detector runs."""
    agent: str
    """Label of the agent."""


@dataclass(frozen=True)
class ReportConfig:
    """Report settings."""

    bootstrap_resamples: int = 2000
    """Bootstrap resamples per interval."""
    bootstrap_seed: int = 0
    """Seed of the bootstrap."""
    confidence: float = 0.95
    """Interval coverage."""


@dataclass(frozen=True)
class EpisodeSpec:
    """One cell of the grid: an arm, a task, a seed."""

    arm: str
    """Arm name."""
    task: str
    """Task name."""
    seed: int
    """Task seed (the same under every arm: the grid is paired)."""

    @property
    def key(self) -> str:
        """`<arm>/<task>-<seed>`: the episode id and its log path under `episodes/`."""
        return f"{self.arm}/{self.task}-{self.seed}"


@dataclass(frozen=True)
class ExperimentConfig:
    """A whole experiment: the grid and how to run and report it."""

    path: str
    """The config file (for error messages and the report)."""
    name: str
    """Experiment name (default: the file's stem)."""
    tokenizer: str
    """Resolved tokenizer spec (a folder path, hub id or `tiktoken:...`)."""
    template: str | None
    """Template spec, or None for the tokenizer's own."""
    seeds: tuple[int, ...]
    """Task seeds, run under every arm."""
    tasks: tuple[TaskConfig, ...]
    """Tasks of the grid."""
    agents: tuple[AgentConfig, ...]
    """Agents the arms use."""
    arms: tuple[ArmConfig, ...]
    """Arms of the grid, in report order."""
    baseline: str
    """Arm the others are compared with."""
    limits: Limits
    """Per-episode limits."""
    report: ReportConfig
    """Report settings."""
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra template variables (`ctxkit.text.template.chat_template.with_kwargs`: a distinct template id)."""
    history: str = "sampled"
    """How past sampled turns enter a context (`ctxkit.text.rendering.output.HISTORY_MODES`)."""

    def arm(self, name: str) -> ArmConfig:
        """The arm named `name`."""
        return next(a for a in self.arms if a.name == name)

    def agent(self, label: str) -> AgentConfig:
        """The agent labelled `label`."""
        return next(a for a in self.agents if a.label == label)

    def task(self, name: str) -> TaskConfig:
        """The task named `name`."""
        return next(t for t in self.tasks if t.name == name)

    def episodes(self) -> list[EpisodeSpec]:
        """The full paired grid: every arm x task x seed, in a fixed order."""
        return [EpisodeSpec(a.name, t.name, s) for a in self.arms for t in self.tasks for s in self.seeds]


def _err(path: str, msg: str) -> ConfigError:
    return ConfigError(f"{path}: {msg}")


def _int(path: str, where: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _err(path, f"{where} is {value!r}; expected an integer >= {minimum}")
    return value


def _table(path: str, where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _err(path, f"{where} must be a table, got {type(value).__name__}")
    return value


def resolve_tokenizer(spec: str, config_dir: Path) -> str:
    """A tokenizer spec with relative paths resolved: `../shared/...` goes to `$CTXKIT_SHARED/...` when that is
    set; otherwise the first existing of (cwd, the config's folder, its parent: the repository root).
    Specs that are not paths (`tiktoken:...`, hub ids) and absolute paths are returned unchanged."""
    if spec.startswith("tiktoken:") or Path(spec).is_absolute():
        return spec
    parts = Path(spec).parts
    if os.environ.get(SHARED_ENV) and len(parts) >= 2 and parts[0] == ".." and parts[1] == "shared":
        return str(shared_dir().joinpath(*parts[2:]))
    if not spec.startswith("."):
        candidates = [Path.cwd() / spec, config_dir / spec, config_dir.parent / spec]
        found = next((c for c in candidates if c.exists()), None)
        return str(found.resolve()) if found else spec  # a hub id
    for base in (Path.cwd(), config_dir, config_dir.parent):
        if (base / spec).exists():
            return str((base / spec).resolve())
    return str((config_dir.parent / spec).resolve())


def load_config(path: str | os.PathLike) -> ExperimentConfig:
    """Read and check a TOML experiment config (`ConfigError` names the file and the key)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a folder; expected an experiment config file (.toml)") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the config: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{p}:{line}: not a TOML config: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                          f"{exc.start}; a binary file?)") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return parse_config(raw, path=str(p), config_dir=p.resolve().parent)


def parse_config(raw: Mapping[str, Any], *, path: str = "<config>", config_dir: Path | None = None) -> ExperimentConfig:
    """Check a config already parsed into a dict (see the module docstring for the layout)."""
    config_dir = config_dir or Path.cwd()
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise _err(path, f"unknown key(s) {unknown}; expected some of {sorted(_TOP_KEYS)}")
    for key in ("tokenizer", "tasks", "arms"):
        if key not in raw:
            raise _err(path, f"missing required key {key!r}")
    tokenizer = raw["tokenizer"]
    if not isinstance(tokenizer, str) or not tokenizer:
        raise _err(path, f"tokenizer is {tokenizer!r}; expected a path, hub id or tiktoken:<name>")
    template = raw.get("template") or None
    if template is not None and not isinstance(template, str):
        raise _err(path, f"template is {template!r}; expected a template spec string")
    template_kwargs = raw.get("template_kwargs", {})
    if not isinstance(template_kwargs, Mapping):
        raise _err(path, f"template_kwargs is {template_kwargs!r}; expected a table of template variables")
    history = raw.get("history", "sampled")
    if history not in HISTORY_MODES:
        raise _err(path, f"history is {history!r}; expected one of {list(HISTORY_MODES)}")
    seeds_raw = raw.get("seeds", 3)
    if isinstance(seeds_raw, list):
        seeds = tuple(_int(path, f"seeds[{i}]", s) for i, s in enumerate(seeds_raw))
        if len(set(seeds)) != len(seeds):
            raise _err(path, f"seeds {list(seeds)} repeat a value")
    else:
        seeds = tuple(range(_int(path, "seeds", seeds_raw, 1)))
    if not seeds:
        raise _err(path, "seeds is empty")
    budget = _int(path, "budget", raw.get("budget", 32_768), 1)

    lim = _table(path, "[limits]", raw.get("limits", {}))
    bad = sorted(set(lim) - {"max_steps", "max_context", "wall_time_s"})
    if bad:
        raise _err(path, f"[limits] has unknown key(s) {bad}; expected max_steps, max_context, wall_time_s")
    wall = lim.get("wall_time_s", Limits.wall_time_s)
    if isinstance(wall, bool) or not isinstance(wall, (int, float)) or wall <= 0:
        raise _err(path, f"[limits] wall_time_s is {wall!r}; expected a positive number of seconds")
    limits = Limits(
        max_steps=_int(path, "[limits] max_steps", lim.get("max_steps", Limits.max_steps), 1),
        max_context=_int(path, "[limits] max_context", lim.get("max_context", Limits.max_context), 1),
        wall_time_s=float(wall),
    )

    agents_raw = _table(path, "[agents]", raw.get("agents", {"scripted": {}}))
    agents = []
    for label, table in agents_raw.items():
        table = dict(_table(path, f"[agents.{label}]", table))
        kind = table.pop("kind", label)
        agents.append(AgentConfig(label, str(kind), table))
    if not agents:
        raise _err(path, "[agents] is empty")

    tasks_raw = _table(path, "[tasks]", raw["tasks"])
    tasks = tuple(TaskConfig(name, dict(_table(path, f"[tasks.{name}]", t))) for name, t in tasks_raw.items())
    if not tasks:
        raise _err(path, "[tasks] is empty")

    arms_raw = raw["arms"]
    if not isinstance(arms_raw, list) or not arms_raw:
        raise _err(path, "arms must be a non-empty array of tables ([[arms]])")
    arms = []
    for i, a in enumerate(arms_raw):
        where = f"arms[{i}]"
        a = _table(path, where, a)
        bad = sorted(set(a) - _ARM_KEYS)
        if bad:
            raise _err(path, f"{where} has unknown key(s) {bad}; expected some of {sorted(_ARM_KEYS)}")
        name = a.get("name")
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise _err(path, f"{where}: name is {name!r}; expected a non-empty name without '/'")
        where = f"arm {name!r}"
        compressor = a.get("compressor")
        if not isinstance(compressor, str) or not compressor:
            raise _err(path, f"{where}: compressor is {compressor!r}; expected a registry name")
        pins = a.get("pins", True)
        if not isinstance(pins, bool):
            raise _err(path, f"{where}: pins is {pins!r}; expected true or false")
        agent = a.get("agent")
        if agent is None:
            if len(agents) > 1:
                raise _err(path, f"{where}: several agents are configured; name one with agent = \"...\"")
            agent = agents[0].label
        if agent not in {ag.label for ag in agents}:
            raise _err(path, f"{where}: agent {agent!r} is not configured; agents: {[ag.label for ag in agents]}")
        arms.append(ArmConfig(
            name=name, compressor=compressor, params=dict(_table(path, f"{where} params", a.get("params", {}))),
            budget=_int(path, f"{where} budget", a.get("budget", budget), 1), pins=pins, agent=agent,
        ))
    names = [a.name for a in arms]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _err(path, f"arm name(s) {dup} are used more than once")
    baseline = raw.get("baseline", arms[0].name)
    if baseline not in names:
        raise _err(path, f"baseline {baseline!r} is not an arm; arms: {names}")

    rep = _table(path, "[report]", raw.get("report", {}))
    bad = sorted(set(rep) - {"bootstrap_resamples", "bootstrap_seed", "confidence"})
    if bad:
        raise _err(path, f"[report] has unknown key(s) {bad}")
    conf = rep.get("confidence", 0.95)
    if isinstance(conf, bool) or not isinstance(conf, float) or not 0 < conf < 1:
        raise _err(path, f"[report] confidence is {conf!r}; expected a number in (0, 1)")
    report = ReportConfig(
        bootstrap_resamples=_int(path, "[report] bootstrap_resamples", rep.get("bootstrap_resamples", 2000), 1),
        bootstrap_seed=_int(path, "[report] bootstrap_seed", rep.get("bootstrap_seed", 0)),
        confidence=conf,
    )
    name = raw.get("name", Path(path).stem)
    if not isinstance(name, str):
        raise _err(path, f"name is {name!r}; expected a string")
    return ExperimentConfig(
        path=path, name=name, tokenizer=resolve_tokenizer(tokenizer, config_dir), template=template, seeds=seeds,
        tasks=tasks, agents=tuple(agents), arms=tuple(arms), baseline=baseline, limits=limits, report=report,
        template_kwargs=dict(template_kwargs), history=history,
    )
