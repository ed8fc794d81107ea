"""The fast sequencer (`ctxkit.log.sequencer`) against its specification, written out here the slow way: the
event's dict (`events.event_to_dict`), its id (`events.event_id`), its line in field order, the line hash over
the sorted canonical bytes, and the recorded copy a reader of the file builds (`events.event_from_dict`).
Every event shape below, the odd ones included, must give the same bytes, ids and copies (same types too)."""

from __future__ import annotations

import enum
import math
import types

import orjson
import pytest

from ctxkit.edits import MaskEdit
from ctxkit.kept_set import KeptSet
from ctxkit.errors import ConfigError, EventFormatError
from ctxkit.events import (Compaction, EpisodeEnd, EpisodeStart, Message, Pin, StateSnapshot, Step, ToolCall,
                           ToolResult, Unpin, event_from_dict, event_id, event_to_dict)
from ctxkit.log.event_log import EventLog, MemoryLog, iter_events, read_events
from ctxkit.log.file_format import canonical, line_hash
from ctxkit.log.sequencer import stamp, stamp_line, stamp_lines

PREV = "ab" * 32


class Level(enum.IntEnum):
    HIGH = 3


class Text(str):
    """A str subclass: written as a plain string, read back as one."""


class Special(ToolResult):
    """A subclass of an event type (the general path)."""


def _forced(event, **fields):
    for name, value in fields.items():
        object.__setattr__(event, name, value)
    return event


SHAPES = [
    ToolResult(tool_call_id="c1", name="shell", content="out ✓", duration_s=0.25),
    ToolResult(tool_call_id="c2", content=({"type": "text", "text": "a"}, {"type": "text", "text": "b"}), status="error"),
    Message(role="user", content="hi"),
    Message(role="user", content="given ts", ts=7.0),
    Message(role="assistant", content=None, tool_calls=(ToolCall(id="c1", name="f", arguments={"b": 1, "a": 2}),)),
    Message(role="user", content="x", extra={"z": 1, "a": (1, 2), "m": {"y": None, "b": [1.5]}}),
    Message(role="user", content=Text("a str subclass")),
    EpisodeStart(episode_id="e", tools=({"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}},),
                 task={"seed": 3}, sampler={"stop": ("a", "b")}),
    EpisodeStart(episode_id="tools given as a list", tools=[{"type": "function"}]),
    Step(token_ids=(1, 2, 3), logprobs=(-0.5, -0.25, 0.0), logprob_kind="processed", timings={"decode": 1.0},
         finish_reason="stop", policy_version=Level.HIGH),
    Step(),
    Step(token_ids=(), raw_logprobs=(), sampling={"temperature": 0.7}, ts=1.5),
    Step(token_ids=(4, 5), logprobs=(-0.1, -0.2), logprob_kind="processed",
         kept_set=KeptSet(sizes=(2, 90), ids=((4, 6), None), top_k=0, top_p=0.95, min_p=0.0)),
    Pin(pin_id="p", text="never delete /etc"),
    Unpin(pin_id="p", reason=None),
    Compaction(compressor="mask-observations-v2", edits=(MaskEdit(event_id="e1-00000000", text="[x]"),),
               details={"tokens": 10}),
    Compaction(compressor="none"),
    StateSnapshot(adapter="json", name="state", manifest_sha256="0" * 64),
    EpisodeEnd(outcome="truncated", cause="max_steps", reward=-0.0, reward_kind="limit_truncation", scores={"q": 1e300}),
    Special(tool_call_id="sub", content="a subclass"),
    _forced(Message(role="user", content="forced"), name=["a", "list"]),
    _forced(Message(role="user", content="forced"), extra=[]),
]


def reference(event, seq: int, ts: float, prev: str):
    """The specification: (recorded copy, dict, line, line hash) the slow way."""
    as_dict = event_to_dict(event)
    as_dict["seq"], as_dict["id"] = seq, event_id(event, seq)
    if as_dict["ts"] is None:
        as_dict["ts"] = ts
    body = orjson.dumps(as_dict)
    digest = line_hash(prev, canonical(as_dict))
    line = body[:-1] + b',"prev":"' + prev.encode() + b'","hash":"' + digest.encode() + b'"}\n'
    return event_from_dict(orjson.loads(body)), as_dict, line, digest


def same(a, b) -> bool:
    """Equal, field by field, with the same types (a tuple is not a list, a plain str not a subclass)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if hasattr(a, "__dataclass_fields__"):
        return all(same(getattr(a, n), getattr(b, n)) for n in a.__dataclass_fields__)
    return a == b or (a != a and b != b)


@pytest.mark.parametrize("event", SHAPES, ids=lambda e: f"{type(e).__name__}:{getattr(e, 'content', '')!s:.20}")
def test_every_shape_stamps_as_the_specification_says(event):
    want_copy, want_dict, want_line, want_hash = reference(event, 41, 3.25, PREV)
    copy, line, digest = stamp_line(event, 41, 3.25, PREV)
    assert line == want_line and digest == want_hash
    [(copy2, as_dict, body)] = stamp([event], 41, 3.25)
    assert as_dict == want_dict and body == orjson.dumps(want_dict)
    if type(event) is Special:  # a subclass keeps its class; its fields are what a reader gets
        assert type(copy) is type(copy2) is Special and event_to_dict(copy) == event_to_dict(want_copy)
        return
    assert copy == want_copy and same(copy, want_copy) and same(copy2, want_copy)
    if not isinstance(getattr(event, "extra", None), list):
        reread = event_from_dict({k: v for k, v in orjson.loads(line).items() if k not in ("prev", "hash")})
        assert same(copy, reread)  # what a reader of the file builds, field by field, types included


def test_a_batch_chains_like_single_lines():
    recorded, payload, last = stamp_lines(SHAPES[:6], 10, 2.0, PREV)
    prev, lines = PREV, []
    for i, event in enumerate(SHAPES[:6]):
        copy, line, prev = stamp_line(event, 10 + i, 2.0, prev)
        assert same(copy, recorded[i])
        lines.append(line)
    assert payload == b"".join(lines) and last == prev


def test_the_recorded_copy_shares_nothing_mutable_with_the_caller(tmp_path):
    extra, sampling, sampler = {}, {"temperature": 0.5}, {}
    events = [Message(role="user", content="a", extra=extra), Step(sampling=sampling), EpisodeStart(sampler=sampler)]
    with EventLog.create(tmp_path / "ep.jsonl") as log:
        recorded = [log.append(e) for e in events]
    extra["late"] = 1
    sampling["temperature"] = 9.0
    sampler["late"] = 2
    assert recorded[0].extra == {} and recorded[1].sampling == {"temperature": 0.5} and recorded[2].sampler == {}
    assert read_events(tmp_path / "ep.jsonl") == tuple(recorded)


@pytest.mark.parametrize("bad, error, pattern", [
    (_forced(ToolResult(tool_call_id="c"), status="exploded"), EventFormatError, r"status"),
    (_forced(Step(), finish_reason=["stop"]), EventFormatError, r"finish_reason"),
    (_forced(Message(role="user"), role=Text("user")), EventFormatError, r"role"),
    (ToolResult(tool_call_id="c", duration_s=math.inf), ConfigError, r"event 0 \(tool_result\).duration_s is inf"),
    (Message(role="user", extra={"x": math.nan}), ConfigError, r"event 0 \(message\).extra.x is nan"),
    (Message(role="user", extra={"x": object()}), ConfigError, r"event 0 \(message\)\.extra\.x is not JSON-serializable"),
    (Message(role="user", extra=types.MappingProxyType({})), ConfigError, r"event 0 \(message\)\.extra is not JSON-serializable"),
    (Message(role="user", content="\ud800"), ConfigError, r"event 0 \(message\): content is not UTF-8 text"),
    (Step(token_ids=(2**70,)), ConfigError, r"event 0 \(step\)\.token_ids\[0\] is not JSON-serializable"),
])
def test_bad_events_are_refused_the_same_way_by_both_logs(tmp_path, bad, error, pattern):
    with pytest.raises(error, match=pattern):
        MemoryLog().append(bad)
    with EventLog.create(tmp_path / "ep.jsonl") as log, pytest.raises(error, match=pattern):
        log.append(bad)
    assert read_events(tmp_path / "ep.jsonl") == ()


@pytest.mark.parametrize("bad, message", [
    # the plan path (`_stamp`)
    (EpisodeStart(metadata={"run": {"tags": {"a"}}}),
     "event 1 (episode_start).metadata.run.tags is not JSON-serializable: Type is not JSON serializable: set"),
    (Message(role="user", extra={"seen": [1, object()]}),
     "event 1 (message).extra.seen[1] is not JSON-serializable: Type is not JSON serializable: object"),
    (Message(role="user", extra={"path": "a\udcff.json"}),
     "event 1 (message): extra.path is not UTF-8 text ('a\\udcff.json'); a log holds only UTF-8 JSON (record a file "
     "name as os.fsencode(path).decode('utf-8', 'backslashreplace'))"),
    # the general path (`_fill`: an event with tool calls)
    (Message(role="assistant", tool_calls=(ToolCall(id="c", name="f", arguments="{}"),), extra={"tags": {"a"}}),
     "event 1 (message).extra.tags is not JSON-serializable: Type is not JSON serializable: set"),
])
def test_an_unserializable_field_is_named(tmp_path, bad, message):
    memory = MemoryLog()
    memory.append(Message(role="user", content="first"))
    with pytest.raises(ConfigError) as caught:
        memory.append(bad)
    assert str(caught.value) == message
    with EventLog.create(tmp_path / "ep.jsonl") as log:
        log.append(Message(role="user", content="first"))
        with pytest.raises(ConfigError) as caught:
            log.append(bad)
    assert str(caught.value) == message
    assert len(read_events(tmp_path / "ep.jsonl")) == 1


def test_all_shapes_written_by_append_read_back_exactly(tmp_path):
    path = tmp_path / "ep.jsonl"
    for durability in ("none", "batch"):
        with EventLog.create(path, durability=durability) as log:
            recorded = [log.append(e) for e in SHAPES if type(e) is not Special]
        assert list(iter_events(path)) == list(read_events(path)) == recorded
        path.unlink()
