"""Tool calls whose `arguments` is an object (HF style, as `message_from_openai` gives it) build with every
registered compressor, and rebuild to the same ids; any `ToolCall` the event accepts is hashable and builds.

Regression: the builder's render cache keys by view message, and a dict inside a `ToolCall` made every such
build raise a bare `TypeError: unhashable type: 'dict'` while `render()` of the same messages worked."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import READ_TOOLS, require_module
from ctxkit.context.builder import ContextBuilder, rebuild
from ctxkit.context.compress import COMPRESSORS
from ctxkit.events import EpisodeStart, Message, ToolCall, ToolResult, message_from_openai
from ctxkit.log.event_log import MemoryLog
from ctxkit.text.rendering.renderer import render
from ctxkit.context.summarizers import CallableSummarizer

TOOLS = READ_TOOLS
BUDGET = 700


def params_for(name: str) -> dict:
    if name.startswith("summarize"):
        first = lambda msgs: " ".join((m.get("content") or "")[:40] for m in msgs)  # noqa: E731
        return {"summarizer": CallableSummarizer(first, id="first-40")}
    if name == "retrieve":
        require_module("sentence_transformers")
        require_module("faiss")
    return {}


def dict_argument_log(turns: int = 8) -> MemoryLog:
    log = MemoryLog()
    log.extend([EpisodeStart(episode_id="dict-args", tools=TOOLS),
                Message(role="system", content="You read files."),
                Message(role="user", content="Read every file and report.")])
    for t in range(turns):
        call = ToolCall(f"c{t}", "read", {"path": f"f{t}.py", "lines": [1, t], "opts": {"raw": True}})
        log.append(Message(role="assistant", content=f"Reading {t}.", tool_calls=(call,)))
        log.append(ToolResult(tool_call_id=call.id, name="read", content=" ".join(f"row{t}_{i}" for i in range(60))))
    return log


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_every_compressor_builds_dict_arguments(tok, name):
    log = dict_argument_log()
    builder = ContextBuilder(tok, compressor=name, params=params_for(name), budget=BUDGET)
    try:
        ctx = builder.build(log)
    except Exception as exc:  # a typed ctxkit refusal of the budget is allowed; a crash is not
        from ctxkit.errors import BudgetError

        assert isinstance(exc, BudgetError), f"{name}: {type(exc).__name__}: {exc}"
        return
    again = rebuild(log.events(), tokenizer=tok)
    assert again.token_ids == ctx.token_ids and again.hash == ctx.hash
    assert '"path": "f' in tok.decode(ctx.token_ids)  # the object arguments are in the context, as JSON


def test_dict_arguments_render_as_the_unkeyed_render_does(tok):
    log = dict_argument_log(3)
    ctx = ContextBuilder(tok, compressor="keep-all", budget=8000).build(log)
    from ctxkit.context.view import build_view

    chat = [m.to_chat() for m in build_view(log.events()).messages]
    assert list(ctx.token_ids) == list(render(chat, tok, tools=list(TOOLS), add_generation_prompt=True).token_ids)


def test_equal_calls_hash_equal_whatever_the_key_order():
    a = ToolCall("c", "read", {"path": "a", "n": {"x": 1, "y": [1, 2]}})
    b = ToolCall("c", "read", {"n": {"y": [1, 2], "x": 1}, "path": "a"})
    assert a == b and hash(a) == hash(b)
    assert hash(ToolCall("c", "read", '{"path": "a"}')) != hash(ToolCall("c", "read", {"path": "a"}))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arguments=st.one_of(st.text(max_size=20), st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=4)))
def test_any_accepted_tool_call_builds(tok, arguments):
    call = ToolCall("c0", "read", arguments)
    hash(call)
    log = MemoryLog()
    log.extend([EpisodeStart(episode_id="p", tools=TOOLS), Message(role="user", content="go"),
                Message(role="assistant", content="", tool_calls=(call,)),
                ToolResult(tool_call_id="c0", name="read", content="ok")])
    ctx = ContextBuilder(tok, compressor="window", budget=4000).build(log)
    assert ctx.token_ids == rebuild(log.events(), tokenizer=tok).token_ids


def test_message_from_openai_object_arguments_build(tok):
    wire = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": {"path": "x.py"}}}]}
    msg = message_from_openai(wire)
    assert isinstance(msg.tool_calls[0].arguments, dict)
    log = MemoryLog()
    log.extend([EpisodeStart(episode_id="w", tools=TOOLS), Message(role="user", content="go"), msg,
                ToolResult(tool_call_id="c1", name="read", content="print(1)")])
    ctx = ContextBuilder(tok, compressor="mask-observations", budget=4000).build(log)
    assert ctx.hash == rebuild(log.events(), tokenizer=tok).hash


def test_a_pickled_call_carries_no_cached_hash():
    """String hashing is salted per process: a hash cached in one must not travel to another (Ray, workers)."""
    import pickle

    call = ToolCall("c", "read", {"path": "a"})
    hash(call)
    again = pickle.loads(pickle.dumps(call))
    assert "_hash" not in again.__dict__ and again == call and hash(again) == hash(call)
