"""`scripted`: a deterministic agent that reads only its rendered context and follows a per-task script.

It decodes `context.token_ids` with the tokenizer (nothing else of the episode is visible to it), asks the
task's policy in `scripts.POLICIES` for the next action, and emits the token-exact assistant turn the
template renders for that message (`render.encode_assistant_turn`), so its steps replay and train like a
model's. Tool-call ids are 9 hex characters derived from the context hash (valid for Mistral templates).

The script is a deterministic policy: every token it emits has probability 1, so its recorded behaviour
log-probs are 0.0 per token, labelled `processed` (the distribution after the greedy transform, temperature
0), and its sampling config says so (`temperature: 0.0`, the step's seed). Its timings map reading the
context (decode + parse) to `prefill_s` and encoding the turn to `decode_s`.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Mapping, Sequence

from ctxkit.errors import ConfigError
from ctxkit.events import ToolCall
from ctxkit.experiment.agents.base import AgentTurn
from ctxkit.experiment.agents.scripts import POLICIES, Decision
from ctxkit.text.rendering.renderer import encode_assistant_turn

__all__ = ["ScriptedAgent"]


class ScriptedAgent:
    """Scripted policy for one task (see `scripts.POLICIES`); takes no parameters of its own."""

    VERSION = "scripted-v2"
    """Recorded as each step's `policy_version`. v2 gives tool-call arguments as objects; v1 gave JSON text, which
    templates that serialize arguments (Qwen2.5's `tojson`) encoded a second time."""

    def __init__(self, *, tokenizer: Any, template: Any = None, task: str, **params: Any):
        self.check_params(params)
        self.check_task(task)
        self.tokenizer = tokenizer
        self.template = template
        self.task = task
        self.policy = POLICIES[task]
        self.name = f"scripted:{task}"

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        """The scripted agent accepts no parameters."""
        if params:
            raise ConfigError(f"agent 'scripted' takes no parameters, got {sorted(params)}")

    @classmethod
    def check_task(cls, task: str) -> None:
        """`ConfigError` when there is no script for `task`."""
        if task not in POLICIES:
            raise ConfigError(f"agent 'scripted' has no script for task {task!r}; scripted tasks: {sorted(POLICIES)}")

    def decide(self, context: Any) -> Decision:
        """The policy's decision for a built context (decodes its token ids)."""
        return self.policy(self.tokenizer.decode(list(context.token_ids)))

    def act(self, context: Any, *, tools: Sequence[Mapping[str, Any]], seed: int) -> AgentTurn:
        """The next assistant turn for `context` (deterministic: `seed` is only recorded)."""
        start = time.perf_counter()
        decision = self.decide(context)
        decided = time.perf_counter()
        if decision.answer is not None:
            message: dict[str, Any] = {"role": "assistant", "content": decision.answer}
            calls: tuple[ToolCall, ...] = ()
        else:
            call_id = hashlib.sha256(f"{context.hash}:0".encode()).hexdigest()[:9]
            calls = (ToolCall(id=call_id, name=str(decision.tool), arguments=dict(decision.arguments)),)  # an object, as HF chats give it: templates serialize it once
            message = {"role": "assistant", "content": decision.note, "tool_calls": [c.to_openai() for c in calls]}
        ids = encode_assistant_turn(message, self.tokenizer, self.template, tools=list(tools) or None)
        done = time.perf_counter()
        return AgentTurn(
            token_ids=tuple(int(i) for i in ids),
            content=message["content"],
            tool_calls=calls,
            finish_reason="tool_calls" if calls else "stop",
            logprobs=(0.0,) * len(ids),
            logprob_kind="processed",
            sampling={"temperature": 0.0, "seed": int(seed), "policy": self.VERSION, "task": self.task},
            policy_version=self.VERSION,
            timings={"prefill_s": decided - start, "decode_s": done - decided},
        )

    def close(self) -> None:
        """Nothing to release."""
