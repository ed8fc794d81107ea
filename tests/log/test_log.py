"""The episode log: format, round trips, durability modes, tail sync, import/export."""

from __future__ import annotations

import json
import hashlib
import os
import re
import struct

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkit.errors import ConfigError, LogFormatError, MessageFormatError
from ctxkit.events import EpisodeEnd, EpisodeStart, Message, Pin, Step, ToolCall, ToolResult, Unpin
from ctxkit.log.event_log import (
    EventLog,
    export_conversation,
    export_messages,
    import_conversation,
    load_conversation,
    read_events,
    read_header,
    verify,
)


def _sample_events():
    return [
        EpisodeStart(episode_id="ep", tools=({"type": "function", "function": {"name": "ls"}},), task={"seed": 3}),
        Message(role="user", content="list /tmp — please ✓"),
        Step(context_hash="ab" * 32, context_length=12, token_ids=(1, 2, 3), logprobs=(-0.5, -1.25, -3e-9),
             logprob_kind="processed", sampling={"temperature": 0.7}, policy_version=4, finish_reason="tool_calls",
             tool_calls=(ToolCall("c1", "ls", '{"d": "/tmp"}'),)),
        ToolResult(tool_call_id="c1", name="ls", content="a\nb", status="ok", duration_s=0.25),
        EpisodeEnd(outcome="terminated", cause="answered", reward=1.0, reward_kind="scored"),
    ]


def test_create_append_open_round_trip(tmp_path):
    path = tmp_path / "ep.jsonl"
    with EventLog.create(path, episode_id="ep-1", metadata={"arm": "A"}) as log:
        first = log.append(_sample_events()[0])
        rest = log.extend(_sample_events()[1:])
        assert len(log) == 5 and list(log) == [first, *rest]
        recorded = log.events()
    assert [e.seq for e in recorded] == [0, 1, 2, 3, 4]
    assert all(re.fullmatch(rf"e{e.seq}-[0-9a-f]{{8}}", e.id) for e in recorded)
    assert len({e.id for e in recorded}) == 5
    assert all(isinstance(e.ts, float) for e in recorded)
    for built, got in zip(_sample_events(), recorded):
        assert got == built.__class__(**{**built.__dict__, "seq": got.seq, "id": got.id, "ts": got.ts})
    reopened = EventLog.open(path)
    assert reopened.events() == recorded
    assert read_events(path) == recorded
    assert reopened.header == {"ctxkit_log": 1, "episode_id": "ep-1", "created": reopened.header["created"],
                               "metadata": {"arm": "A"}}
    assert read_header(path) == reopened.header
    reopened.close()


def test_given_ts_is_kept(tmp_path):
    with EventLog.create(tmp_path / "l.jsonl") as log:
        assert log.append(Message(role="user", content="x", ts=12.5)).ts == 12.5


def test_file_format_is_a_hash_chain(tmp_path):
    path = tmp_path / "ep.jsonl"
    with EventLog.create(path) as log:
        log.extend(_sample_events())
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 7
    header = orjson.loads(lines[0])
    digest = header.pop("hash")
    assert digest == hashlib.sha256(orjson.dumps(header, option=orjson.OPT_SORT_KEYS)).hexdigest()
    prev = digest
    for seq, raw in enumerate(lines[1:-1]):
        obj = orjson.loads(raw)
        assert obj.pop("prev") == prev
        line_hash = obj.pop("hash")
        assert line_hash == hashlib.sha256(prev.encode() + orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()
        assert obj["seq"] == seq
        prev = line_hash


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=50))
def test_logprobs_round_trip_bit_exactly(tmp_path, values):
    path = tmp_path / f"f{os.getpid()}-{len(list(tmp_path.iterdir()))}.jsonl"
    with EventLog.create(path, durability="none") as log:
        log.append(Step(token_ids=tuple(range(len(values))), logprobs=tuple(values), raw_logprobs=tuple(values)))
    got = read_events(path)[0]
    assert struct.pack(f"<{len(values)}d", *got.logprobs) == struct.pack(f"<{len(values)}d", *values)
    assert struct.pack(f"<{len(values)}d", *got.raw_logprobs) == struct.pack(f"<{len(values)}d", *values)


def test_extreme_numbers_round_trip(tmp_path):
    path = tmp_path / "n.jsonl"
    values = (-0.0, 5e-324, -1.7976931348623157e308, 0.1 + 0.2, -1e-300)
    with EventLog.create(path) as log:
        log.append(Step(token_ids=(2**31 - 1, 0, 1, 2, 3), logprobs=values, policy_version=2**62))
    got = read_events(path)[0]
    assert [struct.pack("<d", v) for v in got.logprobs] == [struct.pack("<d", v) for v in values]
    assert got.policy_version == 2**62 and got.token_ids == (2**31 - 1, 0, 1, 2, 3)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused_not_nulled(tmp_path, bad):
    with EventLog.create(tmp_path / "l.jsonl") as log:
        with pytest.raises(ConfigError, match=r"event 0 \(step\)\.logprobs\[1\] is"):
            log.append(Step(token_ids=(1, 2), logprobs=(-1.0, bad)))
        with pytest.raises(ConfigError, match=r"event 0 \(episode_end\)\.scores\.q is"):
            log.append(EpisodeEnd(scores={"q": bad}))
        assert len(log) == 0
    assert verify(tmp_path / "l.jsonl").ok


def test_unserializable_values_are_config_errors(tmp_path):
    with EventLog.create(tmp_path / "l.jsonl") as log:
        with pytest.raises(ConfigError, match=r"event 0 \(episode_start\)\.task\.obj is not JSON-serializable"):
            log.append(EpisodeStart(task={"obj": object()}))
        with pytest.raises(ConfigError, match=r"event 0 \(step\)\.policy_version is not JSON-serializable"):
            log.append(Step(policy_version=2**70))  # type: ignore[arg-type]


def test_append_refuses_recorded_events_and_non_events(tmp_path):
    with EventLog.create(tmp_path / "l.jsonl") as log:
        recorded = log.append(Message(role="user", content="hi"))
        with pytest.raises(ConfigError, match=r"already has seq=0, id='e0-"):
            log.append(recorded)
        with pytest.raises(ConfigError, match="dict is not an event type"):
            log.append({"kind": "message"})  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="event 1 .*already has seq=7"):
            log.extend([Message(role="user"), Message(role="user", seq=7)])
        assert len(log) == 1  # a refused batch writes nothing
    with pytest.raises(ConfigError, match="the log is closed"):
        log.append(Message(role="user"))


def test_create_and_open_errors(tmp_path):
    path = tmp_path / "l.jsonl"
    EventLog.create(path).close()
    with pytest.raises(ConfigError, match="already exists"):
        EventLog.create(path)
    EventLog.create(tmp_path / "new" / "folder" / "l.jsonl").close()  # folders are created
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match="is not a folder"):
        EventLog.create(tmp_path / "afile" / "l.jsonl")
    with pytest.raises(ConfigError, match=r"durability='sometimes'; expected one of \['always', 'batch', 'none'\]"):
        EventLog.create(tmp_path / "m.jsonl", durability="sometimes")
    with pytest.raises(LogFormatError, match="no such log file"):
        EventLog.open(tmp_path / "nope.jsonl")
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("mode, per_append, per_extend, at_close", [("always", 1, 1, 1), ("batch", 0, 1, 1), ("none", 0, 0, 0)])
def test_durability_modes_fsync_counts(tmp_path, monkeypatch, mode, per_append, per_extend, at_close):
    log = EventLog.create(tmp_path / "l.jsonl", durability=mode)
    calls = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd)))
    log.append(Message(role="user", content="a"))
    assert len(calls) == per_append
    log.extend([Message(role="user", content="b"), Message(role="user", content="c")])
    assert len(calls) == per_append + per_extend
    log.close()
    assert len(calls) == per_append + per_extend + at_close


def test_two_handles_share_a_dense_chain(tmp_path):
    """Tail sync: each handle reads what the other appended before computing seq and prev."""
    path = tmp_path / "l.jsonl"
    a = EventLog.create(path)
    b = EventLog.open(path)
    for i in range(10):
        (a if i % 3 else b).append(Message(role="user", content=f"m{i}"))
    assert [e.seq for e in b.refresh()] == list(range(10))
    assert len(a) == 9  # b wrote m9 last; a reads it on its next append or refresh
    a.refresh()
    assert a.events() == b.events() == read_events(path)
    assert [e.content for e in read_events(path)] == [f"m{i}" for i in range(10)]
    a.close(), b.close()
    assert verify(path).ok


# ------------------------------------------------------------------------------------------- import / export

ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=9)
uni = st.text(max_size=40)  # any unicode, including surrogates-free astral characters
json_leaf = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False) | uni
extra_keys = st.dictionaries(st.sampled_from(["weight", "x-meta", "cache_control", "refusal", "audio"]),
                             st.recursive(json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(uni, c, max_size=2),
                                          max_leaves=5), max_size=2)
content = uni | st.lists(st.builds(lambda t: {"type": "text", "text": t}, uni), min_size=1, max_size=3)


@st.composite
def conversations(draw):
    messages, open_calls, n = [], [], 0
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(content)})
    for _ in range(draw(st.integers(1, 5))):
        messages.append({"role": "user", "content": draw(content), **draw(extra_keys)})
        msg = {"role": "assistant", "content": draw(st.none() | content)}
        calls = []
        for _ in range(draw(st.integers(0, 3))):
            n += 1
            calls.append({"id": f"call_{n}_{draw(ids)}", "type": "function",
                          "function": {"name": draw(ids), "arguments": orjson.dumps(draw(extra_keys)).decode()}})
        if calls:
            msg["tool_calls"] = calls
        if draw(st.booleans()):
            msg["reasoning_content"] = draw(uni)
        messages.append({**msg, **draw(extra_keys)})
        for call in calls:
            reply = {"role": "tool", "tool_call_id": call["id"], "content": draw(content)}
            if draw(st.booleans()):
                reply["name"] = call["function"]["name"]
            messages.append(reply)
    if draw(st.booleans()):
        return messages
    tools = [{"type": "function", "function": {"name": draw(ids), "parameters": {"type": "object"}}}
             for _ in range(draw(st.integers(0, 2)))]
    pins = [draw(uni.filter(bool)) if draw(st.booleans()) else {"pin_id": f"rule-{k}", "text": draw(uni.filter(bool))}
            for k in range(draw(st.integers(0, 3)))]
    return {"messages": messages, "tools": tools, "pins": pins}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conversations())
def test_import_export_round_trip_is_lossless(tmp_path, conv):
    events = import_conversation(conv)
    assert isinstance(events[0], EpisodeStart)
    path = tmp_path / f"c{len(list(tmp_path.iterdir()))}.jsonl"
    with EventLog.create(path, durability="none") as log:
        log.extend(events)
    stored = read_events(path)
    if isinstance(conv, list):
        assert export_messages(stored) == conv
    else:
        assert export_conversation(stored) == conv
        assert export_messages(stored) == conv["messages"]


def test_import_builds_pins_and_start(tmp_path):
    conv = {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}],
            "pins": ["never delete /", {"text": "reply in French", "pin_id": "lang"}], "task": "demo"}
    events = import_conversation(conv, episode_id="ep-9")
    assert events == [
        EpisodeStart(episode_id="ep-9", tools=({"type": "function", "function": {"name": "f"}},),
                     metadata={"conversation_extra": {"task": "demo"}}),
        Pin(pin_id="pin-0", text="never delete /", rule="explicit"),
        Pin(pin_id="lang", text="reply in French", rule="explicit"),
        Message(role="user", content="hi"),
    ]
    assert export_conversation(events + [Unpin(pin_id="pin-0")])["pins"] == [{"pin_id": "lang", "text": "reply in French"}]


@pytest.mark.parametrize(
    "conv, pattern",
    [
        ([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}], r"^messages\[1\]: unknown role 'robot'"),
        ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "f"}}]},
          {"role": "tool", "tool_call_id": "c2", "content": "x"}],
         r"^messages\[1\]: tool message answers tool_call_id 'c2', which no earlier assistant message called"),
        ([{"role": "tool", "tool_call_id": "c1", "content": "x"},
          {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "f"}}]}],
         r"^messages\[0\]: tool message answers tool_call_id 'c1'"),
        ([{"role": "user", "content": {"text": "x"}}], r"^messages\[0\]: content of type dict is not supported"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}], r"^messages\[0\]: content part 0"),
        ({"msgs": []}, r'an object needs a "messages" list'),
        ("hello", r"expected an object or a list of messages, got str"),
        ({"messages": [], "tools": "f"}, r'"tools" must be a list'),
        ({"messages": [], "pins": [3]}, r"^pins\[0\]: expected a string or an object, got int"),
        ({"messages": [], "pins": [{"text": "a", "why": 1}]}, r"^pins\[0\]: unknown key\(s\) \['why'\]"),
        ({"messages": [], "pins": [""]}, r"^pins\[0\]: the pin text must be a non-empty string"),
        ({"messages": [], "pins": ["a", {"text": "b", "pin_id": "pin-0"}]}, r"^pins\[1\]: pin_id 'pin-0' is not a new"),
    ],
)
def test_import_typed_errors(conv, pattern):
    with pytest.raises(MessageFormatError, match=pattern):
        import_conversation(conv)


def test_load_conversation_invalid_json_names_file_and_position(tmp_path):
    path = tmp_path / "conv.json"
    path.write_text('{"messages": [\n  {"role": "user", "content": "x"},\n  {"role": oops}\n]}')
    with pytest.raises(LogFormatError) as info:
        load_conversation(path)
    assert info.value.path == str(path) and info.value.line == 3
    assert re.search(r"conv\.json:3: invalid JSON: .*\(line 3, column 12, byte 62\)", str(info.value))
    with pytest.raises(LogFormatError, match="cannot read"):
        load_conversation(tmp_path / "absent.json")


def test_import_export_keeps_key_order_of_tool_schemas(tmp_path):
    # Templates render tool schemas with tojson in the order given; a reordered schema renders other ids.
    conv = {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "z", "description": "d", "parameters": {
            "type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "string"}}}}}],
    }
    path = tmp_path / "order.jsonl"
    log = EventLog.create(path)
    log.extend(import_conversation(conv))
    log.close()
    back = export_conversation(EventLog.open(path).events())
    assert json.dumps(back["tools"]) == json.dumps(conv["tools"])
    assert list(back["tools"][0]["function"]["parameters"]["properties"]) == ["b", "a"]


def test_bundled_example_round_trips_exactly(tmp_path):
    # Its tool-call arguments are objects (HF style); they come back as objects, not re-serialized text.
    from importlib.resources import files

    conv = json.loads(files("ctxkit_examples").joinpath("agent_episode.json").read_text())
    path = tmp_path / "example.jsonl"
    log = EventLog.create(path)
    log.extend(import_conversation(conv))
    log.close()
    back = export_conversation(EventLog.open(path).events())
    assert back["messages"] == conv["messages"]
    assert back["tools"] == conv["tools"]


def test_tool_call_arguments_of_another_type_are_typed_errors():
    with pytest.raises(MessageFormatError, match="arguments are list"):
        import_conversation([{"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": [1, 2]}}]}])
