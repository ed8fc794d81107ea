"""The harness's history against what the gateway recorded: fingerprints, and a rewrite as compaction edits.

A harness re-sends its whole history on every call. The gateway keeps, per episode, the history as the
harness should send it next (`ViewMessage`s whose provenance names the recorded events). A request whose
messages start with that history, fingerprint for fingerprint, only appends (`diff_history` gives no
edits). Anything else is a harness-side compaction: the harness dropped, shortened or summarized earlier
messages. It is recorded as typed edits (`ctxkit.edits`) computed from a message alignment
(`difflib.SequenceMatcher` over the fingerprints):

| the harness ...                                          | edit            |
|----------------------------------------------------------|-----------------|
| left messages out                                        | `DropEdit`      |
| changed one message's content (same role, calls, call id) | `TruncateEdit` |
| put one user/assistant/system message (no calls) for several | `SummaryEdit` |

Messages after the last recorded one the request keeps are new (appended as events), and recorded ones
after it that the request left out are dropped: a harness that discards its last turn (mini-swe-agent
drops a reply it rejects for its format) and adds a complaint gives a `DropEdit` and a new message.

Whatever these cannot say exactly (a message inserted between kept ones, several for several) falls back
to dropping everything from the first difference on and appending the harness's messages from there.
Every diff is checked: the edits applied to the recorded history must give the request's messages
fingerprint for fingerprint, else the fallback is used, so the recorded view is always what the harness sent.

A fingerprint is the role, the content text (None and "" are equal; text parts joined), the tool calls (id,
name, arguments: parsed JSON compared canonically, other text verbatim) and the `tool_call_id`. A message's
`name` and `reasoning_content` are not part of it.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Sequence

from ctxkit.context.view import apply_edits_to_list, message_of
from ctxkit.context.view_records import ViewMessage
from ctxkit.edits import EDIT_ROLES, DropEdit, Edit, SummaryEdit, TruncateEdit
from ctxkit.errors import LogFormatError
from ctxkit.events import Message, ToolResult, message_from_openai

__all__ = ["HistoryDiff", "fingerprint", "chain", "extend_chain", "request_events", "diff_history", "apply_history_edits"]


def _arguments_key(arguments: Any) -> str:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    try:
        return json.dumps(json.loads(text), sort_keys=True, ensure_ascii=False)
    except ValueError:
        return text


def fingerprint(message: ViewMessage) -> str:
    """The sha256 hex of what identifies a message for the harness (see the module docstring)."""
    calls = [[tc.id, tc.name, _arguments_key(tc.arguments)] for tc in message.tool_calls]
    body = json.dumps([message.role, message.content or "", calls, message.tool_call_id], ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()


def chain(fingerprints: Sequence[str]) -> list[str]:
    """Prefix digests: entry `i` identifies `fingerprints[:i]` (entry 0 the empty history), so an episode's
    whole history is found among a request's prefixes by one dict look-up per prefix."""
    start = hashlib.sha256(b"ctxkit-gateway-history-v1").hexdigest()
    return [start] + extend_chain(start, fingerprints)


def extend_chain(last: str, fingerprints: Sequence[str]) -> list[str]:
    """The `chain` entries after `last` for `fingerprints` appended."""
    out = []
    for fp in fingerprints:
        last = hashlib.sha256((last + fp).encode()).hexdigest()
        out.append(last)
    return out


def request_events(messages: Sequence[Any]) -> list[Message | ToolResult]:
    """The events of a request's messages: a `ToolResult` per tool message, a `Message` per other one.
    `MessageFormatError` naming the message index for a malformed one."""
    out: list[Message | ToolResult] = []
    for i, raw in enumerate(messages):
        msg = message_from_openai(raw, where=f"messages[{i}]")
        if msg.role == "tool":
            out.append(ToolResult(tool_call_id=msg.tool_call_id or "", name=msg.name, content=msg.content))
        else:
            out.append(msg)
    return out


def view_messages(events: Sequence[Message | ToolResult]) -> list[ViewMessage]:
    """The view messages of unrecorded events (provenance names no event yet)."""
    return [m for m in (message_of(e) for e in events) if m is not None]


@dataclass(frozen=True)
class HistoryDiff:
    """How a request's messages relate to the recorded history."""

    edits: tuple[Edit, ...]
    """Edits to the recorded history (empty: the request extends it)."""
    new_from: int
    """Index of the first request message to append as a new event."""
    fallback: bool
    """True when the edits are the drop-and-append fallback rather than an alignment."""


def diff_history(history: Sequence[ViewMessage], request: Sequence[ViewMessage]) -> HistoryDiff:
    """Edits that turn `history` into `request[:new_from]`, plus where the new messages start."""
    old = [fingerprint(m) for m in history]
    new = [fingerprint(m) for m in request]
    if new[: len(old)] == old:
        return HistoryDiff((), len(old), False)
    edits, new_from = _aligned_edits(history, request, old, new)
    if edits is not None and _applies(history, edits, request[:new_from]):
        return HistoryDiff(tuple(edits), new_from, False)
    p = next(i for i, (a, b) in enumerate(zip(old + [""], new + [""])) if a != b)
    dropped = sorted({eid for m in history[p:] for eid in m.provenance.event_ids})
    return HistoryDiff((DropEdit(tuple(dropped)),) if dropped else (), p, True)


def apply_history_edits(history: Sequence[ViewMessage], edits: Sequence[Edit]) -> list[ViewMessage]:
    """`history` after `edits` (what the recorded harness compaction gives)."""
    return apply_edits_to_list(history, edits, where="harness compaction")


def _applies(history: Sequence[ViewMessage], edits: Sequence[Edit], target: Sequence[ViewMessage]) -> bool:
    try:
        got = apply_history_edits(history, edits)
    except LogFormatError:
        return False
    return [fingerprint(m) for m in got] == [fingerprint(m) for m in target]


def _ids(messages: Sequence[ViewMessage]) -> tuple[str, ...]:
    return tuple(sorted({eid for m in messages for eid in m.provenance.event_ids}))


def _aligned_edits(history, request, old, new) -> tuple[list[Edit] | None, int]:
    """Edits from the alignment of the fingerprints; (None, 0) when an opcode has no exact edit."""
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    # the request's tail after the last history message it keeps is new: appended, not an edit
    new_from = len(new)
    if ops and ops[-1][0] in ("insert", "replace") and ops[-1][2] == len(old):
        # messages after the last one kept are new, and any history after it was left out
        _, i1, i2, j1, _ = ops[-1]
        new_from = j1
        ops = ops[:-1] + ([("delete", i1, i2, j1, j1)] if i1 < i2 else [])
    edits: list[Edit] = []
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        if tag == "delete":
            edits.append(DropEdit(_ids(history[i1:i2])))
            continue
        if tag != "replace" or j2 - j1 != 1:
            return None, 0
        edit = _replacement(history[i1:i2], request[j1])
        if edit is None:
            return None, 0
        edits.append(edit)
    return edits, new_from


def _replacement(old: Sequence[ViewMessage], new: ViewMessage) -> Edit | None:
    """The edit putting `new` where `old` were, or None when no edit says it exactly."""
    first = old[0]
    if len(old) == 1 and len(first.provenance.event_ids) == 1 and first.role == new.role \
            and first.tool_calls == new.tool_calls and first.tool_call_id == new.tool_call_id:
        return TruncateEdit(first.provenance.event_ids[0], new.content)
    if new.role in EDIT_ROLES and not new.tool_calls:
        return SummaryEdit(_ids(old), new.content, role=new.role)
    return None
