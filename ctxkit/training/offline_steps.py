"""Offline steps: turn the assistant turns of a saved trajectory into `Step` events.

An imported episode (`conversation.import_conversation`, or a trajectory importer) holds only `Message`
events, so nothing in it says what a policy sampled: replay, samples and audit have no steps to work on.
`add_offline_steps(events, tokenizer, template)` replaces each assistant `Message` with an offline `Step`:

| Step field | value |
|---|---|
| `token_ids` | `rendering.encode_assistant_turn` of the message under the tokenizer/template, with the episode's tools: the loss-masked ids of that turn, end-of-turn token included |
| `content`, `tool_calls`, `reasoning_content` | the message's |
| `logprobs`, `logprob_kind` | None and `"none"`: no behaviour log-probs exist (supervised training only, not importance-weighted RL) |
| `finish_reason` | the source's (`Message.extra["finish_reason"]`) when it is in `events.FINISH_REASONS`, else `tool_calls` for a turn with tool calls, `stop` otherwise |
| `context_hash`, `context_length` | the context the policy would have seen: the keep-all build of every event before the step, with the generation prompt |
| `sampling`, `policy_version` | empty / None (unknown for someone else's agent) |

The `EpisodeStart.context` records the keep-all builder's `describe()` (budget `OFFLINE_BUDGET`, pin
detection off, so no `Pin` events are added), which is what `replay --verify` and `samples` rebuild
with. Message keys other than the ones a step holds (`name`, `extra`) are not kept on the step.

Each step's context is built from the events *before* it, so a trailing unanswered call (a `submit` the
environment never answered) never has to be built: every step of such an episode gets its context.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ctxkit.errors import ConfigError
from ctxkit.events import FINISH_REASONS, EpisodeStart, Event, Message, Step
from ctxkit.context.builder import ContextBuilder
from ctxkit.context.view import message_of
from ctxkit.log.event_log import MemoryLog
from ctxkit.text.rendering.renderer import encode_assistant_turn

__all__ = ["OFFLINE_BUDGET", "OFFLINE_LOGPROB_KIND", "add_offline_steps", "is_offline_step"]

OFFLINE_BUDGET = 1 << 30
"""The keep-all budget recorded for offline steps: large enough that no saved trajectory reaches it."""

OFFLINE_LOGPROB_KIND = "none"
"""The `Step.logprob_kind` of an offline step (see `events.LogprobKind`)."""


def is_offline_step(step: Step) -> bool:
    """True for a step made from a saved trajectory (`logprob_kind == "none"`)."""
    return step.logprob_kind == OFFLINE_LOGPROB_KIND


def _finish_reason(message: Message) -> str:
    source = message.extra.get("finish_reason")
    if isinstance(source, str) and source in FINISH_REASONS:
        return source
    return "tool_calls" if message.tool_calls else "stop"


def add_offline_steps(events: Sequence[Event], tokenizer: Any, template: Any = None) -> list[Event]:
    """The episode `events` with every assistant `Message` replaced by an offline `Step` (see the module
    docstring). `tokenizer`/`template` are specs or loaded objects (`template=None`: the tokenizer's own).

    Returns unrecorded events (`seq`/`id` cleared) ready to append to a new log. An episode that already
    holds steps is refused (`ConfigError` naming the first step's seq): its steps record what was sampled.
    """
    events = list(events)
    live = next((e for e in events if isinstance(e, Step)), None)
    if live is not None:
        raise ConfigError(f"add_offline_steps: the episode already holds steps (first at seq {live.seq}, "
                          f"event {live.id}); offline steps are made only from message-only episodes")
    builder = ContextBuilder(tokenizer, template, compressor="keep-all", budget=OFFLINE_BUDGET, detect_pins=False)
    desc = builder.describe()
    starts = [i for i, e in enumerate(events) if isinstance(e, EpisodeStart)]
    if len(starts) > 1:
        raise ConfigError(f"add_offline_steps: {len(starts)} EpisodeStart events (at positions {starts}); expected one")
    if starts and starts[0] != 0:
        raise ConfigError(f"add_offline_steps: the EpisodeStart is at position {starts[0]}; it must come first")
    if starts:
        start = events[0]
        assert isinstance(start, EpisodeStart)
        events[0] = dataclasses.replace(start, context=desc)
    else:
        events.insert(0, EpisodeStart(context=desc))
    tools = [dict(t) for t in events[0].tools] or None
    mem = MemoryLog()
    out: list[Event] = []
    for event in events:
        event = dataclasses.replace(event, seq=None, id=None)
        if isinstance(event, Message) and event.role == "assistant":
            ctx = builder.build(mem)
            chat = message_of(event).to_chat()  # what the view renders for it: content flattened as a build does
            chat.pop("name", None)
            ids = encode_assistant_turn(chat, builder.tokenizer, builder.template, tools)
            event = Step(
                context_hash=ctx.hash, context_length=ctx.n_tokens, token_ids=tuple(ids), logprobs=None,
                logprob_kind=OFFLINE_LOGPROB_KIND, finish_reason=_finish_reason(event),  # type: ignore[arg-type]
                content=event.content, tool_calls=event.tool_calls, reasoning_content=event.reasoning_content,
                ts=event.ts,
            )
        mem.append(event)
        out.append(event)
    return out
