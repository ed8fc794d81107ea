"""render_segments.message_key (fast paths for str/None leaves, extra keys as a set difference) gives the key the
plain recursive rule gives (hypothesis over chat-shaped messages)."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkit.text.rendering.segments import message_key

KNOWN = frozenset({"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content", "token_ids"})


def freeze(value):
    if isinstance(value, Mapping):
        return tuple((k, freeze(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ("__list__",) + tuple(freeze(v) for v in value)
    hash(value)
    return value


def reference(message):
    try:
        calls = message.get("tool_calls")
        call_key = None if calls is None else tuple(
            (c.get("id"), c.get("type"), freeze(c.get("function"))) for c in calls)
        return (message.get("role"), freeze(message.get("content")), call_key, message.get("tool_call_id"),
                message.get("name"), message.get("reasoning_content"),
                None if message.get("token_ids") is None else tuple(message["token_ids"]),
                tuple(sorted(k for k in message if k not in KNOWN)) or None)
    except (TypeError, AttributeError):
        return None


class Str(str):
    """A str subclass (takes the general path)."""


LEAF = st.one_of(st.text(max_size=5), st.text(max_size=3).map(Str), st.none(), st.integers(), st.booleans(),
                 st.floats(allow_nan=False))
VALUE = st.recursive(LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.text(max_size=3), inner, max_size=3),
                                                   st.sets(st.integers(), max_size=2)), max_leaves=8)
CALL = st.fixed_dictionaries({"id": st.one_of(st.none(), st.text(max_size=3)), "type": st.just("function"),
                              "function": st.fixed_dictionaries({"name": st.text(max_size=4), "arguments": VALUE})})
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system"]), "content": VALUE},
    optional={"tool_calls": st.lists(CALL, max_size=2), "tool_call_id": st.text(max_size=3), "name": st.text(max_size=3),
              "token_ids": st.lists(st.integers(0, 99), max_size=5), "extra": VALUE, "other": st.integers()})


@settings(max_examples=400, deadline=None)
@given(MESSAGE)
def test_message_key_equals_the_plain_rule(message):
    assert message_key(message) == reference(message)
