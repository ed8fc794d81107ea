"""ViewState's incremental view, hash and pairing scan equal the from-scratch ones (hypothesis, hand-built logs)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkit.edits import DropEdit, MaskEdit, SummaryEdit, TruncateEdit
from ctxkit.errors import LogFormatError
from ctxkit.events import Compaction, EpisodeStart, Message, Pin, Step, ToolCall, ToolResult, Unpin
from ctxkit.context.view import (PairingScan, Provenance, ViewMessage, ViewState, apply_edits, apply_edits_to_list, make_view,
                         pairing_problems)

TOOLS = ({"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}},)
TEXTS = ("keep tests green", "never push", "use tabs", "keep")

OPS = st.lists(
    st.tuples(
        st.sampled_from(["system", "system_calls", "user", "step", "result", "dup_result", "pin", "repin", "unpin",
                         "mask", "drop", "summary"]),
        st.integers(0, 7),
        st.integers(0, 3),
    ),
    max_size=40,
)


def events_of(ops) -> list:
    """A valid event sequence (no orphaned result, edits naming messages in the view) from random ops."""
    evs: list = [EpisodeStart(episode_id="ep", tools=TOOLS)]
    made: list[str] = []  # call ids made so far
    msg_ids: list[str] = []  # ids of message events
    pins: list[str] = []
    n = 0

    def add(e):
        evs.append(dataclasses.replace(e, seq=len(evs), id=f"e{len(evs)}", ts=0.0))
        return evs[-1].id

    for op, a, b in ops:
        text = TEXTS[a % len(TEXTS)]
        if op in ("system", "system_calls"):
            calls = (ToolCall(id=f"s{n}", name="read", arguments="{}"),) if op == "system_calls" else ()
            made += [c.id for c in calls]
            msg_ids.append(add(Message(role="system", content=f"sys {a}: {text if b else ''}", tool_calls=calls)))
        elif op == "user":
            msg_ids.append(add(Message(role="user", content=f"please {text}" if b % 2 else f"hello {a}")))
        elif op == "step":
            calls = tuple(ToolCall(id=f"c{n}_{k}", name="read", arguments='{"p": 1}') for k in range(b))
            made += [c.id for c in calls]
            msg_ids.append(add(Step(token_ids=(1, 2, a), content=f"step {a} {text if b == 3 else ''}", tool_calls=calls)))
        elif op in ("result", "dup_result") and made:
            cid = made[-1 - (a % len(made))] if op == "result" else made[-1]
            msg_ids.append(add(ToolResult(tool_call_id=cid, name="read", content=f"out {a} {text if b == 2 else ''}")))
        elif op in ("pin", "repin"):
            pid = f"p{a % 3}" if op == "pin" else (pins[-1] if pins else "p0")
            pins.append(pid)
            add(Pin(pin_id=pid, text=TEXTS[(a + b) % len(TEXTS)] if op == "pin" else f"other {text}", rule="explicit"))
        elif op == "unpin" and pins:
            add(Unpin(pin_id=pins[a % len(pins)]))
        elif op in ("mask", "drop", "summary"):
            view = ViewState().feed(evs).view()
            single = [m.provenance.event_ids[0] for m in view.messages
                      if m.provenance.how in ("verbatim", "masked", "truncated")]
            if not single:
                continue
            target = single[a % len(single)]
            edit = (MaskEdit(event_id=target, text=f"[masked {target}]") if op == "mask"
                    else DropEdit(event_ids=(target,)) if op == "drop"
                    else SummaryEdit(event_ids=tuple(single[a % len(single): a % len(single) + b + 1]),
                                     text=f"summary {text}"))
            add(Compaction(compressor="test", edits=(edit,)))
        n += 1
    return evs


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_incremental_view_equals_make_view(ops):
    evs = events_of(ops)
    state = ViewState()
    for k, e in enumerate(evs):
        state.feed([e])
        if (k + ops.__len__()) % 3 and k != len(evs) - 1:
            continue  # views read every few events, so the incremental parts cover several events at once
        got = state.view()
        want = make_view(state.messages, state.tools, tuple(state.pins.values()), state.upto_seq)
        assert got == want
        for allow in (True, False):
            assert state.pairing_problems(allow_pending=allow) == pairing_problems(want.messages, allow_pending=allow)
        assert ViewState().feed(evs[: k + 1]).view() == got


@settings(max_examples=100, deadline=None)
@given(OPS, st.lists(st.integers(0, 40), max_size=4))
def test_pairing_scan_in_pieces_equals_one_scan(ops, cuts):
    msgs = ViewState().feed(events_of(ops)).messages
    scan = PairingScan()
    at = 0
    for c in sorted(cuts) + [len(msgs)]:
        c = min(c, len(msgs))
        scan.feed(msgs[at:c])
        at = max(at, c)
    assert scan.n == len(msgs)
    for allow in (True, False):
        assert scan.result(allow_pending=allow) == pairing_problems(msgs, allow_pending=allow)


def test_pinned_block_after_a_system_message_with_calls_keeps_the_full_scan():
    """A pinned block placed after a leading system message that makes calls interrupts them: the
    incremental scan must report what a scan of the view's messages reports."""
    evs = events_of([("system_calls", 0, 0), ("pin", 1, 0), ("result", 0, 0)])
    state = ViewState().feed(evs)
    view = state.view()
    assert [m.provenance.how for m in view.messages] == ["verbatim", "pinned", "verbatim"]
    got = state.pairing_problems()
    assert got == pairing_problems(view.messages)
    assert [p.problem for p in got] == ["unanswered_call", "orphaned_result"]


def reference_edits(messages, edits):
    """apply_edits_to_list as first written (dataclasses.replace, an index rebuilt per edit): the reference."""
    msgs = list(messages)
    for edit in edits:
        if isinstance(edit, (MaskEdit, TruncateEdit)):
            index = {}
            for j, m in enumerate(msgs):
                if len(m.provenance.event_ids) == 1 and m.provenance.how in ("verbatim", "masked", "truncated"):
                    index.setdefault(m.provenance.event_ids[0], j)
            j = index.get(edit.event_id)
            if j is None:
                return None
            how = "masked" if isinstance(edit, MaskEdit) else "truncated"
            msgs[j] = dataclasses.replace(msgs[j], content=edit.text, token_ids=None,
                                          provenance=Provenance(how, (edit.event_id,)))
        else:
            kept = [m for m in msgs if not set(edit.event_ids).intersection(m.provenance.event_ids)]
            if len(kept) == len(msgs):
                return None
            msgs = kept
    return msgs


EDITS = st.lists(st.tuples(st.sampled_from(["mask", "truncate", "drop", "missing"]), st.integers(0, 30),
                           st.sampled_from(["[a]", "[b]"])), max_size=6)


@settings(max_examples=150, deadline=None)
@given(OPS, st.lists(EDITS, min_size=1, max_size=3))
def test_apply_edits_equals_the_reference_through_repeated_candidates(ops, candidates):
    """A compressor tries several candidates on one view: each equals the reference, however the kept base,
    index and edited messages of earlier candidates are re-used."""
    view = ViewState().feed(events_of(ops)).view()
    ids = [m.provenance.event_ids[0] for m in view.messages if m.provenance.event_ids] or ["none"]
    base = [m for m in view.messages if m.provenance.how != "pinned"]
    swapped = [[(op, k, "[b]" if t == "[a]" else "[a]") for op, k, t in spec] for spec in candidates]
    for spec in candidates + swapped + candidates[:1]:
        edits = [MaskEdit(event_id=ids[k % len(ids)], text=t) if op == "mask"
                 else TruncateEdit(event_id=ids[k % len(ids)], text=t) if op == "truncate"
                 else DropEdit(event_ids=(ids[k % len(ids)],)) if op == "drop"
                 else MaskEdit(event_id="no-such-event", text=t) for op, k, t in spec]
        want = reference_edits(base, edits)
        if want is None:
            with pytest.raises(LogFormatError):
                apply_edits(view, edits)
            continue
        got = apply_edits(view, edits)
        assert got == make_view(want, view.tools, view.active_pins, view.upto_seq)
        assert apply_edits_to_list(base, edits, where="test") == want


def test_a_mask_edits_the_first_message_of_its_event():
    """Two messages standing for one event (hand-built view): a mask edits the first, as it always did."""
    a = ViewMessage(role="user", content="first", provenance=Provenance("verbatim", ("e1",)))
    b = ViewMessage(role="user", content="second", provenance=Provenance("verbatim", ("e1",)))
    c = ViewMessage(role="user", content="both", provenance=Provenance("summary", ("e1", "e2")))
    view = make_view([c, a, b], (), (), None)
    out = apply_edits(view, [MaskEdit(event_id="e1", text="[masked]")])
    assert [m.content for m in out.messages] == ["both", "[masked]", "second"]
    assert [m.content for m in apply_edits_to_list([c, a, b], [TruncateEdit(event_id="e1", text="[t]")], where="t")] == [
        "both", "[t]", "second"]
