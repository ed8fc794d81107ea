"""A harness's history against the recorded one: an extension gives no edit, each rewrite gives the exact
typed edits, anything else the drop-and-append fallback; the edits always reproduce what the harness sent."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkit.context.view import message_of
from ctxkit.edits import DropEdit, SummaryEdit, TruncateEdit
from ctxkit.events import Message, Step, ToolCall, ToolResult
from ctxkit.integrations.gateway.history import (apply_history_edits, chain, diff_history, fingerprint,
                                                 request_events, view_messages)
from ctxkit.log.event_log import MemoryLog


def _recorded(events):
    """The view messages of `events` as a log records them (ids e<seq>-...)."""
    log = MemoryLog()
    return [message_of(e) for e in log.extend(events)]


CALL = ToolCall(id="c1", name="ls", arguments='{"path": "."}')
EVENTS = [
    Message(role="system", content="You are terse."),
    Message(role="user", content="List the files."),
    Step(token_ids=(1, 2), content=None, tool_calls=(CALL,)),
    ToolResult(tool_call_id="c1", name="ls", content="a.txt\nb.txt"),
    Step(token_ids=(3,), content="Two files."),
    Message(role="user", content="Thanks."),
]


@pytest.fixture()
def history():
    return _recorded(EVENTS)


def _wire(history):
    return [m.to_chat() for m in history]


def _request(dicts):
    return view_messages(request_events(dicts))


def _ids(history, *idx):
    return tuple(sorted(history[i].provenance.event_ids[0] for i in idx))


def test_an_extension_gives_no_edit(history):
    wire = _wire(history) + [{"role": "assistant", "content": "You are welcome."}]
    diff = diff_history(history, _request(wire))
    assert (diff.edits, diff.new_from, diff.fallback) == ((), 6, False)


def test_fingerprint_ignores_none_versus_empty_and_json_spacing(history):
    wire = _wire(history)
    wire[2] = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{ "path":"." }'}}]}
    assert [fingerprint(m) for m in _request(wire)] == [fingerprint(m) for m in history]
    assert diff_history(history, _request(wire)).edits == ()


def test_dropped_turns_are_one_drop_edit(history):
    wire = _wire(history)
    request = _request(wire[:2] + wire[4:])  # the call and its result left out
    diff = diff_history(history, request)
    assert diff.edits == (DropEdit(_ids(history, 2, 3)),) and diff.new_from == 4 and not diff.fallback


def test_a_shortened_tool_output_is_a_truncate_edit(history):
    wire = _wire(history)
    wire[3] = {**wire[3], "content": "a.txt [cut]"}
    diff = diff_history(history, _request(wire))
    assert diff.edits == (TruncateEdit(history[3].provenance.event_ids[0], "a.txt [cut]"),)


def test_turns_replaced_by_one_summary_are_a_summary_edit(history):
    wire = _wire(history)
    summary = {"role": "user", "content": "Summary: there are two files."}
    request = _request(wire[:2] + [summary] + wire[5:] + [{"role": "user", "content": "More?"}])
    diff = diff_history(history, request)
    assert diff.edits == (SummaryEdit(_ids(history, 2, 3, 4), "Summary: there are two files.", role="user"),)
    assert diff.new_from == 4 and not diff.fallback


def test_a_message_inserted_between_kept_ones_falls_back_to_drop_and_append(history):
    wire = _wire(history)
    request = _request(wire[:2] + [{"role": "user", "content": "Hint: use ls."}] + wire[2:])
    diff = diff_history(history, request)
    assert diff.fallback and diff.new_from == 2
    assert diff.edits == (DropEdit(_ids(history, 2, 3, 4, 5)),)


def test_a_discarded_last_turn_and_a_new_message_are_a_drop_and_an_append(history):
    """mini-swe-agent drops a reply it rejects for its format and adds its complaint."""
    wire = _wire(history)[:4] + [{"role": "user", "content": "Format error: one bash block, please."}]
    diff = diff_history(history[:5], _request(wire))
    assert (diff.edits, diff.new_from, diff.fallback) == ((DropEdit(_ids(history, 4)),), 4, False)


def test_chain_names_every_prefix():
    digests = chain(["a", "b"])
    assert len(digests) == 3 and len(set(digests)) == 3 and chain(["a"]) == digests[:2]


# ------------------------------------------------------------------------------------------- property

_TEXT = st.sampled_from(["x", "y", "z", "ok", ""])


@st.composite
def _rewrites(draw):
    """A recorded history of user/assistant messages and a harness request built from it by random
    keeps, drops, content changes, summaries and insertions, plus new messages at the end."""
    n = draw(st.integers(1, 8))
    events = [Message(role=draw(st.sampled_from(["user", "assistant"])), content=f"m{i}") for i in range(n)]
    history = _recorded(events)
    wire = _wire(history)
    out, i = [], 0
    while i < n:
        op = draw(st.sampled_from(["keep", "keep", "drop", "change", "summary", "insert"]))
        if op == "keep":
            out.append(wire[i])
        elif op == "change":
            out.append({**wire[i], "content": wire[i]["content"] + draw(_TEXT) + "!"})
        elif op == "summary":
            k = draw(st.integers(1, n - i))
            out.append({"role": "user", "content": "sum " + draw(_TEXT)})
            i += k
            continue
        elif op == "insert":
            out += [{"role": "user", "content": "new " + draw(_TEXT)}, wire[i]]
        i += 1
    out += [{"role": "user", "content": "tail " + draw(_TEXT)} for _ in range(draw(st.integers(0, 2)))]
    return history, out


@settings(max_examples=300, deadline=None)
@given(_rewrites())
def test_the_edits_and_the_appended_tail_give_exactly_the_request(case):
    history, wire = case
    request = _request(wire)
    diff = diff_history(history, request)
    kept = apply_history_edits(history, diff.edits)
    assert [fingerprint(m) for m in kept] + [fingerprint(m) for m in request[diff.new_from:]] == \
        [fingerprint(m) for m in request]
    extends = [fingerprint(m) for m in request[: len(history)]] == [fingerprint(m) for m in history]
    assert (diff.edits == ()) == extends
