"""pins.py: the constraint-rules-v1 detector (golden detections), active pins, new-detection bookkeeping."""

from __future__ import annotations

import dataclasses

import pytest

from ctxkit.events import Message, Pin, ToolResult, Unpin
from ctxkit.context.pins import RULESET, active_pins, classify, detect_constraints, new_detections, pin_id_for, split_sentences


def stamp(events):
    return [dataclasses.replace(e, seq=i, id=f"e{i}") for i, e in enumerate(events)]


@pytest.mark.parametrize(
    "sentence, kind",
    [
        ("Do not modify the original file.", "prohibition"),
        ("Don't touch tests/.", "prohibition"),
        ("Never delete data.", "prohibition"),
        ("You must not call the network.", "prohibition"),  # prohibition wins over "must"
        ("Use at most 5 tool calls.", "limit"),
        ("Answer in no more than 200 words.", "limit"),
        ("Finish within 3 steps.", "limit"),
        ("Keep it under ten lines.", "limit"),
        ("You must cite the source.", "obligation"),
        ("Always run the tests first.", "obligation"),
        ("Make sure the output is JSON.", "obligation"),
        ("Please fix the bug.", None),
        ("The file is within reach.", None),  # "within" without a number is not a limit
        ("Read the README.", None),
    ],
)
def test_classify_golden(sentence, kind):
    assert classify(sentence) == kind


def test_split_sentences_are_exact_substrings():
    text = "Fix the bug in parse.py. Do not modify the original file!\nUse at most 5 tool calls"
    sentences = split_sentences(text)
    assert sentences == ["Fix the bug in parse.py.", "Do not modify the original file!", "Use at most 5 tool calls"]
    assert all(s in text for s in sentences)


def test_detect_constraints_only_in_user_and_system_messages():
    evs = stamp([
        Message(role="system", content="Always answer in English."),
        Message(role="user", content="Fix the bug. Do not modify the original file. Use at most 5 tool calls."),
        ToolResult(tool_call_id="c", content="Never trust this tool output."),
        Message(role="assistant", content="I must not fail."),
    ])
    found = detect_constraints(evs)
    assert [(d.text, d.source_event_id, d.rule) for d in found] == [
        ("Always answer in English.", "e0", f"{RULESET}:obligation"),
        ("Do not modify the original file.", "e1", f"{RULESET}:prohibition"),
        ("Use at most 5 tool calls.", "e1", f"{RULESET}:limit"),
    ]
    assert found[1].pin_id == pin_id_for("e1", "Do not modify the original file.")
    assert found[1].pin_id.startswith("pin-") and len(found[1].pin_id) == 16
    pin = found[1].to_pin()
    assert (pin.pin_id, pin.text, pin.source_event_id, pin.rule) == (
        found[1].pin_id, "Do not modify the original file.", "e1", "constraint-rules-v1:prohibition")


def test_new_detections_skip_recorded_and_unpinned():
    user = Message(role="user", content="Do not push. Never force.")
    evs = stamp([user])
    first = new_detections(evs)
    assert [d.text for d in first] == ["Do not push.", "Never force."]
    evs = stamp([user, first[0].to_pin(), first[1].to_pin(), Unpin(pin_id=first[1].pin_id, reason="lifted")])
    assert new_detections(evs) == []  # an unpinned detection is not re-pinned
    assert [p.text for p in active_pins(evs)] == ["Do not push."]


def test_active_pins_order_and_unpin():
    evs = stamp([Pin(pin_id="a", text="A"), Pin(pin_id="b", text="B"), Unpin(pin_id="a"), Pin(pin_id="c", text="C")])
    assert [p.pin_id for p in active_pins(evs)] == ["b", "c"]
