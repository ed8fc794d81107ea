"""`KeptSet` on `Step.kept_set`: its checks, its round trip through a log, and that a step without one keeps
the bytes, line hash and id it had before the field existed (golden values computed with the code before it)."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from ctxkit.errors import AlignmentError, EventFormatError, LogFormatError
from ctxkit.events import Step, event_from_dict, event_id, event_to_dict
from ctxkit.kept_set import KeptSet, kept_set_from_dict, kept_set_to_dict
from ctxkit.log.event_log import EventLog, MemoryLog, read_events
from ctxkit.log.sequencer import stamp_line

PREV = "ab" * 32
OLD_STEP = dict(context_hash="h", context_length=5, token_ids=(7, 8), logprobs=(-0.5, -1.0), logprob_kind="processed",
                sampling={"top_k": 2}, policy_version=3)
OLD_LINE = (b'{"seq":4,"id":"e4-a22eeba7","ts":1.0,"kind":"step","context_hash":"h","context_length":5,"token_ids":[7,8],'
            b'"logprobs":[-0.5,-1.0],"logprob_kind":"processed","raw_logprobs":null,"sampling":{"top_k":2},'
            b'"policy_version":3,"finish_reason":null,"content":null,"tool_calls":[],"reasoning_content":null,'
            b'"timings":{},"prev":"' + PREV.encode() + b'","hash":'
            b'"0aa4d33919853bd241f0cfa4e3c282037b3b528842ce777aebbf61f6590a70ff"}\n')
KEPT = KeptSet(sizes=(2, 70), ids=((7, 9), None), top_k=0, top_p=0.9, min_p=0.0)


def test_a_step_without_a_kept_set_has_its_old_bytes_and_id():
    step = Step(**OLD_STEP)
    assert step.kept_set is None and "kept_set" not in event_to_dict(step)
    assert event_id(step, 4) == "e4-a22eeba7"
    copy, line, _ = stamp_line(step, 4, 1.0, PREV)
    assert line == OLD_LINE and copy.kept_set is None and copy == Step(**OLD_STEP, seq=4, id="e4-a22eeba7", ts=1.0)


def test_an_old_log_line_reads_back_with_no_kept_set(tmp_path):
    with EventLog.create(tmp_path / "ep.jsonl") as log:
        recorded = log.append(Step(**OLD_STEP))
    [back] = read_events(tmp_path / "ep.jsonl")
    assert back == recorded and back.kept_set is None and b"kept_set" not in (tmp_path / "ep.jsonl").read_bytes()
    line = {k: v for k, v in orjson.loads(OLD_LINE).items() if k not in ("prev", "hash")}
    assert event_from_dict(line).kept_set is None


def test_a_kept_set_round_trips_through_both_logs(tmp_path):
    step = Step(**OLD_STEP, kept_set=KEPT)
    as_dict = event_to_dict(step)
    assert as_dict["kept_set"] == {"sizes": [2, 70], "ids": [[7, 9], None], "ids_limit": 64, "top_k": 0, "top_p": 0.9,
                                   "min_p": 0.0, "source": "exact"}
    assert event_from_dict(orjson.loads(orjson.dumps(as_dict))) == step
    assert event_id(step, 4) != "e4-a22eeba7"  # the kept set is content: it enters the id
    with EventLog.create(tmp_path / "ep.jsonl") as log:
        recorded = log.append(step)
    assert recorded.kept_set == KEPT and isinstance(recorded.kept_set, KeptSet)
    assert read_events(tmp_path / "ep.jsonl") == (recorded,)
    assert MemoryLog([step]).events()[0].kept_set == KEPT
    assert kept_set_from_dict(kept_set_to_dict(KEPT)) == KEPT and KEPT.holds(0, 9) is True
    assert KEPT.holds(0, 8) is False and KEPT.holds(1, 8) is None


def test_a_kept_set_given_as_its_json_object_is_read_into_the_record():
    step = Step(token_ids=(1,), kept_set={"sizes": [1], "ids": [[1]]})
    assert step.kept_set == KeptSet(sizes=(1,), ids=((1,),))


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(token_ids=(1, 2), kept_set=KeptSet(sizes=(1,), ids=(None,))), AlignmentError, r"kept_set has 1 entries for 2"),
    (dict(token_ids=(1,), kept_set={"sizes": [0], "ids": [None]}), EventFormatError, r"kept_set.sizes\[0\]=0"),
    (dict(token_ids=(1,), kept_set={"sizes": [2], "ids": [[1]]}), EventFormatError, r"kept_set.ids\[0\]"),
    (dict(token_ids=(1,), kept_set={"sizes": [1], "ids": [[1]], "extra": 1}), EventFormatError, r"kept_set.extra"),
    (dict(token_ids=(1,), kept_set={"sizes": [1], "ids": [[1]], "top_p": "x"}), EventFormatError, r"kept_set.top_p"),
    (dict(token_ids=(1,), kept_set=[1]), EventFormatError, r"kept_set"),
])
def test_a_malformed_kept_set_is_refused_naming_the_field(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        Step(**kwargs)


def test_a_malformed_kept_set_in_a_log_line_is_a_log_format_error():
    line = {**event_to_dict(Step(token_ids=(1,))), "kept_set": {"sizes": [1], "ids": [[1, 2]]}}
    with pytest.raises(LogFormatError, match=r"kept_set.ids\[0\]"):
        event_from_dict(line)


@pytest.mark.parametrize("name", ["v1-pipeline", "v1-retrieve", "v1-summarize"])
def test_the_stored_v1_logs_restamp_to_their_own_bytes_and_ids(name):
    """Every event of the logs kept in tests/data (written before `kept_set` existed) has the id it was given and
    stamps to its own line, byte for byte, chained to the line before it."""
    from pathlib import Path

    path = Path(__file__).parent / "data" / "v1_logs" / f"{name}.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)[1:]  # the header line is not an event
    events = read_events(path)
    assert len(events) == len(lines) and sum(e.kind == "step" for e in events) == 8
    for event, line in zip(events, lines):
        stored = orjson.loads(line)
        fresh = dataclasses.replace(event, seq=None, id=None)
        assert event.kept_set is None if event.kind == "step" else True
        assert event_id(fresh, event.seq) == event.id
        _, restamped, _ = stamp_line(fresh, event.seq, event.ts, stored["prev"])
        assert restamped == line
