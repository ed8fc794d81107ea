"""Tool-call pairing of a view's messages: which calls and results do not pair up.

A tool result with no call before it is an orphaned result, a second result for an answered call a
duplicated result, a call followed by a later turn without its result an unanswered call; the calls of
the last assistant message may still be pending (an episode waiting for its tool, or ending with
`submit`): legal, and reported only on request. `PairingScan` is the same scan fed piece by piece, so the
builder's view state checks only the messages appended since its last view. The messages are
`ctxkit.context.view.ViewMessage`s (anything with `role`, `tool_calls`, `tool_call_id` and `provenance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class PairingProblem:
    """One tool call or result that does not pair up (see `pairing_problems`)."""

    problem: str
    """One of `ctxkit.errors.PAIRING_PROBLEMS`: `orphaned_result`, `pending_call`, `unanswered_call`,
    `duplicated_result`."""
    event: str
    """The event id(s) of the message at fault (the result, or the message making the call)."""
    call_id: str | None
    """The call concerned."""
    text: str
    """A one-line description naming the event and the call."""


def pairing_problems(messages: Sequence[Any], *, allow_pending: bool = True) -> list[PairingProblem]:
    """Every tool call or result of a message list that does not pair up, in order.

    A tool message must answer a call of the nearest assistant message before it, with only tool
    messages in between: one answering a call that message made and already answered is a
    `duplicated_result`, any other an `orphaned_result`. Every call must be answered before the next
    non-tool message: one that is not is an `unanswered_call`. Calls of the last assistant message still
    without a result at the end are `pending_call`s (the episode is waiting for the tool, or ended with a
    `submit`/`finish` call): legal, and reported only when `allow_pending` is False.
    """
    return PairingScan().feed(messages).result(allow_pending=allow_pending)


class PairingScan:
    """`pairing_problems` fed a message list piece by piece: after `feed(a)` then `feed(b)`, `result()` is
    `pairing_problems(a + b)` (the builder's `ViewState` keeps one and feeds it only new messages)."""

    __slots__ = ("n", "_problems", "_open", "_answered", "_in_tool_run")

    def __init__(self) -> None:
        self.n = 0
        """Messages fed so far."""
        self._problems: list[PairingProblem] = []
        self._open: dict[str, Any] = {}  # call id -> the calling message, not yet answered
        self._answered: set[str] = set()  # calls of the current calling message already answered
        self._in_tool_run = False

    def feed(self, messages: Sequence[Any]) -> "PairingScan":
        """Scan `messages`, which follow every message fed before."""
        problems, open_calls, answered, in_tool_run = self._problems, self._open, self._answered, self._in_tool_run
        for m in messages:
            if m.role == "tool":
                cid = m.tool_call_id
                if in_tool_run and cid in open_calls:
                    del open_calls[cid]
                    answered.add(cid)
                    continue
                ev = ",".join(m.provenance.event_ids)
                if in_tool_run and cid in answered:
                    problems.append(PairingProblem("duplicated_result", ev, cid,
                                                   f"tool result {ev} answers call {cid!r}, which an earlier result "
                                                   "already answered (duplicated result)"))
                else:
                    problems.append(PairingProblem("orphaned_result", ev, cid,
                                                   f"tool result {ev} answers call {cid!r} with no matching call "
                                                   "before it (orphaned result)"))
                continue
            for cid, caller in open_calls.items():  # event ids joined only for a problem
                src, ev = ",".join(caller.provenance.event_ids), ",".join(m.provenance.event_ids)
                problems.append(PairingProblem("unanswered_call", src, cid,
                                               f"tool call {cid!r} of {src} has no result before the next message "
                                               f"{ev} (unanswered call)"))
            in_tool_run = bool(m.tool_calls)
            open_calls = {tc.id: m for tc in m.tool_calls} if in_tool_run else {}
            if answered:
                answered = set()
        self._open, self._answered, self._in_tool_run = open_calls, answered, in_tool_run
        self.n += len(messages)
        return self

    def result(self, *, allow_pending: bool = True) -> list[PairingProblem]:
        """The problems of everything fed so far (a new list); with `allow_pending=False` the calls still
        open at the end follow as `pending_call`s."""
        problems = list(self._problems)
        if not allow_pending:
            for cid, caller in self._open.items():
                src = ",".join(caller.provenance.event_ids)
                problems.append(PairingProblem("pending_call", src, cid,
                                               f"tool call {cid!r} of {src} has no result yet (pending call)"))
        return problems


def pending_calls(messages: Sequence[Any]) -> tuple[str, ...]:
    """Ids of the calls of the last assistant message still waiting for a result at the end of the list."""
    return tuple(p.call_id or "" for p in pairing_problems(messages, allow_pending=False)
                 if p.problem == "pending_call")


def find_orphans(messages: Sequence[Any]) -> list[str]:
    """Descriptions of every tool call or result that breaks pairing (empty when paired). A trailing
    pending call is legal and not listed (see `pairing_problems`)."""
    return [p.text for p in pairing_problems(messages)]
