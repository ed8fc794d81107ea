"""The agent interface of the A/B harness: what a policy returns for one context, and how agents are named.

An agent is driven only by the context the builder produced (`BuiltContext.token_ids`, the exact ids the
policy is given). It returns an `AgentTurn`: the token ids it sampled (token-in-token-out), the message
they decode to, and how they were sampled. The runner turns that into a `Step` event with `to_step`.

Construction contract (what `make_agent` and the runner pass): every agent class is built as
`Class(*, tokenizer, template, task, **params)` where `tokenizer` is a loaded `ctxkit.text.tokenizer.loader.Tokenizer`,
`template` the `ChatTemplate` the builder renders with, `task` the task's registry name (scripted agents
pick their per-task script by it; model agents may ignore it), and `params` the agent table of the
experiment config (e.g. `model`, `device`, `temperature`, `max_new_tokens`). Unknown params must raise
`ConfigError` naming them. A class may also define a classmethod `check_params(params: Mapping) -> None`
that raises `ConfigError` without loading anything; the runner calls it while validating a config, before
any episode runs (so a typo fails fast instead of after a model load), and `check_task(task: str) -> None`
likewise when the agent cannot play some tasks (the scripted agent has one script per task). The runner keeps one agent per (name, params, task) per worker process and
calls `close()` when the worker is done.

Timings an agent reports in `AgentTurn.timings` (seconds): `prefill_s` and `decode_s` where it can split
them (0.0 where it cannot), and optionally `generate_s` (the whole generation; the runner measures the
wall time of `act` and records it as `generate_s` when the agent does not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

from ctxkit.errors import ConfigError
from ctxkit.registry import load_registered
from ctxkit.events import Step, ToolCall
from ctxkit.kept_set import KeptSet

if TYPE_CHECKING:  # pragma: no cover
    from ctxkit.context.builder import BuiltContext

__all__ = ["AgentTurn", "Agent", "AGENTS", "make_agent", "agent_class", "to_step"]


@dataclass(frozen=True)
class AgentTurn:
    """One policy decision as the agent produced it (before it is recorded as a `Step`)."""

    token_ids: tuple[int, ...]
    """Sampled token ids, including the end-of-turn token when the policy emitted it."""
    content: str | None
    """Text content of the assistant message the ids decode to (None when it is only tool calls)."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls parsed from the sampled ids."""
    finish_reason: str = "stop"
    """`stop`, `tool_calls`, `length` (hit max new tokens) or `abort`."""
    logprobs: tuple[float, ...] | None = None
    """Log-prob of each sampled token, aligned with `token_ids`; None when the agent has none (scripted)."""
    logprob_kind: str | None = None
    """Which distribution `logprobs` come from: `raw`, `processed` or `recomputed` (see `events.LogprobKind`)."""
    raw_logprobs: tuple[float, ...] | None = None
    """Raw (temperature 1, unfiltered) log-probs when `logprobs` are processed ones."""
    sampling: Mapping[str, Any] = field(default_factory=dict)
    """Sampling config actually used (temperature, top_p, top_k, max_new_tokens, seed, ...)."""
    policy_version: str | int | None = None
    """Version of the weights that produced the turn (model id + revision, checkpoint step, ...)."""
    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds: `prefill_s`, `decode_s`, optionally `generate_s` and engine-specific keys."""
    reasoning_content: str | None = None
    """Reasoning text parsed from the ids, for templates that render it."""
    kept_set: KeptSet | None = None
    """The sampler's kept support per sampled token (`ctxkit.kept_set.KeptSet`), when the agent knows it."""


@runtime_checkable
class Agent(Protocol):
    """A policy the harness can drive: one `act` per step, from the rendered context only."""

    name: str
    """Human-readable identity, recorded in results rows (e.g. `scripted`, `transformers:SmolLM2-135M`)."""

    def act(self, context: "BuiltContext", *, tools: Sequence[Mapping[str, Any]], seed: int) -> AgentTurn:
        """Produce the next assistant turn for `context` (use `context.token_ids`, nothing else of the episode).

        `tools` are the OpenAI-shaped tool schemas offered in the episode; `seed` is this step's sampling seed
        (derived by the runner from the episode seed and the step index, so reruns sample the same).
        """
        ...

    def close(self) -> None:
        """Release models, sessions or servers the agent holds."""
        ...


AGENTS: dict[str, str] = {
    "scripted": "ctxkit.experiment.agents.scripted:ScriptedAgent",
    "transformers": "ctxkit.experiment.agents.hf:TransformersAgent",
    "openai": "ctxkit.experiment.agents.openai_http:OpenAIAgent",
}
"""Registry: agent name -> `"module:Class"` (imported only when the agent is made)."""


def agent_class(name: str) -> type:
    """The class registered under `name`; `ConfigError` naming the registered agents when unknown."""
    return load_registered(AGENTS, name, "agent")


def make_agent(name: str, **params: Any) -> Agent:
    """Build the agent registered under `name` with `params` (`tokenizer`, `template`, `task` plus its own)."""
    return agent_class(name)(**params)


def to_step(turn: AgentTurn, context: "BuiltContext", *, timings: Mapping[str, float] | None = None) -> Step:
    """The `Step` event recording `turn` as sampled from `context` (`timings` override/extend the agent's)."""
    merged = dict(turn.timings)
    if timings:
        merged.update(timings)
    return Step(
        context_hash=context.hash,
        context_length=len(context.token_ids),
        token_ids=tuple(int(t) for t in turn.token_ids),
        logprobs=None if turn.logprobs is None else tuple(float(x) for x in turn.logprobs),
        logprob_kind=turn.logprob_kind,  # type: ignore[arg-type]
        raw_logprobs=None if turn.raw_logprobs is None else tuple(float(x) for x in turn.raw_logprobs),
        sampling=dict(turn.sampling),
        policy_version=turn.policy_version,
        finish_reason=turn.finish_reason,
        content=turn.content,
        tool_calls=tuple(turn.tool_calls),
        reasoning_content=turn.reasoning_content,
        timings={k: float(v) for k, v in merged.items()},
        kept_set=turn.kept_set,
    )
