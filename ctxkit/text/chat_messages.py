"""Validation of OpenAI-format chat messages before rendering.

Roles are system | user | assistant | tool; content follows the one content rule of `ctxkit.content` (a
string, None or a list of text parts, flattened to its text before the template sees it); a tool result
must answer an earlier tool call (`ToolPairingError`, problem `orphaned_result`); only assistant messages
may carry sampled `token_ids`.
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from ctxkit.content import check_content, flatten_content
from ctxkit.errors import MessageFormatError, ToolPairingError
from ctxkit.events import ROLES



def message_text(content: Any) -> str:
    """The text of a message's content (`ctxkit.content.flatten_content`)."""
    return flatten_content(content)


def validate_message(
    message: Any, index: int, call_ids: set[str], vocab_size: int, *, form_checked: bool = False
) -> tuple[dict, tuple[int, ...] | None]:
    """Check one OpenAI message (the `index`-th); return it without `token_ids`, and the sampled ids if any.

    `call_ids` collects the ids of tool calls made so far (updated in place); a tool result must answer one.
    `form_checked`: the message's form (a dict, its role, content and tool calls) was checked where it entered,
    as for a view's messages, whose events checked it when they were made (`ctxkit.events`); only what depends
    on the tokenizer (sampled ids within its vocabulary) and on the messages before it (pairing) is checked.
    Errors are `MessageFormatError`s naming the message index."""
    where = f"message {index}"
    if not form_checked:
        check_message_form(message, where)
    role = message["role"]
    clean = {k: v for k, v in message.items() if k != "token_ids"}
    content = message.get("content")
    if isinstance(content, (list, tuple)):
        clean["content"] = flatten_content(content, where)  # the one content rule: the template sees text
    sampled = None
    if "token_ids" in message and message["token_ids"] is not None:
        if role != "assistant":
            raise MessageFormatError(f"{where}: only assistant messages may carry token_ids (role is {role!r})")
        ids = message["token_ids"]
        if not isinstance(ids, (list, tuple)) or not _valid_ids(ids, vocab_size):
            raise MessageFormatError(f"{where}: token_ids must be a list of ids in [0, {vocab_size})")
        sampled = tuple(ids)
    if role == "assistant" and message.get("tool_calls") is not None:
        for j, call in enumerate(message["tool_calls"]):
            call_ids.add(str(call["id"]) if call.get("id") is not None else f"#anonymous{index}.{j}")
    if role == "tool":
        _check_answers_a_call(message.get("tool_call_id"), call_ids, where)
    return clean, sampled


def check_message_form(message: Any, where: str) -> None:
    """A `MessageFormatError` naming `where` unless `message` is a dict with a known role, content following
    the content rule, and tool calls that each name a function and carry JSON arguments (text that parses,
    or an object)."""
    if not isinstance(message, Mapping):
        raise MessageFormatError(f"{where}: expected a dict, got {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise MessageFormatError(f"{where}: unknown role {role!r} (expected one of {list(ROLES)})")
    check_content(message.get("content"), where)
    if role == "assistant" and message.get("tool_calls") is not None:
        calls = message["tool_calls"]
        if not isinstance(calls, (list, tuple)):
            raise MessageFormatError(f"{where}: tool_calls must be a list, got {type(calls).__name__}")
        for j, call in enumerate(calls):
            fn = call.get("function", call) if isinstance(call, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise MessageFormatError(f"{where}: tool call {j} has no function name")
            check_arguments(fn.get("arguments", {}), f"{where}: tool call {j} ({fn['name']})")


def check_arguments(arguments: Any, where: str) -> None:
    """A `MessageFormatError` naming `where` unless a tool call's `arguments` is an object or JSON text."""
    if isinstance(arguments, Mapping):
        return
    if not isinstance(arguments, str):
        raise MessageFormatError(f"{where}: arguments must be a JSON string or an object, got {type(arguments).__name__}")
    try:
        orjson.loads(arguments)
    except orjson.JSONDecodeError as err:
        raise MessageFormatError(f"{where}: arguments are not JSON ({err}): {arguments[:80]!r}") from None


def _check_answers_a_call(call_id: Any, call_ids: set[str], where: str) -> None:
    """A `ToolPairingError` (problem `orphaned_result`) unless the tool result answers a call made before."""
    if call_id is not None:
        if str(call_id) not in call_ids:
            raise ToolPairingError(
                f"{where}: tool result answers tool_call_id {call_id!r}, but no earlier assistant message made "
                "that call (orphaned result)", problem="orphaned_result", event=where, call_id=str(call_id))
    elif not call_ids:
        raise ToolPairingError(f"{where}: tool result without a tool_call_id and no earlier tool call (orphaned result)",
                               problem="orphaned_result", event=where)


def _valid_ids(ids: list | tuple, vocab_size: int) -> bool:
    """Every item an int (not a bool) in [0, vocab_size); plain ints are checked at C speed."""
    if not ids:
        return True
    if set(map(type, ids)) == {int}:
        return min(ids) >= 0 and max(ids) < vocab_size
    return all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in ids)
