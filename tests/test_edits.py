"""Typed compaction edits: records, their JSON shape (unchanged from the string-tagged dicts logs hold),
typed errors, and logs written before the records existed (tests/data/v1_logs, recorded at aa71455)
still loading, verifying and replaying with the same ids and hashes."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import orjson
import pytest

from conftest import tokenizer_dir
from ctxkit.context.builder import ContextBuilder
from ctxkit.context.compress import make_compressor
from ctxkit.edits import (
    EDIT_KINDS,
    DropEdit,
    MaskEdit,
    RetrievedEdit,
    SummaryEdit,
    TruncateEdit,
    edit_from_dict,
    edit_to_dict,
)
from ctxkit.errors import LogFormatError
from ctxkit.events import Compaction, EpisodeStart, Step, event_from_dict, event_id, event_to_dict
from ctxkit.log.event_log import EventLog, read_events
from ctxkit.training.context_replay import verify_log

V1_LOGS = Path(__file__).parent / "data" / "v1_logs"

OLD_SHAPES = (
    {"op": "drop", "event_ids": ["e3-aaaa", "e4-bbbb"]},
    {"op": "mask", "event_id": "e6-cccc", "text": "[tool output e6-cccc masked: 418 tokens]"},
    {"op": "truncate", "event_id": "e8-dddd", "text": "head\n[... 90 tokens of e8-dddd truncated ...]"},
    {"op": "summary", "event_ids": ["e9-eeee"], "text": "Summary of earlier conversation:\nx", "role": "user"},
    {"op": "retrieved", "event_ids": ["e9-eeee"], "text": "Retrieved ...", "scores": [0.812345, 0.5], "role": "user"},
)
TYPED = (
    DropEdit(("e3-aaaa", "e4-bbbb")),
    MaskEdit("e6-cccc", "[tool output e6-cccc masked: 418 tokens]"),
    TruncateEdit("e8-dddd", "head\n[... 90 tokens of e8-dddd truncated ...]"),
    SummaryEdit(("e9-eeee",), "Summary of earlier conversation:\nx", "user"),
    RetrievedEdit(("e9-eeee",), "Retrieved ...", (0.812345, 0.5), "user"),
)


def test_one_record_per_kind_with_a_kind_tag():
    assert sorted(EDIT_KINDS) == ["drop", "mask", "retrieved", "summary", "truncate"]
    for kind, cls in EDIT_KINDS.items():
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        assert next(e for e in TYPED if isinstance(e, cls)).kind == kind
    with pytest.raises(dataclasses.FrozenInstanceError):
        TYPED[1].text = "changed"  # type: ignore[misc]


def test_json_shape_is_the_old_dict_shape_key_for_key():
    assert [edit_to_dict(e) for e in TYPED] == list(OLD_SHAPES)
    assert [list(edit_to_dict(e)) for e in TYPED] == [list(d) for d in OLD_SHAPES]  # key order too
    assert tuple(edit_from_dict(d) for d in OLD_SHAPES) == TYPED
    # optional fields left out stay left out (a hand-written edit reads back to the same bytes)
    bare = {"op": "retrieved", "event_ids": ["e1"], "text": "t"}
    assert edit_from_dict(bare) == RetrievedEdit(("e1",), "t") and edit_to_dict(edit_from_dict(bare)) == bare


def test_compaction_reads_json_edits_and_keeps_the_event_id():
    """The id of a compaction holding every edit kind is the one ctxkit gave it before edits were typed
    (computed at aa71455), and its JSON is byte for byte the same."""
    comp = Compaction(compressor="pipeline-v1", params={"stages": []}, edits=OLD_SHAPES, details={"tokens_before": 10})
    assert comp.edits == TYPED
    assert event_id(comp, 12) == "e12-22af9f2f"
    assert orjson.dumps(event_to_dict(comp)["edits"]) == orjson.dumps(list(OLD_SHAPES))
    assert event_from_dict(event_to_dict(comp)) == comp
    assert Compaction(compressor="pipeline-v1", params={"stages": []}, edits=TYPED, details={"tokens_before": 10}) == comp


def test_unknown_kind_is_a_typed_error_naming_the_known_kinds():
    with pytest.raises(LogFormatError, match=r"compaction 'x-v1': edit 1: unknown edit kind \(op\) 'explode'; "
                                             r"known kinds: \['drop', 'mask', 'retrieved', 'summary', 'truncate'\]"):
        Compaction(compressor="x-v1", edits=(OLD_SHAPES[0], {"op": "explode"}))
    with pytest.raises(LogFormatError, match=r"line 3: unknown edit kind \(op\) None"):
        edit_from_dict({"event_ids": ["e1"]}, where="line 3")


@pytest.mark.parametrize("data, message", [
    ({"op": "drop", "event_ids": []}, r"'event_ids' is \[\]; expected a non-empty list of event id strings"),
    ({"op": "drop", "event_ids": "e1"}, r"'event_ids' is 'e1'"),
    ({"op": "drop"}, r"'drop' edit has no \['event_ids'\]"),
    ({"op": "mask", "event_id": "e1", "text": 3}, r"mask edit: 'text' is 3; expected a string"),
    ({"op": "mask", "event_id": "e1", "text": "x", "colour": 1}, r"unknown field\(s\) \['colour'\] for edit kind 'mask'"),
    ({"op": "summary", "event_ids": ["e1"], "text": "x", "role": "tool"}, r"'role' is 'tool'; expected one of \['user', 'assistant', 'system'\]"),
    ({"op": "retrieved", "event_ids": ["e1"], "text": "x", "scores": ["high"]}, r"'scores' is \['high'\]; expected a list of numbers"),
])
def test_bad_fields_name_what_and_where(data, message):
    with pytest.raises(LogFormatError, match=r"^edit 2: .*" + message):
        edit_from_dict(data, where="edit 2")


def test_compaction_edits_must_be_a_list():
    with pytest.raises(LogFormatError, match=r"compaction 'x-v1': 'edits' is dict; expected a list of edits"):
        Compaction(compressor="x-v1", edits={"op": "drop", "event_ids": ["e1"]})  # type: ignore[arg-type]


def rewrite_line(path: Path, seq: int, change) -> None:
    """Change event `seq` of a log and re-chain every line hash after it (a valid, forged log)."""
    lines = path.read_bytes().splitlines()
    prev = orjson.loads(lines[0])["hash"]
    out = [lines[0]]
    for raw in lines[1:]:
        obj = orjson.loads(raw)
        obj.pop("prev"), obj.pop("hash")
        if obj["seq"] == seq:
            change(obj)
        digest = hashlib.sha256(prev.encode() + orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()
        out.append(orjson.dumps({**obj, "prev": prev, "hash": digest}))
        prev = digest
    path.write_bytes(b"\n".join(out) + b"\n")


def test_an_unknown_kind_in_a_log_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes((V1_LOGS / "v1-summarize.jsonl").read_bytes())
    comp = next(e for e in read_events(path) if isinstance(e, Compaction))
    rewrite_line(path, comp.seq, lambda obj: obj["edits"][0].update(op="squash"))
    with pytest.raises(LogFormatError, match=rf"bad.jsonl:{comp.seq + 2}: compaction 'summarize-v1': edit 0: "
                                             r"unknown edit kind \(op\) 'squash'; known kinds: \['drop', "):
        read_events(path)


@pytest.mark.parametrize("name, kinds", [
    ("pipeline", {"mask", "drop"}),
    ("summarize", {"summary"}),
    ("retrieve", {"drop", "retrieved"}),
])
def test_logs_recorded_before_typed_edits_load_verify_and_replay(tmp_path, name, kinds):
    """Logs written at aa71455 (string-tagged edit dicts, v1 compressors): every event reads back with
    typed edits and re-serializes to exactly the JSON on disk; every step's context replays to its
    recorded hash; the recorded compressor spec still makes a compressor."""
    src = V1_LOGS / f"v1-{name}.jsonl"
    path = tmp_path / src.name
    path.write_bytes(src.read_bytes())
    events = read_events(path)
    on_disk = [orjson.loads(raw) for raw in path.read_bytes().splitlines()[1:]]
    for event, obj in zip(events, on_disk, strict=True):
        obj.pop("prev"), obj.pop("hash")
        assert event_to_dict(event) == obj
        assert orjson.dumps(event_to_dict(event), option=orjson.OPT_SORT_KEYS) == orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    # ids are recomputed from the typed events exactly as they were recorded
    assert [event_id(dataclasses.replace(e, seq=None, id=None, ts=None), e.seq) for e in events] == [e.id for e in events]
    compactions = [e for e in events if isinstance(e, Compaction)]
    assert {ed.kind for c in compactions for ed in c.edits} == kinds
    assert all(isinstance(ed, tuple(EDIT_KINDS.values())) for c in compactions for ed in c.edits)
    tok = str(tokenizer_dir("qwen2.5-instruct"))
    result = verify_log(path, tokenizer=tok)
    assert result.ok and result.n_steps == sum(isinstance(e, Step) for e in events) == 8
    start = next(e for e in events if isinstance(e, EpisodeStart))
    spec = start.context["compressor"]
    assert spec["name"].endswith("-v1")
    assert make_compressor(spec).spec.to_dict() == spec
    assert ContextBuilder.from_description(start.context, tokenizer=tok).compressor.spec.to_dict() == spec
    with EventLog.open(path) as log:  # and the log takes new events after them
        assert len(log) == len(events)
