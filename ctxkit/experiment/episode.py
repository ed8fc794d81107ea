"""One episode of the grid: task + builder + agent, every event logged, ended with a typed outcome.

`run_episode(config, spec, out_dir)` is what every executor runs (it is picklable and needs nothing but
its arguments). It writes `out_dir/episodes/<arm>/<task>-<seed>.jsonl` and returns the results row.

The loop, per step: check the limits (steps, wall time), build the context (compaction and detected pins
are appended by the builder), check the context against the policy's window, let the agent act on the
context's ids, record the `Step`, run its tool calls and record each `ToolResult` (and a state snapshot
for tasks with external state). Ends:

| what happened | outcome | cause | reward_kind |
|---|---|---|---|
| the policy answered | terminated | `answered` / `constraint_violated` | `scored` / `constraint_violation` |
| invalid tool call (unknown tool, bad JSON or arguments) | terminated | `invalid_tool_call` | `task_failure` |
| a tool raised or returned `error` | terminated | `tool_failed` | `tool_failure` |
| a tool timed out | terminated | `tool_timeout` | `tool_failure` |
| over the budget (`BudgetError`, keep-all overflow) | truncated | `context_budget` | `length_truncation` |
| over the policy's window (`limits.max_context`) | truncated | `context_limit` | `length_truncation` |
| turn cut by the generation limit, no tool call | truncated | `max_new_tokens` | `length_truncation` |
| `limits.max_steps` steps taken | truncated | `max_steps` | `limit_truncation` |
| `limits.wall_time_s` passed | truncated | `wall_time` | `limit_truncation` |
| the library refused (a `CtxkitError` from building, rendering or the agent) | truncated | `harness_error` | `unscored` |

A harness error ends only its episode (the error text is kept in `EpisodeEnd.scores["error"]`) so one bad
episode does not stop a long grid; the report lists it under Ends. Any other exception is a bug and
propagates.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ctxkit.errors import BudgetError, CtxkitError
from ctxkit.events import EpisodeEnd, EpisodeStart, ToolResult, message_from_openai
from ctxkit.experiment.agents.base import Agent, make_agent, to_step
from ctxkit.experiment.config import EpisodeSpec, ExperimentConfig
from ctxkit.experiment.metrics import StepRecord, common_prefix, episode_metrics
from ctxkit.experiment.tasks.base import TaskEpisode, make_task
from ctxkit.experiment.tasks.tools import InvalidToolCall, ToolOutput
from ctxkit.context.builder import ContextBuilder
from ctxkit.context.embedding_cache import run_cache_dir, using_cache_dir
from ctxkit.context.models import model_load_seconds
from ctxkit.context.view import message_of
from ctxkit.log.event_log import EventLog
from ctxkit.log.state import DirectoryState, record_snapshot
from ctxkit.text.rendering.renderer import IncrementalRenderer
from ctxkit.text.template.chat_template import load_template, with_kwargs
from ctxkit.text.tokenizer.loader import load_tokenizer

__all__ = ["run_episode", "log_path", "step_seed", "close_agents"]

_AGENTS: dict[tuple[Any, ...], Agent] = {}
"""Agents of this process, reused across episodes: one per agent table (label, kind, parameters), task,
tokenizer and template, so a second run in the same process with another tokenizer, template or agent
table never gets an agent built for the first."""


def log_path(out_dir: Path, spec: EpisodeSpec) -> Path:
    """Where the episode's event log goes."""
    return Path(out_dir) / "episodes" / spec.arm / f"{spec.task}-{spec.seed}.jsonl"


def step_seed(spec: EpisodeSpec, step: int) -> int:
    """Sampling seed of one step: the same for every arm (paired), different per task, seed and step."""
    return int(hashlib.sha256(f"{spec.task}:{spec.seed}:{step}".encode()).hexdigest()[:8], 16)


def close_agents() -> None:
    """Close every cached agent of this process."""
    while _AGENTS:
        _, agent = _AGENTS.popitem()
        agent.close()


atexit.register(close_agents)


def _agent(config: ExperimentConfig, label: str, task: str, tokenizer: Any, template: Any) -> Agent:
    ac = config.agent(label)
    key = (label, ac.kind, json.dumps(dict(ac.params), sort_keys=True, default=repr), task,
           getattr(tokenizer, "id", id(tokenizer)), getattr(template, "id", template))
    if key not in _AGENTS:
        _AGENTS[key] = make_agent(ac.kind, tokenizer=tokenizer, template=template, task=task, **dict(ac.params))
    return _AGENTS[key]


class _FullHistory:
    """Token count of the history rendered without any compaction (what keep-all would send)."""

    def __init__(self, tokenizer: Any, template: Any, tools: Any, history: str = "sampled"):
        self._renderer = IncrementalRenderer(tokenizer, template, list(tools) or None, history=history)
        self._seen = 0

    def tokens(self, events: Any) -> int:
        for event in events[self._seen:]:
            vm = message_of(event)
            if vm is not None:
                self._renderer.append(vm.to_chat())
        self._seen = len(events)
        return len(self._renderer.render(add_generation_prompt=True).token_ids)


def _snapshot(log: Any, episode: TaskEpisode, after_event_id: str | None) -> None:
    if not episode.snapshot_dirs:
        return

    for name, path in episode.snapshot_dirs.items():
        record_snapshot(log, DirectoryState(path), name=name, after_event_id=after_event_id)


def _harness_error(exc: Exception) -> EpisodeEnd:
    return _end("truncated", "harness_error", None, "unscored", error=f"{type(exc).__name__}: {exc}")


def _end(outcome: str, cause: str, reward: float | None, reward_kind: str, **scores: Any) -> EpisodeEnd:
    return EpisodeEnd(outcome=outcome, cause=cause, reward=reward, reward_kind=reward_kind,  # type: ignore[arg-type]
                      scores={"quality": 0.0, "violations": 0, **scores})


def run_episode(config: ExperimentConfig, spec: EpisodeSpec, out_dir: str | Path) -> dict[str, Any]:
    """Run one episode, write its log, and return its results row. Embeddings go through the run's
    on-disk cache (`<out_dir>/cache/embeddings`), shared by every arm, episode and worker of the run. The row's
    `timing` also says which worker process ran it (`worker_pid`) and how many of its seconds went to loading
    models (`model_load_s`: paid once per worker, by the first episode that needs the model)."""
    with using_cache_dir(run_cache_dir(out_dir)):
        return _run_episode(config, spec, out_dir)


def arm_builder(config: ExperimentConfig, arm: Any, tokenizer: Any) -> ContextBuilder:
    """The context builder of one arm: the config's template (with its `template_kwargs`) and `history` mode."""
    template: Any = config.template
    if config.template_kwargs:
        template = with_kwargs(load_template(template, tokenizer), config.template_kwargs)
    return ContextBuilder(tokenizer, template, arm.compressor, arm.budget, arm.params, detect_pins=arm.pins,
                          history=config.history)


def _run_episode(config: ExperimentConfig, spec: EpisodeSpec, out_dir: str | Path) -> dict[str, Any]:
    wall_start = time.perf_counter()
    loaded_before = model_load_seconds()
    arm = config.arm(spec.arm)
    task_cfg = config.task(spec.task)
    limits = config.limits
    task = make_task(task_cfg.name, task_cfg.params, where=config.path)
    tokenizer = load_tokenizer(config.tokenizer)
    builder = arm_builder(config, arm, tokenizer)
    agent = _agent(config, arm.agent, spec.task, tokenizer, builder.template)
    path = log_path(Path(out_dir), spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    records: list[StepRecord] = []
    with tempfile.TemporaryDirectory(prefix="ctxkit-task-") as tmp:
        episode = task.episode(spec.seed, Path(tmp))
        agent_cfg = config.agent(arm.agent)
        # One process writes an episode's log, start to end (resume sets a partial log aside and starts over):
        # it holds the log from create to close (lock="writer"), so an append is one write.
        log = EventLog.create(path, episode_id=spec.key, metadata={"experiment": config.name, "arm": arm.name},
                              lock="writer")
        try:
            log.append(EpisodeStart(
                episode_id=spec.key,
                tools=episode.tools,
                task={"name": task.name, "version": task.version, "seed": spec.seed, "params": dataclasses.asdict(task),
                      "stateful": bool(episode.snapshot_dirs)},
                context=builder.describe(),
                sampler={"agent": agent_cfg.label, "kind": agent_cfg.kind, "params": dict(agent_cfg.params),
                         "seed": spec.seed, "step_seed": "int(sha256('<task>:<seed>:<step>')[:8], 16)"},
                metadata={"experiment": config.name, "arm": arm.name, "limits": dataclasses.asdict(limits),
                          "facts": dict(episode.facts)},
            ))
            log.extend([message_from_openai(m, where=f"{task.name} opening message") for m in episode.messages])
            _snapshot(log, episode, None)
            end = _loop(config, spec, log, builder, agent, episode, records, wall_start)
            log.append(end)
        finally:
            log.close()
    events = log.events()
    wall_s = time.perf_counter() - wall_start
    row = {
        "arm": spec.arm,
        "task": spec.task,
        "seed": spec.seed,
        "episode_id": spec.key,
        "agent": arm.agent,
        "agent_kind": agent_cfg.kind,
        "agent_name": getattr(agent, "name", agent_cfg.kind),
        "compressor": builder.describe()["compressor"],
        "budget": arm.budget,
        "pins_detection": arm.pins,
        "log": path.relative_to(Path(out_dir)).as_posix(),
        "n_events": len(events),
        "final_context_hash": next((e.context_hash for e in reversed(events) if getattr(e, "kind", "") == "step"), None),
    }
    row.update(episode_metrics(events, records, wall_s=wall_s))
    # where the one-time costs of a worker went: model loads this episode paid (part of wall_s), and which
    # worker process ran it (`ctxkit.benchmarks.arm_costs` amortizes a load once per worker)
    row["timing"]["model_load_s"] = model_load_seconds() - loaded_before
    row["timing"]["worker_pid"] = os.getpid()
    return row


def _loop(config, spec, log, builder, agent, episode: TaskEpisode, records: list[StepRecord], wall_start: float) -> EpisodeEnd:
    limits = config.limits
    full = _FullHistory(builder.tokenizer, builder.template, episode.tools, builder.history)
    prev_ids: tuple[int, ...] = ()
    for step in range(limits.max_steps + 1):
        if time.perf_counter() - wall_start > limits.wall_time_s:
            return _end("truncated", "wall_time", None, "limit_truncation", limit=limits.wall_time_s)
        if step == limits.max_steps:
            return _end("truncated", "max_steps", None, "limit_truncation", limit=limits.max_steps)
        t0 = time.perf_counter()
        try:
            ctx = builder.build(log)
        except BudgetError as exc:
            return _end("truncated", "context_budget", None, "length_truncation", error=str(exc))
        except CtxkitError as exc:
            return _harness_error(exc)
        build_s = time.perf_counter() - t0
        if ctx.truncated:
            return _end("truncated", "context_budget", None, "length_truncation", tokens=ctx.n_tokens, budget=ctx.budget)
        if ctx.n_tokens > limits.max_context:
            return _end("truncated", "context_limit", None, "length_truncation", tokens=ctx.n_tokens,
                        limit=limits.max_context)
        full_tokens = full.tokens(log.events())
        t1 = time.perf_counter()
        try:
            turn = agent.act(ctx, tools=episode.tools, seed=step_seed(spec, step))
        except CtxkitError as exc:
            return _harness_error(exc)
        generate_s = time.perf_counter() - t1
        timings = {"build_s": build_s, "generate_s": float(turn.timings.get("generate_s", generate_s))}
        log.append(to_step(turn, ctx, timings=timings))
        end, tool_s = _act_on(log, episode, turn)
        records.append(StepRecord(
            prompt_tokens=ctx.n_tokens, full_tokens=full_tokens, reused_prefix=common_prefix(prev_ids, ctx.token_ids),
            generated_tokens=len(turn.token_ids), build_s=build_s, prefill_s=float(turn.timings.get("prefill_s", 0.0)),
            decode_s=float(turn.timings.get("decode_s", 0.0)), generate_s=timings["generate_s"], tool_s=tool_s,
        ))
        prev_ids = ctx.token_ids
        if end is not None:
            return end
    raise AssertionError("unreachable")  # pragma: no cover


def _act_on(log, episode: TaskEpisode, turn) -> tuple[EpisodeEnd | None, float]:
    """Run the turn's tool calls (or score its answer); the episode's end if this turn ends it."""
    if not turn.tool_calls:
        if turn.finish_reason == "length":
            return _end("truncated", "max_new_tokens", None, "length_truncation"), 0.0
        if turn.finish_reason == "abort":  # the engine gave up (e.g. an HTTP timeout): a limit, not an answer
            return _end("truncated", "generation_aborted", None, "limit_truncation"), 0.0
        score = episode.score(turn.content or "")
        return _end("terminated", score.cause, score.reward, score.reward_kind, quality=score.quality,
                    violations=score.violations, **dict(score.details)), 0.0
    tool_s = 0.0
    end: EpisodeEnd | None = None
    for tc in turn.tool_calls:
        if end is not None:  # an earlier call ended the episode: answer the rest so no call is orphaned
            log.append(ToolResult(tool_call_id=tc.id, name=tc.name, status="error", duration_s=0.0,
                                  content="not run: the episode ended at an earlier tool call"))
            continue
        invalid = None
        try:
            out = episode.call_tool(tc.name, tc.arguments_text())
        except InvalidToolCall as exc:
            invalid = str(exc)
            out = ToolOutput(f"invalid tool call: {exc}", "error", 0.0)
        result = log.append(ToolResult(tool_call_id=tc.id, name=tc.name, content=out.content, status=out.status,
                                       duration_s=out.duration_s))
        tool_s += out.duration_s
        _snapshot(log, episode, result.id)
        if invalid is not None:
            end = _end("terminated", "invalid_tool_call", 0.0, "task_failure", error=invalid, tool=tc.name)
        elif out.status == "timeout":
            end = _end("terminated", "tool_timeout", 0.0, "tool_failure", error=out.content, tool=tc.name)
        elif out.status != "ok":
            end = _end("terminated", "tool_failed", 0.0, "tool_failure", error=out.content, tool=tc.name)
    return end, tool_s
