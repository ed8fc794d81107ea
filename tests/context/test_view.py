"""view.py: pure build_view, edit ops, pinned block, hash, orphan detection (hand-built event lists)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkit.edits import DropEdit, MaskEdit, RetrievedEdit, SummaryEdit
from ctxkit.errors import LogFormatError, MessageFormatError
from ctxkit.events import Compaction, EpisodeStart, Message, Pin, Step, ToolCall, ToolResult, Unpin
from ctxkit.context.view import (
    PINNED_HEADER,
    Provenance,
    ViewMessage,
    ViewState,
    apply_edits,
    build_view,
    find_orphans,
    pairing_problems,
    newest_turn_start,
)

TOOLS = ({"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}},)


def stamp(events):
    """Give hand-built events the seq/id the log would give them."""
    return [dataclasses.replace(e, seq=i, id=f"e{i}", ts=0.0) for i, e in enumerate(events)]


def episode(turns: int = 3):
    evs = [
        EpisodeStart(episode_id="ep", tools=TOOLS),
        Message(role="system", content="You are careful."),
        Message(role="user", content="Fix the bug. Do not modify the original file."),
    ]
    for t in range(turns):
        evs.append(Step(token_ids=(10, 11, t), content=f"step {t}",
                        tool_calls=(ToolCall(id=f"c{t}", name="read", arguments='{"path": "a"}'),)))
        evs.append(ToolResult(tool_call_id=f"c{t}", name="read", content=f"output {t}"))
    return stamp(evs)


def summary(view):
    return [(m.role, m.content, m.provenance.how, m.provenance.event_ids) for m in view.messages]


def test_build_view_golden():
    v = build_view(episode(2))
    assert summary(v) == [
        ("system", "You are careful.", "verbatim", ("e1",)),
        ("user", "Fix the bug. Do not modify the original file.", "verbatim", ("e2",)),
        ("assistant", "step 0", "verbatim", ("e3",)),
        ("tool", "output 0", "verbatim", ("e4",)),
        ("assistant", "step 1", "verbatim", ("e5",)),
        ("tool", "output 1", "verbatim", ("e6",)),
    ]
    assert v.tools == TOOLS
    assert v.upto_seq == 6
    assert v.messages[2].token_ids == (10, 11, 0)
    assert v.messages[2].to_chat() == {
        "role": "assistant",
        "content": "step 0",
        "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "read", "arguments": '{"path": "a"}'}}],
        "token_ids": [10, 11, 0],
    }
    assert v.messages[3].to_chat() == {"role": "tool", "content": "output 0", "tool_call_id": "c0", "name": "read"}
    assert find_orphans(v.messages) == []


def test_upto_seq_and_incremental_state_agree():
    evs = episode(3)
    for upto in range(len(evs)):
        full = build_view(evs, upto_seq=upto)
        inc = ViewState().feed(evs[: upto + 1]).view()
        assert full == inc
    assert build_view(evs, upto_seq=2).upto_seq == 2
    assert len(build_view(evs, upto_seq=2).messages) == 2


def test_compactions_apply_in_log_order_and_accumulate():
    """Edits given in their JSON shape (as a log holds them) are read into typed records."""
    evs = episode(3)
    evs = stamp(evs[:7] + [
        Compaction(compressor="x-v1", edits=({"op": "mask", "event_id": "e4", "text": "[masked e4]"},)),
    ] + evs[7:] + [
        Compaction(compressor="x-v1", edits=({"op": "drop", "event_ids": ["e3", "e4"]},
                                              {"op": "truncate", "event_id": "e6", "text": "out..."})),
    ])
    v = build_view(evs)
    assert summary(v) == [
        ("system", "You are careful.", "verbatim", ("e1",)),
        ("user", "Fix the bug. Do not modify the original file.", "verbatim", ("e2",)),
        ("assistant", "step 1", "verbatim", ("e5",)),
        ("tool", "out...", "truncated", ("e6",)),
        ("assistant", "step 2", "verbatim", ("e8",)),
        ("tool", "output 2", "verbatim", ("e9",)),
    ]
    # the compaction recorded before e8 does not touch later messages; a view before it is unmasked
    assert build_view(evs, upto_seq=6).messages[3].content == "output 0"
    assert build_view(evs, upto_seq=7).messages[3].content == "[masked e4]"
    assert build_view(evs, upto_seq=7).messages[3].token_ids is None


def test_summary_and_retrieved_ops():
    evs = episode(3)
    v = build_view(evs)
    v2 = apply_edits(v, [SummaryEdit(("e3", "e4", "e5", "e6"), "Read a twice.", "user")])
    assert summary(v2)[2] == ("user", "Read a twice.", "summary", ("e3", "e4", "e5", "e6"))
    assert [m.provenance.event_ids for m in v2.messages[3:]] == [("e7",), ("e8",)]
    v3 = apply_edits(v2, [RetrievedEdit(("e4",), "[retrieved] output 0", (0.9,))])
    # inserted before the assistant message whose call the trailing tool result answers
    assert [m.provenance.how for m in v3.messages] == ["verbatim", "verbatim", "summary", "retrieved", "verbatim", "verbatim"]
    v4 = apply_edits(v3, [RetrievedEdit(("e6",), "[retrieved] output 1", (0.5,), "system")])
    assert [(m.role, m.content) for m in v4.messages if m.provenance.how == "retrieved"] == [("system", "[retrieved] output 1")]
    assert v3.messages[3].role == "user"  # role None reads as user
    assert find_orphans(v4.messages) == []


def test_newest_turn_start():
    mk = lambda role, calls=(): ViewMessage(role=role, content="", tool_calls=calls)  # noqa: E731
    call = (ToolCall("c", "f", "{}"),)
    assert newest_turn_start([mk("system"), mk("user")]) == 1
    assert newest_turn_start([mk("user"), mk("assistant", call), mk("tool"), mk("tool")]) == 1
    assert newest_turn_start([mk("user"), mk("assistant")]) == 2
    assert newest_turn_start([mk("user"), mk("assistant", call)]) == 1  # a pending call starts the newest turn


def test_bad_edits_name_the_compaction():
    evs = episode(1) + [Compaction(compressor="bad-v1", edits=({"op": "mask", "event_id": "e99", "text": "x"},))]
    evs = stamp(evs)
    with pytest.raises(LogFormatError, match=r"seq 5.*e99"):
        build_view(evs)
    with pytest.raises(LogFormatError, match=r"edit 0 is dict, not a typed edit; known kinds: \['drop', 'mask', 'retrieved', 'summary', 'truncate'\]"):
        apply_edits(build_view(episode(1)), [{"op": "drop", "event_ids": ["e3"]}])
    with pytest.raises(LogFormatError, match=r"edits: edit 1 \('drop'\): none of the event ids \['nope'\]"):
        apply_edits(build_view(episode(1)), [MaskEdit("e4", "x"), DropEdit(("nope",))])


def test_orphaned_tool_result_in_log_is_rejected():
    evs = stamp([Message(role="user", content="hi"), ToolResult(tool_call_id="ghost", content="x")])
    with pytest.raises(MessageFormatError, match=r"e1 \(seq 1.*'ghost'"):
        build_view(evs)


def test_find_orphans():
    call = ViewMessage(role="assistant", content="", tool_calls=(ToolCall("c1", "f", "{}"), ToolCall("c2", "f", "{}")),
                       provenance=Provenance("verbatim", ("e1",)))
    r1 = ViewMessage(role="tool", content="", tool_call_id="c1", provenance=Provenance("verbatim", ("e2",)))
    r2 = ViewMessage(role="tool", content="", tool_call_id="c2", provenance=Provenance("verbatim", ("e3",)))
    user = ViewMessage(role="user", content="u", provenance=Provenance("verbatim", ("e4",)))
    assert find_orphans([call, r1, r2, user]) == []
    assert find_orphans([call, r1, user]) == ["tool call 'c2' of e1 has no result before the next message e4 (unanswered call)"]
    assert find_orphans([user, r1]) == ["tool result e2 answers call 'c1' with no matching call before it (orphaned result)"]
    assert find_orphans([call, r1, user, r2])[0] == "tool call 'c2' of e1 has no result before the next message e4 (unanswered call)"
    # the calls of the last assistant message may still be pending: legal, reported only on request
    assert find_orphans([user, call, r1]) == []
    assert [(p.problem, p.event, p.call_id) for p in pairing_problems([user, call, r1], allow_pending=False)] == [
        ("pending_call", "e1", "c2")]
    # a second result for an answered call is a duplicate, not an orphan
    assert [(p.problem, p.event, p.call_id, p.text) for p in pairing_problems([call, r1, r2, r1])] == [
        ("duplicated_result", "e2", "c1", "tool result e2 answers call 'c1', which an earlier result already answered "
                                          "(duplicated result)")]


def test_pinned_block_appears_only_when_text_left_the_view():
    evs = episode(2) + [Pin(pin_id="p1", text="Do not modify the original file.", source_event_id="e2", rule="explicit"),
                        Pin(pin_id="p2", text="Answer in French.", rule="explicit")]
    evs = stamp(evs)
    v = build_view(evs)
    assert [p.pin_id for p in v.active_pins] == ["p1", "p2"]
    # p1 is verbatim in the user message, p2 is nowhere: only p2 is listed, right after the system message
    assert v.messages[1].provenance == Provenance("pinned", ("e8",))
    assert v.messages[1].content == f"{PINNED_HEADER}\n- Answer in French."
    v2 = apply_edits(v, [DropEdit(("e2",))])
    assert v2.messages[1].content == f"{PINNED_HEADER}\n- Do not modify the original file.\n- Answer in French."
    unpinned = build_view(stamp(list(evs) + [Unpin(pin_id="p2")]))
    assert [p.pin_id for p in unpinned.active_pins] == ["p1"]
    assert all(m.provenance.how != "pinned" for m in unpinned.messages)


def test_hash_is_stable_and_sensitive():
    a = build_view(episode(2))
    b = build_view(episode(2))
    assert a.hash == b.hash and len(a.hash) == 64
    masked = apply_edits(a, [MaskEdit("e4", "output 0")])  # same text, other provenance
    assert masked.hash != a.hash
    pinned = build_view(stamp(list(episode(2)) + [Pin(pin_id="p", text="step 0")]))
    assert pinned.hash != a.hash  # pin ids are part of the hash even when the text is already visible


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=6), st.data())
def test_random_drops_of_whole_groups_never_orphan(calls_per_turn, data):
    evs = [Message(role="system", content="s"), Message(role="user", content="u")]
    for t, k in enumerate(calls_per_turn):
        calls = tuple(ToolCall(id=f"c{t}_{j}", name="f", arguments="{}") for j in range(k))
        evs.append(Step(content="", tool_calls=calls))
        evs.extend(ToolResult(tool_call_id=c.id, content="r") for c in calls)
    evs = stamp(evs)
    v = build_view(evs)
    assert find_orphans(v.messages) == []
    # dropping a whole group (assistant + its results) keeps pairing; dropping one result breaks it
    steps = [e for e in evs if isinstance(e, Step)]
    pick = data.draw(st.sampled_from(steps))
    group = [pick.id] + [e.id for e in evs if isinstance(e, ToolResult) and e.tool_call_id.startswith(pick.tool_calls[0].id.split("_")[0] + "_")]
    assert find_orphans(apply_edits(v, [DropEdit(tuple(group))]).messages) == []
    # (in the last group the call looks pending: the builder refuses that by comparing with the view before)
    assert pairing_problems(apply_edits(v, [DropEdit((group[1],))]).messages, allow_pending=False) != []
