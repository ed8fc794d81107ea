"""Real multi-turn episodes for the training tests (helper module, no tests).

`tool_episode(path, agent, builder, ...)` writes one episode log with the SmolLM2 policy: a tool-call turn
(the ids the chat template gives for an `append_line` call, scored by the model itself so its behaviour
log-probs are the model's own, temperature 1), a real tool result, then an answer the model samples
(`TransformersAgent.generate`, temperature 1, seeded), and an end with the given reward. The 135M model
does not reliably write tool calls by itself in a few tokens, so the first turn is teacher-forced; its
log-probs are exact, which is all a ratio needs.
"""

from __future__ import annotations

import json
from pathlib import Path

from rollout_driver import SYSTEM, TASK, TOOLS

from ctxkit.events import EpisodeEnd, EpisodeStart, Message, Step, ToolCall, ToolResult


def forced_logprobs(model, context_ids, ids) -> tuple[float, ...]:
    """The model's temperature-1 log-probs of `ids` following `context_ids` (one forward pass)."""
    import torch

    from ctxkit.training.reference_step import token_logprobs

    seq = list(context_ids) + list(ids)
    with torch.no_grad():
        lp = token_logprobs(model, [seq], [[1] * len(seq)])[0, len(context_ids):]
    return tuple(round(float(x), 6) for x in lp)


def tool_episode(path: Path, agent, builder, *, seed: int = 0, reward: float = 1.0, note: str = "alpha resolved",
                 episode_id: str = "train-0") -> Path:
    """Write the episode (see the module docstring) to `path`; returns it."""
    from ctxkit.log.event_log import EventLog
    from ctxkit.text.rendering.renderer import encode_assistant_turn

    log = EventLog.create(path, episode_id=episode_id)
    try:
        log.extend([
            EpisodeStart(episode_id=episode_id, tools=TOOLS, task={"name": "notes", "seed": seed},
                         context=builder.describe(), sampler={"temperature": 1.0, "seed": seed}),
            Message(role="system", content=SYSTEM),
            Message(role="user", content=TASK),
        ])
        ctx = builder.build(log)
        args = json.dumps({"file": "notes.txt", "text": note})
        msg = {"role": "assistant", "content": "Recording it.",
               "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "append_line", "arguments": args}}]}
        ids = encode_assistant_turn(msg, builder.tokenizer, builder.template, list(TOOLS))
        log.append(Step(
            context_hash=ctx.hash, context_length=ctx.n_tokens, token_ids=tuple(ids),
            logprobs=forced_logprobs(agent.lm.model, ctx.token_ids, ids), logprob_kind="processed",
            sampling={"temperature": 1.0, "seed": seed}, policy_version=agent.policy_version,
            finish_reason="tool_calls", content=msg["content"],
            tool_calls=(ToolCall(id="call_0", name="append_line", arguments=args),),
        ))
        log.append(ToolResult(tool_call_id="call_0", name="append_line", status="ok",
                              content=f"appended to notes.txt; it now reads:\n{note}\n"))
        ctx = builder.build(log)
        turn = agent.generate(ctx.token_ids, seed=seed)
        log.append(Step(
            context_hash=ctx.hash, context_length=ctx.n_tokens, token_ids=turn.token_ids, logprobs=turn.logprobs,
            logprob_kind=turn.logprob_kind, raw_logprobs=turn.raw_logprobs, sampling=dict(turn.sampling),
            policy_version=turn.policy_version, finish_reason="stop" if turn.finish_reason == "tool_calls" else turn.finish_reason,
            content=turn.content,
        ))
        log.append(EpisodeEnd(outcome="terminated", cause="answered", reward=reward, reward_kind="scored"))
    finally:
        log.close()
    return path
