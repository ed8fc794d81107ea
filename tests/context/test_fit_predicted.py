"""`fit_window`'s predicted drop count (`CompressionRequest.turn_starts`) agrees with its measuring search.

On generated episodes (hypothesis: turns with one or two tool calls, extra user messages, a constraint
in a droppable message so that dropping it brings in the pinned block), for local templates (Qwen2.5,
SmolLM2) every predicted size equals the measured size of that candidate when its cut is a plain one,
and the chosen edits and size equal those of the search without prediction at every target; a template
that is not local (Qwen3) gives no turn starts, so the search decides.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import tokenizer_dir
from ctxkit.context.builder import ContextBuilder
from ctxkit.context.compress.base import CompressionRequest
from ctxkit.context.compress.turns import base_messages, fit_window, predicted_sizes, prefix_groups, turn_groups
from ctxkit.context.compressor_check import episode_text
from ctxkit.edits import DropEdit
from ctxkit.errors import BudgetError
from ctxkit.events import EpisodeStart, Message, Step, ToolCall, ToolResult
from ctxkit.log.event_log import MemoryLog
from ctxkit.text.rendering.renderer import encode_assistant_turn
from ctxkit.text.tokenizer.loader import load_tokenizer
from ctxkit.context.view import apply_edits

TOOLS = [{"type": "function", "function": {"name": "run", "description": "Run a shell command.",
                                           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                                          "required": ["cmd"]}}}]
_TOKS: dict = {}


def tok(name: str):
    if name not in _TOKS:
        _TOKS[name] = load_tokenizer(str(tokenizer_dir(name)))
    return _TOKS[name]


def view_of(t, seed: int, turns: int):
    """A keep-all builder over a generated episode, and the view of its last build."""
    rng = random.Random(seed)
    events = [EpisodeStart(episode_id="fit", tools=tuple(TOOLS)), Message(role="system", content="You are an agent."),
              Message(role="user", content="Fix the failing test.")]
    for k in range(turns):
        calls = tuple(ToolCall(id=f"c{k}x{j}", name="run", arguments=json.dumps({"cmd": f"ls {k} {j}"}))
                      for j in range(rng.randint(1, 2)))
        msg = {"role": "assistant", "content": f"Step {k}.", "tool_calls": [c.to_openai() for c in calls]}
        events.append(Step(token_ids=encode_assistant_turn(msg, t, None, TOOLS), content=msg["content"], tool_calls=calls))
        events += [ToolResult(tool_call_id=c.id, content=episode_text(rng.randint(10, 80), rng.randint(0, 9999)))
                   for c in calls]
        if rng.random() < 0.25:
            text = "Never edit setup.py." if k == 1 else "Keep going."
            events.append(Message(role="user", content=text))
    builder = ContextBuilder(t, None, "keep-all", 1_000_000)
    log = MemoryLog()
    log.extend(events)
    return builder, builder.build(log).view, log


def pinned_block(view):
    return next((m.content for m in view.messages if m.provenance.how == "pinned"), None)


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "smollm2-135m-instruct"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), turns=st.integers(2, 9), keep_first=st.integers(0, 4),
       keep_last=st.integers(1, 3), fraction=st.floats(0.2, 0.99))
def test_predicted_fit_equals_the_search(name, seed, turns, keep_first, keep_last, fraction):
    t = tok(name)
    builder, view, log = view_of(t, seed, turns)
    n = builder.measure(view)
    request = CompressionRequest(view=view, events=log.events(), tokenizer=t, template=builder.template, budget=n,
                                 measure=builder.measure, pinned_texts=tuple(p.text for p in view.active_pins),
                                 turn_starts=builder.turn_starts)
    assert builder.turn_starts(view) is not None
    if keep_first == 0:  # the first message is a template's special case: the search decides
        request0 = dataclasses.replace(request)
        assert predicted_sizes(request0, view, n, base_messages(view), turn_groups(base_messages(view)), 0, 1) is None
    # every prediction of a plain cut (no pin text dropped, so no pinned block appears) is the measured size
    msgs = base_messages(view)
    groups = turn_groups(msgs)
    first = prefix_groups(groups, keep_first)
    droppable = max(0, len(groups) - first - keep_last)
    sizes = predicted_sizes(request, view, n, msgs, groups, first, droppable)
    if droppable and first:
        assert sizes is not None
        for d in range(1, droppable + 1):
            ids = tuple(i for s, e in groups[first:first + d] for k in range(s, e) for i in msgs[k].provenance.event_ids)
            cand = apply_edits(view, [DropEdit(ids)])
            if pinned_block(cand) == pinned_block(view):
                assert builder.measure(cand) == sizes[d]
    target = max(1, int(fraction * n))
    search = dataclasses.replace(request, turn_starts=None)
    for budget in (n, target + 1):
        got, want = [], []
        for req, out in ((dataclasses.replace(request, budget=budget), got), (dataclasses.replace(search, budget=budget), want)):
            try:
                edits, v, size = fit_window(req, view, n, keep_first=keep_first, keep_last=keep_last, target=target)
                out.append((edits, v.hash, size))
            except BudgetError as exc:
                out.append(str(exc))
        assert got == want


def test_a_template_that_is_not_local_gives_no_turn_starts():
    t = tok("qwen3")
    builder, view, _ = view_of(t, 7, 4)
    assert builder.turn_starts(view) is None
