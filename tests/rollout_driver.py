"""A deterministic rollout driver for the replay, samples, resume and audit tests (helper module, no tests).

The "policy" is scripted and seeded: at turn t it calls the `append_line` tool (a real file in a real temp
directory) until the last turn, where it answers. Its sampled ids are exactly what the template renders
for that assistant message (`render.encode_assistant_turn`), its log-probs come from a seeded RNG, and
every step records the built context's hash and length. Tool outputs include the whole file, so they
grow and make compressors act.

`Driver.advance(log, builder)` does one unit of work decided from the log alone (start, one step, one
tool result, or the end), so a run can stop anywhere and continue from a resumed state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctxkit.events import EpisodeEnd, EpisodeStart, Message, Step, ToolCall, ToolResult

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "append_line",
            "description": "Append one line of text to a file in the work directory and show the file.",
            "parameters": {
                "type": "object",
                "properties": {"file": {"type": "string"}, "text": {"type": "string"}},
                "required": ["file", "text"],
            },
        },
    },
)
SYSTEM = "You are a careful assistant that keeps a work log with the append_line tool."
TASK = "Record each finding as a line in notes.txt. Do not delete notes.txt. Finish with a one-line summary."
FACTS = ("alpha resolved", "beta pending review", "gamma measured at 41 ms", "delta needs a retry",
         "epsilon cache warmed", "zeta config pinned", "eta tests green", "theta rollout scheduled",
         "iota index rebuilt", "kappa alert silenced")


def pending_calls(events) -> list[ToolCall]:
    """Tool calls of the last step that have no result yet."""
    answered = {e.tool_call_id for e in events if isinstance(e, ToolResult)}
    steps = [e for e in events if isinstance(e, Step)]
    if not steps:
        return []
    return [tc for tc in steps[-1].tool_calls if tc.id not in answered]


@dataclass
class Driver:
    """One scripted episode (see the module docstring)."""

    n_turns: int = 6
    seed: int = 0
    workdir: Path | None = None
    episode_id: str = "ep-test"

    # ------------------------------------------------------------------ pieces

    def start(self, log, builder) -> None:
        log.extend([
            EpisodeStart(episode_id=self.episode_id, tools=TOOLS, task={"name": "notes", "seed": self.seed,
                                                                         "stateful": self.workdir is not None},
                         context=builder.describe(), sampler={"seed": self.seed, "temperature": 0.7, "top_p": 0.95}),
            Message(role="system", content=SYSTEM),
            Message(role="user", content=TASK),
        ])
        if self.workdir is not None:
            self.snapshot(log)

    def message(self, t: int) -> dict[str, Any]:
        fact = FACTS[t % len(FACTS)]
        if t < self.n_turns - 1:
            args = json.dumps({"file": "notes.txt", "text": f"{t}: {fact}"})
            return {"role": "assistant", "content": f"Turn {t}: recording '{fact}'.",
                    "tool_calls": [{"id": f"call_{t:04d}", "type": "function",
                                    "function": {"name": "append_line", "arguments": args}}]}
        return {"role": "assistant", "content": f"Done: {t} findings recorded in notes.txt."}

    def take_step(self, log, builder, t: int) -> str:
        from ctxkit.text.rendering.renderer import encode_assistant_turn

        ctx = builder.build(log)
        msg = self.message(t)
        ids = encode_assistant_turn(msg, builder.tokenizer, builder.template, list(TOOLS))
        rng = np.random.default_rng([self.seed, t])
        lps = tuple(float(-x) for x in np.round(rng.exponential(0.5, len(ids)), 6))
        calls = tuple(ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                      for c in msg.get("tool_calls", ()))
        log.append(Step(
            context_hash=ctx.hash, context_length=ctx.n_tokens, token_ids=tuple(ids), logprobs=lps,
            logprob_kind="processed", sampling={"temperature": 0.7, "top_p": 0.95, "seed": self.seed},
            policy_version=t // 2, finish_reason="tool_calls" if calls else "stop", content=msg["content"],
            tool_calls=calls, timings={"generate_s": 0.01 * len(ids)},
        ))
        return ctx.hash

    def run_tool(self, log, call: ToolCall) -> None:
        args = json.loads(call.arguments)
        if self.workdir is not None:
            path = self.workdir / args["file"]
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(args["text"] + "\n")
            text = path.read_text(encoding="utf-8")
        else:
            text = args["text"] + "\n"
        log.append(ToolResult(tool_call_id=call.id, name=call.name, status="ok",
                              content=f"appended to {args['file']}; it now reads:\n{text}"))
        if self.workdir is not None:
            self.snapshot(log)

    def snapshot(self, log) -> None:
        from ctxkit.log.state import DirectoryState, record_snapshot

        record_snapshot(log, DirectoryState(self.workdir), name="workdir")

    def finish(self, log) -> None:
        log.append(EpisodeEnd(outcome="terminated", cause="answered", reward=1.0, reward_kind="scored"))

    # ------------------------------------------------------------------ control

    def advance(self, log, builder) -> bool:
        """One unit of work decided from the log; False when the episode is over."""
        events = log.events()
        if not events:
            self.start(log, builder)
            return True
        if any(isinstance(e, EpisodeEnd) for e in events):
            return False
        pending = pending_calls(events)
        if pending:
            self.run_tool(log, pending[0])
            return True
        n_steps = sum(isinstance(e, Step) for e in events)
        if n_steps < self.n_turns:
            self.take_step(log, builder, n_steps)
            return True
        self.finish(log)
        return True

    def run(self, log, builder, max_units: int | None = None) -> int:
        """Advance until the end (or `max_units` units); returns the units done."""
        n = 0
        while (max_units is None or n < max_units) and self.advance(log, builder):
            n += 1
        return n


def step_hashes(events) -> list[str]:
    """Recorded context hashes, in order."""
    return [e.context_hash for e in events if isinstance(e, Step)]
