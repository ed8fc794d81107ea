"""The task interface: a seeded task builds episodes with real tools in a real directory, and scores answers.

A task is one small frozen dataclass whose fields are its parameters (so a config's `[tasks.<name>]` table
maps onto it and unknown keys fail), with `name`, `version` and `episode(seed, workdir) -> TaskEpisode`.
`TASKS` is the explicit registry; `make_task` builds one from config parameters with typed errors.

How an episode ends (the runner applies these; `EpisodeEnd` keeps them distinguishable):
- the policy answers (no tool call): `TaskEpisode.score(answer)` decides; `reward_kind="scored"` with a quality
  in [0, 1], or `constraint_violation` when the task's rule was broken;
- an invalid tool call (unknown tool, bad JSON, wrong arguments): task failure (`task_failure`);
- a tool that raises, returns `error` or times out: tool failure (`tool_failure`);
- a limit (steps, context, wall time, generation length): truncation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Protocol

from ctxkit.errors import ConfigError
from ctxkit.registry import load_registered
from ctxkit.experiment.tasks.tools import ToolBox, ToolOutput

__all__ = ["Score", "TaskEpisode", "Task", "TASKS", "task_class", "make_task", "FAULTS"]

FAULTS = ("raise", "error", "timeout")
"""Kinds of injected tool fault: the tool raises, returns `error`, or reports a `timeout`."""


@dataclass(frozen=True)
class Score:
    """A scorer's verdict on a final answer."""

    reward: float | None
    """Numeric reward (None when unscored)."""
    reward_kind: str
    """`scored` or `constraint_violation` (see `events.RewardKind`)."""
    cause: str
    """`answered` or `constraint_violated`."""
    quality: float
    """Task quality in [0, 1] (0 for a violation)."""
    violations: int = 0
    """Number of broken constraints."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """Expected and given answers, file hashes, ... (JSON-able)."""


@dataclass
class TaskEpisode:
    """One seeded instance of a task: opening messages, real tools, a scorer, and the state to snapshot."""

    messages: tuple[Mapping[str, Any], ...]
    """Opening chat messages (system, user) in the OpenAI shape."""
    toolbox: ToolBox
    """The episode's tools."""
    scorer: Callable[[str], Score]
    """Scores the final answer (may inspect the working directory)."""
    workdir: Path
    """The real directory the tools act on."""
    snapshot_dirs: Mapping[str, Path] = field(default_factory=dict)
    """Directories to snapshot after every tool call (`name -> path`), e.g. `{"workdir": ...}`."""
    facts: Mapping[str, Any] = field(default_factory=dict)
    """Ground truth kept for the results row (expected answer, where the needle is, ...)."""

    @property
    def tools(self) -> tuple[dict[str, Any], ...]:
        """OpenAI tool schemas offered to the policy."""
        return self.toolbox.schemas()

    def call_tool(self, name: str, arguments: str) -> ToolOutput:
        """Run one tool call (raises `InvalidToolCall` for a malformed call)."""
        return self.toolbox.call(name, arguments)

    def score(self, answer: str) -> Score:
        """Score the final answer."""
        return self.scorer(answer)


class Task(Protocol):
    """A seeded, deterministic task: same seed, same files, same messages, same expected answer."""

    name: ClassVar[str]
    """Registry name, e.g. `needle-recall`."""
    version: ClassVar[str]
    """Version of the generator and scorer; bump when episodes change."""

    def episode(self, seed: int, workdir: Path) -> TaskEpisode:
        """Build the episode for `seed`, writing its files under the (empty, existing) `workdir`."""
        ...


TASKS: dict[str, str] = {
    "constraint-edit": "ctxkit.experiment.tasks.constraint_edit:ConstraintEdit",
    "needle-recall": "ctxkit.experiment.tasks.needle_recall:NeedleRecall",
    "calculator-chain": "ctxkit.experiment.tasks.calculator_chain:CalculatorChain",
    "multi-hop": "ctxkit.experiment.tasks.multi_hop:MultiHop",
}
"""Registry: task name -> `"module:Class"`."""


def task_class(name: str) -> type:
    """The class registered under `name`; `ConfigError` listing the registered tasks when unknown."""
    return load_registered(TASKS, name, "task")


def make_task(name: str, params: Mapping[str, Any] | None = None, *, where: str = "config") -> Task:
    """Build task `name` from config `params`, checking names and types (`ConfigError` says where)."""
    try:
        cls = task_class(name)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    params = dict(params or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: task {name!r} has no parameter(s) {unknown}; parameters: {sorted(fields)}")
    for key, value in params.items():
        default = fields[key].default
        if default is not dataclasses.MISSING and type(value) is not type(default):
            raise ConfigError(
                f"{where}: task {name!r} parameter {key!r} must be {type(default).__name__}, got {value!r}"
            )
    try:
        return cls(**params)
    except ValueError as exc:
        raise ConfigError(f"{where}: task {name!r}: {exc}") from exc


def check_common(task: Any) -> None:
    """Shared parameter checks (`fault`, `fault_at_call`); raises `ValueError` naming the parameter."""
    if task.fault not in FAULTS:
        raise ValueError(f"fault must be one of {list(FAULTS)}, got {task.fault!r}")
    if task.fault_at_call < -1:
        raise ValueError(f"fault_at_call must be -1 (no fault) or a call index >= 0, got {task.fault_at_call}")
