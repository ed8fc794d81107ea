"""Turn groups and the oldest-first drop that several compressors share.

A turn group is an assistant message together with the tool results answering its calls, or any other
single message. `fit_window` drops whole groups, oldest first (after a kept prefix, never the newest
`keep_last`), so no tool call or result is ever orphaned; `window` is built on it, and `retrieve` and the
version-1 strategies (their built-in window fallback) use it too. `estimate_size` guesses a candidate
view's render size from a measured one, to pick which candidate to measure exactly.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Callable, Sequence

from ctxkit.context.compress.base import CompressionRequest
from ctxkit.edits import DropEdit
from ctxkit.errors import BudgetError
from ctxkit.context.view import View, ViewMessage, apply_edits

__all__ = ["SizeEstimate", "base_messages", "estimate_size", "fit_window", "message_cost", "prefix_groups", "turn_groups"]


def base_messages(view: View) -> list[ViewMessage]:
    """The view's messages without the derived pinned block."""
    return [m for m in view.messages if m.provenance.how != "pinned"]


def turn_groups(messages: Sequence[ViewMessage]) -> list[tuple[int, int]]:
    """`[start, end)` index ranges: an assistant message with the tool messages after it, or one message."""
    groups: list[tuple[int, int]] = []
    i = 0
    n = len(messages)
    while i < n:
        j = i + 1
        if messages[i].role == "assistant" and messages[i].tool_calls:
            while j < n and messages[j].role == "tool":
                j += 1
        groups.append((i, j))
        i = j
    return groups


def prefix_groups(groups: Sequence[tuple[int, int]], keep_first: int) -> int:
    """How many leading groups cover the first `keep_first` messages (a cut group is kept whole)."""
    k = 0
    for start, _ in groups:
        if start >= keep_first:
            break
        k += 1
    return k


def message_cost(tokenizer: Any, m: ViewMessage) -> int:
    """Token count of a message's texts (content, call names and arguments, reasoning), without scaffold."""
    n = tokenizer.count(m.content) if m.content else 0
    for tc in m.tool_calls:
        n += tokenizer.count(tc.name) + tokenizer.count(tc.arguments_text())
    if m.reasoning_content:
        n += tokenizer.count(m.reasoning_content)
    return n


def estimate_size(tokenizer: Any, view: View, n_tokens: int, candidate: View) -> int:
    """Estimated render size of `candidate` from the measured size `n_tokens` of `view`: the text-token
    difference of the messages that differ, plus a per-message scaffold calibrated on `view`. Used to
    choose which candidate to measure exactly; never a substitute for the measurement."""
    return SizeEstimate(tokenizer, view, n_tokens).of(candidate)


class SizeEstimate:
    """`estimate_size` for several candidates of one measured view: the view's text total and per-message
    scaffold are computed once, and a candidate that only replaces some messages can be estimated from
    those replacements without building its view (`replaced`, same value as `of` on that view)."""

    def __init__(self, tokenizer: Any, view: View, n_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.view = view
        self.n_tokens = n_tokens

    @cached_property
    def per_msg(self) -> float:
        """Scaffold tokens per message, calibrated on the measured view (counted on first use: it counts
        the text of every message of the view)."""
        text = sum(message_cost(self.tokenizer, m) for m in self.view.messages)
        return max(0.0, (self.n_tokens - text) / max(1, len(self.view.messages)))

    def of(self, candidate: View) -> int:
        """`estimate_size(tokenizer, view, n_tokens, candidate)`."""
        tok, per_msg, view = self.tokenizer, self.per_msg, self.view
        old = {id(m) for m in view.messages}
        new = {id(m) for m in candidate.messages}
        added = sum(message_cost(tok, m) + per_msg for m in candidate.messages if id(m) not in old)
        removed = sum(message_cost(tok, m) + per_msg for m in view.messages if id(m) not in new)
        return int(self.n_tokens + added - removed)

    def of_exceeds(self, candidate: View, target: int) -> bool:
        """`of(candidate) > target`, without calibrating the scaffold unless the answer depends on it: when
        the candidate adds as many messages as it takes away, the scaffold terms cancel and the estimate is
        an integer or one below it (as in `replaced_exceeds`)."""
        tok, view = self.tokenizer, self.view
        old = {id(m) for m in view.messages}
        new = {id(m) for m in candidate.messages}
        added = [m for m in candidate.messages if id(m) not in old]
        removed = [m for m in view.messages if id(m) not in new]
        if len(added) != len(removed):
            return self.of(candidate) > target
        exact = self.n_tokens + sum(message_cost(tok, m) for m in added) - sum(message_cost(tok, m) for m in removed)
        return _exceeds(exact, target, lambda: self.of(candidate))

    def replaced(self, changes: Sequence[tuple[ViewMessage, str]]) -> int:
        """The estimate of the view with each `(message, new content)` of `changes` replaced by a new message
        with that content (in view order, nothing else changed: what mask and truncate edits give on a
        view without pins). Equal to `of` on that view: the same terms summed in the same order."""
        tok, per_msg = self.tokenizer, self.per_msg
        added = sum(message_cost(tok, m) - (tok.count(m.content) if m.content else 0)
                    + (tok.count(text) if text else 0) + per_msg for m, text in changes)
        removed = sum(message_cost(tok, m) + per_msg for m, _ in changes)
        return int(self.n_tokens + added - removed)

    def replaced_exceeds(self, changes: Sequence[tuple[ViewMessage, str]], target: int) -> bool:
        """`replaced(changes) > target`, without calibrating the scaffold unless the answer depends on it.

        In `replaced` the scaffold term is added once per change and taken away once per change, so the
        estimate is the integer `n_tokens + sum(new count - old count)` up to float rounding (far below one
        token), which `int()` may turn into one less: the estimate is that integer or one below it. Only
        when the integer is `target + 1` do the two disagree; then the calibrated `replaced` decides."""
        tok = self.tokenizer
        exact = self.n_tokens + sum((tok.count(text) if text else 0) - (tok.count(m.content) if m.content else 0)
                                    for m, text in changes)
        return _exceeds(exact, target, lambda: self.replaced(changes))


def _exceeds(exact: int, target: int, estimate: Callable[[], int]) -> bool:
    """Whether an estimate that is `exact` or `exact - 1` (float rounding of cancelling scaffold terms) is
    above `target`; `estimate()` (the calibrated value) decides only when the two answers differ."""
    if exact - 1 > target:
        return True
    if exact <= target:
        return False
    return estimate() > target


def fit_window(
    request: CompressionRequest,
    view: View,
    n_tokens: int,
    *,
    keep_first: int,
    keep_last: int = 1,
    target: int | None = None,
    who: str = "window-v1",
) -> tuple[list[DropEdit], View, int]:
    """Drop the oldest turn groups of `view` (after the first `keep_first` messages, never the newest
    `keep_last` groups) until its measured size is at most `target` (default: the budget), keeping as many
    groups as fit. Returns `(edits, new view, new size)`; no edits when it already fits.

    Raises `BudgetError` naming the sizes when even the kept prefix and newest groups exceed the budget.
    """
    budget = request.budget
    target = budget if target is None else min(target, budget)
    if n_tokens <= target:
        return [], view, n_tokens
    msgs = base_messages(view)
    groups = turn_groups(msgs)
    first = prefix_groups(groups, keep_first)
    droppable = max(0, len(groups) - first - keep_last)

    def candidate(d: int) -> tuple[list[DropEdit], View]:
        ids: list[str] = []
        for s, e in groups[first:first + d]:
            for k in range(s, e):
                ids.extend(msgs[k].provenance.event_ids)
        if not ids:
            return [], view
        edits = [DropEdit(tuple(ids))]
        return edits, apply_edits(view, edits, where=who)

    measured: dict[int, tuple[int, list[DropEdit], View]] = {}

    def measure(d: int) -> int:
        if d not in measured:
            edits, v = candidate(d)
            measured[d] = (request.measure(v) if edits else n_tokens, edits, v)
        return measured[d][0]

    # Exact prediction: the size after dropping d groups is the measured size less the tokens from the first
    # dropped turn's opener to the first kept one's. The chosen candidate is measured to confirm it.
    sizes = predicted_sizes(request, view, n_tokens, msgs, groups, first, droppable)
    if sizes is not None:
        d = next((k for k, size in enumerate(sizes) if size <= target), droppable)
        if measure(d) == sizes[d]:
            if sizes[d] > budget:
                _too_big(who, keep_first, keep_last, sizes[d], budget, n_tokens)
            size, edits, v = measured[d]
            return edits, v, size
    tok = request.tokenizer
    costs = [sum(message_cost(tok, msgs[k]) for k in range(s, e)) for s, e in groups]
    # Calibrate the per-message scaffold from the measured size, to estimate candidates before measuring.
    text_total = sum(costs) + sum(message_cost(tok, m) for m in view.messages if m.provenance.how == "pinned")
    per_msg = max(0.0, (n_tokens - text_total) / max(1, len(view.messages)))
    group_est = [c + per_msg * (e - s) for c, (s, e) in zip(costs, groups)]

    # First guess from the estimates.
    need = n_tokens - target
    d, acc = 0, 0.0
    while d < droppable and acc < need:
        acc += group_est[first + d]
        d += 1
    while measure(d) > target and d < droppable:
        d += 1
    if measure(d) > target:
        size = measure(d)
        if size > budget:
            _too_big(who, keep_first, keep_last, size, budget, n_tokens)
    else:
        while d > 0 and measure(d - 1) <= target:  # keep as many groups as fit
            d -= 1
    size, edits, v = measured[d]
    return edits, v, size


def predicted_sizes(request: CompressionRequest, view: View, n_tokens: int, msgs: Sequence[ViewMessage],
                    groups: Sequence[tuple[int, int]], first: int, droppable: int) -> list[int] | None:
    """Exact render sizes of `view` with its groups `first .. first + d - 1` dropped, for d = 0 .. droppable,
    from the token where each turn begins in the render of `view` (`CompressionRequest.turn_starts`); None
    when the request cannot tell (no `turn_starts`, or a group that does not open a turn of its own)."""
    if request.turn_starts is None or droppable == 0:
        return None
    starts = request.turn_starts(view)
    if starts is None:
        return None
    pinned = next((i for i, m in enumerate(view.messages) if m.provenance.how == "pinned"), None)
    shift = 0 if pinned is None or pinned > groups[first][0] else 1  # the pinned block sits before the groups
    if pinned is not None and shift == 0 and pinned <= groups[first + droppable][0]:
        return None  # a pinned block among the droppable groups: not a plain cut
    if groups[first][0] + shift == 0:
        return None  # the first message is a template's special case (a default system prompt, `messages[0]`)
    at = [starts[groups[first + d][0] + shift] for d in range(droppable + 1)]
    if any(a is None for a in at):
        return None
    return [n_tokens - (a - at[0]) for a in at]


def _too_big(who: str, keep_first: int, keep_last: int, size: int, budget: int, n_tokens: int) -> None:
    raise BudgetError(
        f"{who}: even the first {keep_first} message(s), the pinned constraints and the newest "
        f"{keep_last} turn(s) take {size} tokens, over the budget of {budget} tokens "
        f"(the full view was {n_tokens} tokens)"
    )
