"""`window`: keep the first messages and as many recent turns as fit (L2).

Compaction happens when the trigger fires (by default: the view is over budget) and cuts the view to
`target_fraction` of the budget (default 0.75), so it is amortized over the following turns.

A turn group is an assistant message together with the tool results answering its calls, or any other
single message. Whole groups are dropped, oldest first, so no tool call or result is ever orphaned.
`fit_window` is shared with the other strategies as their last-resort fallback.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ctxkit.compress.base import BaseCompressor, CompressionRequest, require_int
from ctxkit.errors import BudgetError, ConfigError
from ctxkit.view import View, ViewMessage, apply_edits


class Window(BaseCompressor):
    """Keep `keep_first` messages and the newest turn groups that fit in `target_fraction * budget`."""

    NAME = "window"
    VERSION = 1
    DEFAULTS: Mapping[str, Any] = {"keep_first": 2, "keep_last": 1, "target_fraction": 0.75}
    """`keep_first`: leading messages always kept (system, task; extended to a whole group);
    `keep_last`: newest turn groups always kept (at least 1); `target_fraction`: when compacting, keep as
    many recent turns as fit in `target_fraction * budget`. Below 1.0 leaves room, so the next turns
    append without a compaction: consecutive contexts extend each other (KV-cache reuse, training
    samples merge) and compaction cost is amortized. 1.0 refills the budget at every turn."""

    def check_params(self, p: Mapping[str, Any]) -> None:
        require_int(self.NAME, p, "keep_first", minimum=0)
        require_int(self.NAME, p, "keep_last", minimum=1)
        f = p["target_fraction"]
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
            raise ConfigError(f"{self.NAME}: parameter 'target_fraction' is {f!r}; expected a number in (0, 1]")

    def propose(self, request: CompressionRequest, n_tokens: int):
        p = self.params
        target = int(p["target_fraction"] * request.budget)
        if n_tokens <= target:
            return None
        edits, _, n_after = fit_window(request, request.view, n_tokens, keep_first=p["keep_first"],
                                       keep_last=p["keep_last"], target=target, who=self.spec.name)
        return edits, {"tokens_after": n_after}


# ---------------------------------------------------------------------------------------------- helpers


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
    text = sum(message_cost(tokenizer, m) for m in view.messages)
    per_msg = max(0.0, (n_tokens - text) / max(1, len(view.messages)))
    old = {id(m) for m in view.messages}
    new = {id(m) for m in candidate.messages}
    added = sum(message_cost(tokenizer, m) + per_msg for m in candidate.messages if id(m) not in old)
    removed = sum(message_cost(tokenizer, m) + per_msg for m in view.messages if id(m) not in new)
    return int(n_tokens + added - removed)


def fit_window(
    request: CompressionRequest,
    view: View,
    n_tokens: int,
    *,
    keep_first: int,
    keep_last: int = 1,
    target: int | None = None,
    who: str = "window-v1",
) -> tuple[list[dict[str, Any]], View, int]:
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
    tok = request.tokenizer
    costs = [sum(message_cost(tok, msgs[k]) for k in range(s, e)) for s, e in groups]
    # Calibrate the per-message scaffold from the measured size, to estimate candidates before measuring.
    text_total = sum(costs) + sum(message_cost(tok, m) for m in view.messages if m.provenance.how == "pinned")
    per_msg = max(0.0, (n_tokens - text_total) / max(1, len(view.messages)))
    group_est = [c + per_msg * (e - s) for c, (s, e) in zip(costs, groups)]

    def candidate(d: int) -> tuple[list[dict[str, Any]], View]:
        ids: list[str] = []
        for s, e in groups[first:first + d]:
            for k in range(s, e):
                ids.extend(msgs[k].provenance.event_ids)
        if not ids:
            return [], view
        edits = [{"op": "drop", "event_ids": ids}]
        return edits, apply_edits(view, edits, where=who)

    # First guess from the estimates.
    need = n_tokens - target
    d, acc = 0, 0.0
    while d < droppable and acc < need:
        acc += group_est[first + d]
        d += 1
    measured: dict[int, tuple[int, list[dict[str, Any]], View]] = {}

    def measure(d: int) -> int:
        if d not in measured:
            edits, v = candidate(d)
            measured[d] = (request.measure(v) if edits else n_tokens, edits, v)
        return measured[d][0]

    while measure(d) > target and d < droppable:
        d += 1
    if measure(d) > target:
        size = measure(d)
        if size > budget:
            raise BudgetError(
                f"{who}: even the first {keep_first} message(s), the pinned constraints and the newest "
                f"{keep_last} turn(s) take {size} tokens, over the budget of {budget} tokens "
                f"(the full view was {n_tokens} tokens)"
            )
    else:
        while d > 0 and measure(d - 1) <= target:  # keep as many groups as fit
            d -= 1
    size, edits, v = measured[d]
    return edits, v, size
