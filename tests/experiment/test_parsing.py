"""Parsing sampled assistant turns into content, reasoning and hermes-style tool calls."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkit.events import ToolCall
from ctxkit.experiment.agents.parsing import (
    CALL_ID_LENGTH,
    ParsedTurn,
    ToolCallParseError,
    cut_at_end_of_turn,
    make_call_id,
    parse_call_json,
    parse_ids,
    parse_text,
)

from conftest import tokenizer_dir


def _ids(seed: str, n: int) -> list[str]:
    return [make_call_id(seed, i) for i in range(n)]


def test_single_call_keeps_arguments_verbatim():
    text = '<tool_call>\n{"name": "read_file", "arguments": {"path":  "a.txt", "lines": [1,2]}}\n</tool_call>'
    turn = parse_text(text, call_id_seed="ctx")
    assert turn == ParsedTurn(
        content=None,
        tool_calls=(ToolCall(id=make_call_id("ctx", 0), name="read_file", arguments='{"path":  "a.txt", "lines": [1,2]}'),),
        errors=(),
        reasoning_content=None,
        text=text,
    )
    assert turn.ok


def test_several_calls_with_text_before_and_between():
    text = (
        "Let me look.\n<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}\n</tool_call>\n"
        "then\n<tool_call>\n{\"arguments\": {\"x\": 1.5}, \"name\": \"calc\"}\n</tool_call>"
    )
    turn = parse_text(text, call_id_seed="s")
    a, b = _ids("s", 2)
    assert turn.tool_calls == (ToolCall(a, "ls", "{}"), ToolCall(b, "calc", '{"x": 1.5}'))
    assert turn.content == "Let me look.\n\nthen"
    assert turn.errors == ()


def test_malformed_json_is_a_counted_failure_and_stays_in_content():
    bad = '\n{"name": "calc", "arguments": {"x": 1,}}\n'
    text = f'<tool_call>{bad}</tool_call>\n<tool_call>\n{{"name": "ls", "arguments": {{}}}}\n</tool_call>'
    turn = parse_text(text, call_id_seed="s")
    assert not turn.ok
    assert turn.errors == (ToolCallParseError(0, "invalid JSON at char 38: Expecting property name enclosed in double quotes", bad),)
    # the good call keeps its own block index (1) in its id
    assert turn.tool_calls == (ToolCall(make_call_id("s", 1), "ls", "{}"),)
    assert turn.content == f"<tool_call>{bad}</tool_call>"


@pytest.mark.parametrize(
    "body, reason",
    [
        ('{"arguments": {}}', "missing or non-string 'name'"),
        ('{"name": 3, "arguments": {}}', "missing or non-string 'name'"),
        ('{"name": "", "arguments": {}}', "missing or non-string 'name'"),
        ('{"name": "f", "arguments": [1]}', "'arguments' must be an object, got list"),
        ('{"name": "f", "arguments": "{\\"a\\": "}', "'arguments' string is not JSON: Expecting value at char 6"),
        ('{"name": "f", "arguments": "[1]"}', "'arguments' string does not hold a JSON object"),
        ('{"name": "f", "name": "g"}', "duplicate key 'name'"),
        ('{"name": "f"} trailing', "invalid JSON at char 14: extra text after the object"),
        ('["f", {}]', "tool call is not a JSON object"),
        ('{"name" "f"}', "invalid JSON at char 8: expected ':'"),
        ('{name: "f"}', "invalid JSON at char 1: expected a key string"),
        ('{"name": "f" "arguments": {}}', "invalid JSON at char 13: expected ',' or '}'"),
        ('{"name": "f", "arguments": {"a": tru}}', "invalid JSON at char 33: Expecting value"),
        ("", "tool call is not a JSON object"),
    ],
)
def test_parse_call_json_reasons(body, reason):
    assert parse_call_json(body) == reason


def test_parse_call_json_accepted_shapes():
    assert parse_call_json('{"name": "f"}') == ("f", "{}")
    assert parse_call_json('  {"name":"f","arguments":{"a":{"b":[1, "}"]}}}  ') == ("f", '{"a":{"b":[1, "}"]}}')
    # arguments written as a JSON string holding an object: the decoded string is the JSON text
    assert parse_call_json('{"name": "f", "arguments": "{\\"a\\": 1}"}') == ("f", '{"a": 1}')
    assert parse_call_json('{"name": "f", "arguments": {}, "id": "x"}') == ("f", "{}")


def test_unclosed_block():
    text = 'ok <tool_call>\n{"name": "f", "arguments": {"a": 1'
    turn = parse_text(text)
    assert turn.tool_calls == ()
    assert turn.errors == (ToolCallParseError(0, "unclosed <tool_call> block (no </tool_call>)", '\n{"name": "f", "arguments": {"a": 1'),)
    assert turn.content == text


def test_nested_open_tag_is_an_error():
    text = '<tool_call>\n{"name": "f"\n<tool_call>\n{"name": "g"}\n</tool_call>'
    turn = parse_text(text)
    assert [e.reason for e in turn.errors] == ["<tool_call> opened again before </tool_call>"]
    assert turn.tool_calls == ()
    assert turn.content == text


def test_reasoning_block():
    text = '<think>\nneed the file\n</think>\n\n<tool_call>\n{"name": "cat", "arguments": {"p": "x"}}\n</tool_call>'
    turn = parse_text(text, call_id_seed="r")
    assert turn.reasoning_content == "need the file"
    assert turn.content is None
    assert turn.tool_calls == (ToolCall(make_call_id("r", 0), "cat", '{"p": "x"}'),)
    # an unclosed think block (cut by max tokens) is all reasoning
    assert parse_text("<think> still thinking").reasoning_content == "still thinking"
    assert parse_text("<think> still thinking").content is None
    # <think> not at the start is plain content
    assert parse_text("a <think>b</think>").content == "a <think>b</think>"


def test_plain_text_and_empty():
    assert parse_text("  The answer is 42.\n").content == "The answer is 42."
    empty = parse_text("")
    assert (empty.content, empty.tool_calls, empty.errors, empty.reasoning_content) == (None, (), (), None)


def test_call_ids_are_deterministic_nine_alphanumerics():
    ids = {make_call_id(seed, i) for seed in ("a", "b") for i in range(50)}
    assert len(ids) == 100
    for cid in ids:
        assert len(cid) == CALL_ID_LENGTH and cid.isalnum() and cid.isascii()
    assert make_call_id("a", 3) == make_call_id("a", 3)
    assert make_call_id("ctx", 0) == "blY2kfjlw"


def test_cut_at_end_of_turn():
    assert cut_at_end_of_turn([5, 6, 2, 7, 2], [2]) == ((5, 6, 2), True)
    assert cut_at_end_of_turn([5, 6], [2, 0]) == ((5, 6), False)
    assert cut_at_end_of_turn([0], [2, 0]) == ((0,), True)
    assert cut_at_end_of_turn([], [2]) == ((), False)


def test_parse_ids_with_the_real_smollm2_tokenizer():
    from ctxkit.text.tokenizer.loader import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir("smollm2-135m-instruct")))
    eot = tok.special_tokens["<|im_end|>"]
    body = 'Checking.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "notes.txt"}}\n</tool_call>'
    ids = tok.encode(body) + [eot] + tok.encode("garbage after the end")
    turn = parse_ids(ids, lambda xs: tok.decode(xs), end_ids=[eot], call_id_seed="h")
    assert turn.stopped
    assert turn.token_ids == tuple(tok.encode(body) + [eot])
    assert turn.text == body
    assert turn.content == "Checking."
    assert turn.tool_calls == (ToolCall(make_call_id("h", 0), "read_file", '{"path": "notes.txt"}'),)
    cut = parse_ids(tok.encode(body)[:-3], lambda xs: tok.decode(xs), end_ids=[eot])
    assert not cut.stopped and cut.tool_calls == () and len(cut.errors) == 1
    assert cut.errors[0].reason == "unclosed <tool_call> block (no </tool_call>)"


def test_round_trip_through_the_chatml_tools_template():
    """What the project's own template renders for a tool-calling turn parses back to the same calls."""
    from ctxkit.text.template.chat_template import load_template
    from ctxkit.text.tokenizer.loader import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))
    tpl = load_template("chatml-tools-v1", tok)
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}},
        {"id": "c2", "type": "function", "function": {"name": "mul", "arguments": '{"a": 12, "b": 7}'}},
    ]
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Two calls.", "tool_calls": calls},
    ]
    text = tpl.render_text(msgs)
    start = text.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    ids = tok.encode(text[start:])
    turn = parse_ids(ids, lambda xs: tok.decode(xs), end_ids=[tok.special_tokens["<|im_end|>"]], call_id_seed="x")
    assert turn.stopped
    assert turn.content == "Two calls."
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("read_file", '{"path": "a.txt"}'), ("mul", '{"a": 12, "b": 7}')]


_names = st.text(alphabet=string.ascii_letters + "_", min_size=1, max_size=12)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_args = st.dictionaries(st.text(max_size=6), _json_values, max_size=4)
_prose = st.text(alphabet=string.ascii_letters + " .,\n", max_size=30)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_names, _args, st.sampled_from([None, 2]), st.booleans()), max_size=4), _prose)
def test_property_rendered_calls_parse_back(calls, prose):
    """Any calls rendered in the hermes format (compact or indented JSON) parse back exactly."""
    parts = [prose]
    for name, args, indent, ascii_only in calls:
        args_text = json.dumps(args, indent=indent, ensure_ascii=ascii_only)
        parts.append('<tool_call>\n{"name": %s, "arguments": %s}\n</tool_call>' % (json.dumps(name), args_text))
    turn = parse_text("\n".join(parts), call_id_seed="p")
    assert turn.errors == ()
    assert [c.name for c in turn.tool_calls] == [c[0] for c in calls]
    assert [json.loads(c.arguments) for c in turn.tool_calls] == [c[1] for c in calls]
    assert [c.arguments for c in turn.tool_calls] == [json.dumps(c[1], indent=c[2], ensure_ascii=c[3]) for c in calls]
    assert turn.content == (prose.strip() or None)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list('{}[]":, \nab1') + ["<tool_call>", "</tool_call>", "<think>", "</think>", '"name"', '"arguments"']), max_size=40).map("".join))
def test_property_never_raises_and_every_block_is_accounted_for(text):
    turn = parse_text(text)
    blocks = len(turn.tool_calls) + len(turn.errors)
    assert blocks <= text.count("<tool_call>")
    for call in turn.tool_calls:
        assert isinstance(json.loads(call.arguments), dict)


def test_two_turns_on_the_same_view_get_distinct_call_ids():
    # a compressor can show the same context at two steps (same hash); the step's sampling seed keeps the two
    # turns' call ids apart, so a tool result answers exactly one call (`ctxkit audit`'s resume check)
    from ctxkit.experiment.agents.parsing import turn_call_seed

    text = '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>'
    first = parse_text(text, call_id_seed=turn_call_seed("samehash", 11)).tool_calls[0].id
    second = parse_text(text, call_id_seed=turn_call_seed("samehash", 12)).tool_calls[0].id
    again = parse_text(text, call_id_seed=turn_call_seed("samehash", 11)).tool_calls[0].id
    assert first != second and first == again and len(first) == 9
