"""chat_messages.validate_message: the sampled-ids check (fast path for plain ints) accepts exactly what the
item-by-item rule accepts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkit.text.chat_messages import validate_message
from ctxkit.errors import MessageFormatError

VOCAB = 1000


class MyInt(int):
    """An int subclass: accepted like an int."""


ITEMS = st.one_of(st.integers(-3, VOCAB + 3), st.booleans(), st.integers(0, VOCAB - 1).map(MyInt),
                  st.floats(0, 10), st.text(max_size=2), st.none())


def item_by_item(ids) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < VOCAB for t in ids)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(st.integers(0, VOCAB - 1), max_size=30), st.lists(ITEMS, max_size=8)), st.booleans())
def test_token_ids_accepted_exactly_by_the_item_rule(ids, as_tuple):
    ids = tuple(ids) if as_tuple else ids
    message = {"role": "assistant", "content": "hi", "token_ids": ids}
    if item_by_item(ids):
        clean, sampled = validate_message(message, 4, set(), VOCAB)
        assert sampled == tuple(ids) and "token_ids" not in clean
    else:
        with pytest.raises(MessageFormatError, match=r"message 4: token_ids must be a list of ids in \[0, 1000\)"):
            validate_message(message, 4, set(), VOCAB)


@pytest.mark.parametrize("ids", [[True], [0, 1, VOCAB], [-1], [1.0], "12", {1: 2}])
def test_bad_token_ids_are_refused(ids):
    with pytest.raises(MessageFormatError, match="token_ids must be a list of ids"):
        validate_message({"role": "assistant", "content": "", "token_ids": ids}, 0, set(), VOCAB)


# ------------------------------------------------------------------- one form, checked where it enters


def _call_messages(arguments):
    return [{"role": "user", "content": "Read notes."},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "Ship on Friday."}]


@pytest.mark.parametrize("arguments", ['{"path": "notes.txt"', "path=notes.txt", ""])
def test_render_refuses_arguments_that_are_not_json(tok, arguments):
    from ctxkit.text.rendering.renderer import render
    with pytest.raises(MessageFormatError, match=r"^message 1: tool call 0 \(read_file\): arguments are not JSON"):
        render(_call_messages(arguments), tok)


@pytest.mark.parametrize("arguments", ['{"path": "notes.txt"}', {"path": "notes.txt"}, "[]", "3"])
def test_render_accepts_json_arguments(tok, arguments):
    from ctxkit.text.rendering.renderer import render
    assert render(_call_messages(arguments), tok).token_ids


def test_form_is_checked_for_raw_dicts_and_not_again_for_a_view(tok, monkeypatch):
    """`render()` of raw dicts checks each message's form; a builder's view messages were checked when
    their events were made, so building never calls the form check (fault injection: it raises)."""
    import ctxkit.text.chat_messages as chat_messages
    from ctxkit.context.builder import ContextBuilder
    from ctxkit.events import EpisodeStart, Message, Step, ToolCall, ToolResult
    from ctxkit.log.event_log import MemoryLog
    from ctxkit.text.rendering.renderer import render

    calls = []
    real = chat_messages.check_message_form
    monkeypatch.setattr(chat_messages, "check_message_form", lambda m, where: calls.append(where) or real(m, where))
    render(_call_messages("{}"), tok)
    assert calls == ["message 0", "message 1", "message 2"]

    def refuse(message, where):
        raise AssertionError(f"form checked again at {where}")

    monkeypatch.setattr(chat_messages, "check_message_form", refuse)
    log = MemoryLog()
    log.extend([EpisodeStart(episode_id="e", tools=()), Message(role="user", content="Read notes."),
                Step(content="", tool_calls=(ToolCall("c1", "read_file", '{"path": "notes.txt"'),)),
                ToolResult(tool_call_id="c1", content="Ship on Friday.")])
    built = ContextBuilder(tok).build(log)  # recorded arguments that are not JSON are kept, rendered as text
    assert '"arguments": "{\\"path\\": \\"notes.txt\\""}' in tok.decode(list(built.token_ids))  # Qwen2.5: tojson
