"""Turn a sampled assistant turn (token ids or text) into content, reasoning and tool calls.

The format is the hermes / Qwen / ChatML-tools one the `chatml-tools` templates render:

    some text
    <tool_call>
    {"name": "read_file", "arguments": {"path": "a.txt"}}
    </tool_call>
    <tool_call>
    {"name": "ls", "arguments": {}}
    </tool_call><|im_end|>

A leading `<think>...</think>` block (Qwen3) becomes `reasoning_content`. Tool-call arguments are kept as
the exact JSON text the model wrote (never re-serialized). A malformed call (bad JSON, no name, a block
that never closes) is returned as a `ToolCallParseError` in `ParsedTurn.errors`, never raised, so the
runner can count it and the episode goes on; its text stays in `content`, so
`len(parse_text(turn.content or "").errors)` counts a recorded turn's malformed calls again later.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from ctxkit.events import ToolCall

TOOL_CALL_OPEN = "<tool_call>"
"""Opening tag of one tool call."""
TOOL_CALL_CLOSE = "</tool_call>"
"""Closing tag of one tool call."""
THINK_OPEN = "<think>"
"""Opening tag of a reasoning block."""
THINK_CLOSE = "</think>"
"""Closing tag of a reasoning block."""

END_OF_TURN_TOKENS: tuple[str, ...] = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>", "<|end|>")
"""Token strings that end an assistant turn, where a tokenizer has them as special tokens."""

_CALL_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
CALL_ID_LENGTH = 9
"""Length of generated call ids: 9 alphanumerics, which Mistral's template also accepts."""

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


@dataclass(frozen=True)
class ToolCallParseError:
    """One tool-call block that could not be parsed (counted by the runner, not raised)."""

    index: int
    """0-based position of the block among the turn's `<tool_call>` blocks."""
    reason: str
    """What was wrong, e.g. `invalid JSON at char 12: Expecting ',' delimiter`."""
    text: str
    """The raw text between the tags (or after the opening tag for an unclosed block)."""


@dataclass(frozen=True)
class ParsedTurn:
    """A sampled assistant turn split into the parts a message has."""

    content: str | None
    """Text outside the reasoning block and the well-formed tool-call blocks, stripped; None when empty.
    A malformed block stays in the content verbatim (tags included), so nothing the model wrote is lost."""
    tool_calls: tuple[ToolCall, ...]
    """Well-formed tool calls, in order."""
    errors: tuple[ToolCallParseError, ...]
    """Malformed tool-call blocks, in order."""
    reasoning_content: str | None = None
    """Text of a leading `<think>` block, stripped; None when there is none."""
    token_ids: tuple[int, ...] = ()
    """The ids kept: everything up to and including the first end-of-turn id (all of them if none)."""
    stopped: bool = False
    """True when an end-of-turn id ended the turn."""
    text: str = ""
    """The decoded text parsed (end-of-turn token excluded)."""

    @property
    def ok(self) -> bool:
        """True when every tool-call block parsed."""
        return not self.errors


def turn_call_seed(context_hash: str, seed: int) -> str:
    """The call-id seed of one turn: its context's hash and its sampling seed. The hash alone repeats when a
    compressor shows the same view at two steps, and the ids of the two turns' calls would collide."""
    return f"{context_hash}:{int(seed)}"


def make_call_id(seed: str, index: int) -> str:
    """A deterministic 9-character alphanumeric call id from a seed (e.g. the context hash) and an index."""
    digest = int.from_bytes(hashlib.sha256(f"{seed}\x00{index}".encode()).digest()[:16], "big")
    chars = []
    for _ in range(CALL_ID_LENGTH):
        digest, r = divmod(digest, len(_CALL_ID_ALPHABET))
        chars.append(_CALL_ID_ALPHABET[r])
    return "".join(chars)


def end_of_turn_ids(tokenizer: Any) -> tuple[int, ...]:
    """Sorted ids ending a turn for a `ctxkit.text.tokenizer.loader.Tokenizer`: its eos plus the known end-of-turn specials."""
    specials = dict(tokenizer.special_tokens)
    ids = {int(specials[t]) for t in END_OF_TURN_TOKENS if t in specials}
    eos = getattr(tokenizer, "eos_token", None)
    if eos is not None and eos in specials:
        ids.add(int(specials[eos]))
    return tuple(sorted(ids))


def cut_at_end_of_turn(token_ids: Iterable[int], end_ids: Iterable[int]) -> tuple[tuple[int, ...], bool]:
    """Ids up to and including the first end-of-turn id, and whether one was found."""
    ids = tuple(int(t) for t in token_ids)
    ends = set(int(e) for e in end_ids)
    for i, tok in enumerate(ids):
        if tok in ends:
            return ids[: i + 1], True
    return ids, False


def parse_ids(
    token_ids: Sequence[int],
    decode: Callable[[Sequence[int]], str],
    *,
    end_ids: Iterable[int],
    call_id_seed: str = "",
) -> ParsedTurn:
    """Parse sampled ids: cut at the first end-of-turn id, decode the rest (special tokens kept), parse.

    `decode` maps ids to text without skipping special tokens (e.g. `lambda ids: tok.decode(ids)`);
    `call_id_seed` makes the generated call ids unique per turn (pass the context hash).
    """
    kept, stopped = cut_at_end_of_turn(token_ids, end_ids)
    body = kept[:-1] if stopped else kept
    text = decode(list(body)) if body else ""
    parsed = parse_text(text, call_id_seed=call_id_seed)
    return ParsedTurn(
        content=parsed.content,
        tool_calls=parsed.tool_calls,
        errors=parsed.errors,
        reasoning_content=parsed.reasoning_content,
        token_ids=kept,
        stopped=stopped,
        text=text,
    )


def parse_text(text: str, *, call_id_seed: str = "") -> ParsedTurn:
    """Parse the decoded text of one assistant turn (already cut before its end-of-turn token)."""
    reasoning, rest = _split_reasoning(text)
    pieces: list[str] = []
    calls: list[ToolCall] = []
    errors: list[ToolCallParseError] = []
    pos = 0
    index = 0
    while True:
        start = rest.find(TOOL_CALL_OPEN, pos)
        if start < 0:
            pieces.append(rest[pos:])
            break
        pieces.append(rest[pos:start])
        body_start = start + len(TOOL_CALL_OPEN)
        end = rest.find(TOOL_CALL_CLOSE, body_start)
        if end < 0:
            errors.append(ToolCallParseError(index, "unclosed <tool_call> block (no </tool_call>)", rest[body_start:]))
            pieces.append(rest[start:])
            break
        body = rest[body_start:end]
        if TOOL_CALL_OPEN in body:
            errors.append(ToolCallParseError(index, "<tool_call> opened again before </tool_call>", body))
            pieces.append(rest[start : end + len(TOOL_CALL_CLOSE)])
        else:
            result = parse_call_json(body)
            if isinstance(result, str):
                errors.append(ToolCallParseError(index, result, body))
                pieces.append(rest[start : end + len(TOOL_CALL_CLOSE)])
            else:
                name, arguments = result
                calls.append(ToolCall(id=make_call_id(call_id_seed, index), name=name, arguments=arguments))
        index += 1
        pos = end + len(TOOL_CALL_CLOSE)
    content = "".join(pieces).strip() or None
    return ParsedTurn(
        content=content,
        tool_calls=tuple(calls),
        errors=tuple(errors),
        reasoning_content=reasoning,
        text=text,
    )


def parse_call_json(body: str) -> tuple[str, str] | str:
    """Parse one call body `{"name": ..., "arguments": {...}}` -> (name, arguments JSON text), or a reason.

    Positions in a reason count characters of the body with surrounding whitespace stripped.

    `arguments` is the verbatim text of the value when it is an object; when the model wrote it as a
    JSON string holding an object, the decoded string. A missing `arguments` means `{}`.
    """
    s = body.strip(_WS)
    if not s.startswith("{"):
        return "tool call is not a JSON object"
    spans: dict[str, tuple[int, int]] = {}
    values: dict[str, object] = {}
    i = _skip_ws(s, 1)
    if i < len(s) and s[i] == "}":
        i += 1
    else:
        while True:
            if i >= len(s) or s[i] != '"':
                return f"invalid JSON at char {i}: expected a key string"
            try:
                key, i = _DECODER.raw_decode(s, i)
            except json.JSONDecodeError as exc:
                return f"invalid JSON at char {exc.pos}: {exc.msg}"
            i = _skip_ws(s, i)
            if i >= len(s) or s[i] != ":":
                return f"invalid JSON at char {i}: expected ':'"
            i = _skip_ws(s, i + 1)
            try:
                value, end = _DECODER.raw_decode(s, i)
            except json.JSONDecodeError as exc:
                return f"invalid JSON at char {exc.pos}: {exc.msg}"
            if key in values:
                return f"duplicate key {key!r}"
            values[key] = value
            spans[key] = (i, end)
            i = _skip_ws(s, end)
            if i < len(s) and s[i] == ",":
                i = _skip_ws(s, i + 1)
                continue
            if i < len(s) and s[i] == "}":
                i += 1
                break
            return f"invalid JSON at char {i}: expected ',' or '}}'"
    i = _skip_ws(s, i)
    if i != len(s):
        return f"invalid JSON at char {i}: extra text after the object"
    name = values.get("name")
    if not isinstance(name, str) or not name:
        return "missing or non-string 'name'"
    if "arguments" not in values:
        return name, "{}"
    args = values["arguments"]
    if isinstance(args, dict):
        a, b = spans["arguments"]
        return name, s[a:b]
    if isinstance(args, str):
        try:
            decoded = json.loads(args)
        except json.JSONDecodeError as exc:
            return f"'arguments' string is not JSON: {exc.msg} at char {exc.pos}"
        if not isinstance(decoded, dict):
            return "'arguments' string does not hold a JSON object"
        return name, args
    return f"'arguments' must be an object, got {type(args).__name__}"


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _split_reasoning(text: str) -> tuple[str | None, str]:
    """Split a leading `<think>...</think>` block off the text."""
    stripped = text.lstrip(_WS)
    if not stripped.startswith(THINK_OPEN):
        return None, text
    close = stripped.find(THINK_CLOSE)
    if close < 0:
        return stripped[len(THINK_OPEN):].strip() or None, ""
    reasoning = stripped[len(THINK_OPEN):close].strip() or None
    return reasoning, stripped[close + len(THINK_CLOSE):]
