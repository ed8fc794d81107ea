"""Event fields with a closed vocabulary are checked when an event is built: a bad value is an
`EventFormatError` naming the field, the value and the allowed ones; `EventLog.append` and `MemoryLog.append`
refuse it; a log file holding one is a `LogFormatError` naming the file and the line."""

from __future__ import annotations

import dataclasses
import pickle

import orjson
import pytest

from ctxkit.errors import CtxkitError, EventFormatError, LogFormatError
from ctxkit.events import (
    END_OUTCOMES,
    FINISH_REASONS,
    LOGPROB_KINDS,
    REWARD_KINDS,
    ROLES,
    TOOL_STATUSES,
    EpisodeEnd,
    Message,
    Step,
    ToolResult,
    event_from_dict,
    event_to_dict,
)
from ctxkit.log.event_log import EventLog, MemoryLog, read_events, verify
from ctxkit.log.file_format import canonical, line_hash

# (event class, field, allowed values, None allowed)
FIELDS = [
    (Message, "role", ("system", "user", "assistant", "tool"), False),
    (Step, "logprob_kind", ("raw", "processed", "recomputed", "none"), True),
    (Step, "finish_reason", ("stop", "length", "tool_calls", "content_filter", "function_call", "abort", "error"), True),
    (ToolResult, "status", ("ok", "error", "timeout"), False),
    (EpisodeEnd, "outcome", ("terminated", "truncated"), False),
    (EpisodeEnd, "reward_kind", ("scored", "unscored", "tool_failure", "task_failure", "length_truncation",
                                 "limit_truncation", "constraint_violation"), False),
]
IDS = [f"{cls.__name__}.{name}" for cls, name, _, _ in FIELDS]


def test_the_vocabularies_are_the_published_tuples():
    assert [allowed for _, _, allowed, _ in FIELDS] == [ROLES, LOGPROB_KINDS, FINISH_REASONS, TOOL_STATUSES,
                                                        END_OUTCOMES, REWARD_KINDS]


@pytest.mark.parametrize("cls, name, allowed, optional", FIELDS, ids=IDS)
def test_every_allowed_value_builds(cls, name, allowed, optional):
    for value in allowed + ((None,) if optional else ()):
        assert getattr(cls(**{name: value}), name) == value


@pytest.mark.parametrize("cls, name, allowed, optional", FIELDS, ids=IDS)
def test_a_bad_value_is_a_typed_error_naming_field_value_and_allowed(cls, name, allowed, optional):
    kind = cls.__dataclass_fields__["kind"].default
    for bad in ("bogus", allowed[0].upper(), 3, ["stop"]) + (() if optional else (None,)):
        with pytest.raises(EventFormatError) as info:
            cls(**{name: bad})
        err = info.value
        listed = ((None,) if optional else ()) + allowed
        assert str(err) == f"{kind} event: {name}={bad!r} is not one of {list(listed)}"
        assert (err.kind, err.field, err.value, err.allowed) == (kind, name, bad, listed)
        assert isinstance(err, CtxkitError) and isinstance(err, ValueError)


def test_replace_checks_too():
    with pytest.raises(EventFormatError, match=r"reward_kind='bogus'"):
        dataclasses.replace(EpisodeEnd(), reward_kind="bogus")


def test_the_error_pickles_for_process_pools():
    err = EventFormatError("episode_end", "reward_kind", "bogus", REWARD_KINDS)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is EventFormatError and str(back) == str(err) and back.allowed == REWARD_KINDS


def test_append_refuses_a_bad_value(tmp_path):
    path = tmp_path / "ep.jsonl"
    with EventLog.create(path) as log:
        with pytest.raises(EventFormatError, match=r"episode_end event: reward_kind='bogus' is not one of \['scored'"):
            log.append(EpisodeEnd(reward_kind="bogus"))
        # an event forced past its check (frozen dataclasses can be forced) is refused before anything is written
        forced = EpisodeEnd(reward_kind="scored", reward=1.0)
        object.__setattr__(forced, "reward_kind", "bogus")
        with pytest.raises(EventFormatError, match=r"reward_kind='bogus'"):
            log.append(forced)
        with pytest.raises(EventFormatError, match=r"reward_kind='bogus'"):
            log.extend([Message(role="user", content="not written either"), forced])
        assert len(log) == 0
    assert read_events(path) == ()
    memory = MemoryLog()
    with pytest.raises(EventFormatError, match=r"reward_kind='bogus'"):
        memory.append(forced)
    assert len(memory) == 0


def test_event_from_dict_turns_it_into_a_log_format_error():
    data = event_to_dict(Step(finish_reason="stop"))
    data["finish_reason"] = "eos_token"
    with pytest.raises(LogFormatError, match=r"line 7: step event: finish_reason='eos_token' is not one of \[None, 'stop'"):
        event_from_dict(data, where="line 7")


def rewrite(path, line: int, key: str, value) -> None:
    """Set `key` of the event on `line` (1-based) and re-chain every hash after it: a valid chain holding a
    bad value (a forger's or another tool's edit, not a crash)."""
    lines = path.read_bytes().splitlines()
    prev = orjson.loads(lines[line - 2])["hash"]
    out = lines[: line - 1]
    for i, raw in enumerate(lines[line - 1:]):
        obj = orjson.loads(raw)
        obj.pop("prev"), obj.pop("hash")
        if i == 0:
            obj[key] = value
        digest = line_hash(prev, canonical(obj))
        out.append(orjson.dumps({**obj, "prev": prev, "hash": digest}))
        prev = digest
    path.write_bytes(b"\n".join(out) + b"\n")


SAMPLES = {
    "role": Message(role="user", content="hi"),
    "logprob_kind": Step(token_ids=(1,), logprobs=(-0.5,), logprob_kind="processed"),
    "finish_reason": Step(token_ids=(1,), finish_reason="stop"),
    "status": ToolResult(tool_call_id="c1", content="ok"),
    "outcome": EpisodeEnd(outcome="terminated", cause="answered"),
    "reward_kind": EpisodeEnd(reward_kind="scored", reward=1.0),
}


@pytest.mark.parametrize("cls, name, allowed, optional", FIELDS, ids=IDS)
def test_reading_a_log_that_holds_a_bad_value_names_file_and_line(tmp_path, cls, name, allowed, optional):
    path = tmp_path / "ep.jsonl"
    with EventLog.create(path) as log:
        log.extend([Message(role="system", content="s"), SAMPLES[name], Message(role="user", content="after")])
    rewrite(path, 3, name, "bogus")  # line 1 header, line 2 the system message, line 3 the sample
    kind = cls.__dataclass_fields__["kind"].default
    expected = f"{path}:3: event: {kind} event: {name}='bogus' is not one of"
    with pytest.raises(LogFormatError) as info:
        read_events(path)
    assert str(info.value).startswith(expected) and info.value.line == 3 and info.value.path == str(path)
    with pytest.raises(LogFormatError, match=":3: event: "):
        EventLog.open(path)
    report = verify(path)
    assert not report.ok and [(p.line, p.code) for p in report.problems] == [(3, "event")]
    assert f"{name}='bogus'" in report.problems[0].message
