"""L0 events: dict round trips for every kind, OpenAI message conversion, typed errors."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkit.errors import LogFormatError, MessageFormatError
from ctxkit.events import (
    EVENT_TYPES,
    FINISH_REASONS,
    REWARD_KINDS,
    Compaction,
    EpisodeEnd,
    EpisodeStart,
    Message,
    Pin,
    StateSnapshot,
    Step,
    ToolCall,
    ToolResult,
    Unpin,
    content_text,
    event_from_dict,
    event_to_dict,
    message_from_openai,
    message_to_openai,
)

text = st.text(max_size=30)
json_scalar = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False) | text
json_value = st.recursive(json_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                          max_leaves=8)
json_obj = st.dictionaries(text, json_value, max_size=3)
content = st.none() | text | st.lists(st.builds(lambda t: {"type": "text", "text": t}, text), min_size=1, max_size=3).map(tuple)
tool_call = st.builds(ToolCall, id=st.text(min_size=1, max_size=8), name=st.text(min_size=1, max_size=8), arguments=text)
# valid compaction edits in their JSON shape (`ctxkit.edits` reads them into typed records)
edit_json = (st.builds(lambda ids: {"op": "drop", "event_ids": ids}, st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3))
             | st.builds(lambda i, t: {"op": "mask", "event_id": i, "text": t}, st.text(min_size=1, max_size=8), text))
base = {"seq": st.none() | st.integers(0, 10**6), "id": st.none() | text,
        "ts": st.none() | st.floats(0, 2e9, allow_nan=False)}

EVENTS = st.one_of(
    st.builds(EpisodeStart, episode_id=text, tools=st.lists(json_obj, max_size=2).map(tuple), task=json_obj,
              context=json_obj, sampler=json_obj, metadata=json_obj, **base),
    st.builds(Message, role=st.sampled_from(["system", "user", "assistant", "tool"]), content=content,
              tool_calls=st.lists(tool_call, max_size=2).map(tuple), tool_call_id=st.none() | text,
              name=st.none() | text, reasoning_content=st.none() | text, extra=json_obj, **base),
    st.lists(st.integers(0, 200_000), max_size=20).flatmap(lambda ids: st.builds(
              Step, context_hash=text, context_length=st.integers(0, 10**6), token_ids=st.just(tuple(ids)),
              logprobs=st.none() | st.lists(st.floats(max_value=0, allow_nan=False, allow_infinity=False),
                                            min_size=len(ids), max_size=len(ids)).map(tuple),
              logprob_kind=st.sampled_from([None, "raw", "processed", "recomputed"]), sampling=json_obj,
              policy_version=st.none() | st.integers(0, 100) | text,
              finish_reason=st.sampled_from((None, *FINISH_REASONS)), content=content,
              tool_calls=st.lists(tool_call, max_size=2).map(tuple), **base)),
    st.builds(ToolResult, tool_call_id=text, name=st.none() | text, content=content,
              status=st.sampled_from(["ok", "error", "timeout"]), duration_s=st.none() | st.floats(0, 1e4), **base),
    st.builds(Pin, pin_id=text, text=text, source_event_id=st.none() | text, rule=st.none() | text, **base),
    st.builds(Unpin, pin_id=text, reason=st.none() | text, **base),
    st.builds(Compaction, compressor=text, params=json_obj, edits=st.lists(edit_json, max_size=3).map(tuple),
              details=json_obj, **base),
    st.builds(StateSnapshot, adapter=st.sampled_from(["directory", "json"]), name=text, manifest_sha256=text,
              after_event_id=st.none() | text, **base),
    st.builds(EpisodeEnd, outcome=st.sampled_from(["terminated", "truncated"]), cause=text,
              reward=st.none() | st.floats(-10, 10), reward_kind=st.sampled_from(REWARD_KINDS),
              scores=json_obj, **base),
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_event_dict_round_trip(event):
    data = event_to_dict(event)
    assert data["kind"] == event.kind
    assert event_from_dict(data) == event


def test_registry_names_every_kind():
    assert set(EVENT_TYPES) == {"episode_start", "message", "step", "tool_result", "pin", "unpin", "compaction",
                                "state_snapshot", "episode_end"}
    for kind, cls in EVENT_TYPES.items():
        assert cls().kind == kind


def test_events_are_frozen():
    msg = Message(role="user", content="hi")
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.content = "changed"  # type: ignore[misc]


def test_event_from_dict_unknown_kind_and_field():
    with pytest.raises(LogFormatError, match=r"line 7: unknown event kind 'bogus'"):
        event_from_dict({"kind": "bogus"}, where="line 7")
    with pytest.raises(LogFormatError, match=r"unknown field\(s\) \['colour'\] for event kind 'pin'"):
        event_from_dict({"kind": "pin", "colour": "red"})


def test_message_from_openai_full_shape_and_back():
    msg = {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
           "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"d": "/"}'}}],
           "reasoning_content": "think", "x_custom": [1, 2]}
    event = message_from_openai(msg)
    assert event.tool_calls == (ToolCall(id="c1", name="ls", arguments='{"d": "/"}'),)
    assert event.extra == {"x_custom": [1, 2]}
    assert content_text(event.content) == "ab"
    assert message_to_openai(event) == msg


def test_tool_call_arguments_object_is_kept_as_given():
    # Templates render an object with tojson and text verbatim: re-serializing would change the ids.
    event = message_from_openai({"role": "assistant", "content": None,
                                 "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"x": "é", "a": 1}}}]})
    assert event.tool_calls[0].arguments == {"x": "é", "a": 1}
    assert list(event.tool_calls[0].arguments) == ["x", "a"]
    assert event.tool_calls[0].arguments_text() == '{"x": "é", "a": 1}'


def test_step_and_tool_result_export_shapes():
    step = Step(content="done", tool_calls=(ToolCall("c9", "f", "{}"),), reasoning_content="r")
    assert message_to_openai(step) == {"role": "assistant", "content": "done", "reasoning_content": "r",
                                       "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert message_to_openai(ToolResult(tool_call_id="c9", name="f", content="out")) == {
        "role": "tool", "tool_call_id": "c9", "content": "out", "name": "f"}


@pytest.mark.parametrize(
    "msg, pattern",
    [
        ({"role": "bot", "content": "x"}, r"m: unknown role 'bot'"),
        ("hello", r"m: expected an object, got str"),
        ({"role": "user", "content": 3}, r"m: content of type int is not supported"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {}}]}, r"m: content part 0 .* only text parts"),
        ({"role": "tool", "content": "x"}, r"m: a tool message needs a string tool_call_id"),
        ({"role": "user", "content": "x", "tool_calls": [{"id": "c", "function": {"name": "f"}}]},
         r"m: only assistant messages may have tool_calls"),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}, r"m.tool_calls\[0\]: tool call 'f' has no id"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}, r"m.tool_calls\[0\]: tool call has no function name"),
        ({"role": "assistant", "tool_calls": ["c"]}, r"m.tool_calls\[0\]: tool call 'c' is not an object"),
    ],
)
def test_message_from_openai_typed_errors(msg, pattern):
    with pytest.raises(MessageFormatError, match=pattern):
        message_from_openai(msg, where="m")


def test_content_text():
    assert content_text(None) == ""
    assert content_text("x") == "x"
    assert content_text(({"type": "text", "text": "a"}, {"type": "text", "text": "é"})) == "aé"


def test_event_ids_ignore_measured_times():
    # Re-running an episode must give the same ids (placeholders name them), whatever the clock said.
    from ctxkit.events import event_id

    a = ToolResult(tool_call_id="c1", content="out", duration_s=0.013)
    b = ToolResult(tool_call_id="c1", content="out", duration_s=0.250)
    assert event_id(a, 4) == event_id(b, 4)
    assert event_id(a, 4) != event_id(ToolResult(tool_call_id="c1", content="other", duration_s=0.013), 4)
    s1 = Step(token_ids=(1, 2), timings={"decode": 0.1})
    s2 = Step(token_ids=(1, 2), timings={"decode": 0.9})
    assert event_id(s1, 7) == event_id(s2, 7) != event_id(s1, 8)


@pytest.mark.parametrize("fields, field, n", [
    ({"token_ids": (1, 2, 3), "logprobs": (-0.5, -0.25)}, "logprobs", 2),
    ({"token_ids": (), "logprobs": (-0.5,)}, "logprobs", 1),
    ({"token_ids": (1, 2), "logprobs": (-0.5, -0.25), "raw_logprobs": (-0.5,)}, "raw_logprobs", 1),
])
def test_step_logprobs_must_line_up_with_its_tokens(fields, field, n):
    import pickle

    from ctxkit.errors import EventFormatError
    from ctxkit.errors import AlignmentError

    n_tokens = len(fields["token_ids"])
    message = f"step event: {field} has {n} entries for {n_tokens} token_ids; they must be aligned"
    with pytest.raises(EventFormatError, match=message) as info:
        Step(**fields)
    exc = info.value
    assert isinstance(exc, AlignmentError) and (exc.kind, exc.field, exc.value, exc.allowed) == ("step", field, n, (n_tokens,))
    again = pickle.loads(pickle.dumps(exc))
    assert str(again) == str(exc) and type(again) is AlignmentError
    # a line read from a log holding such a step is a LogFormatError naming the field and both lengths
    data = event_to_dict(Step(token_ids=fields["token_ids"]))
    data.update({k: list(v) for k, v in fields.items()})
    with pytest.raises(LogFormatError, match=f"event: {message}"):
        event_from_dict(data)
    # aligned, or without log-probs, is fine
    assert Step(token_ids=(1, 2), logprobs=(-0.5, -0.25), raw_logprobs=(-0.5, -0.2)).logprobs == (-0.5, -0.25)
    assert Step(token_ids=(1, 2)).logprobs is None
