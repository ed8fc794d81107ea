"""`truncate-tool-output`: cap each tool output at `max_tokens` real tokens (L2).

The kept part (`head`, `tail`, `head_tail` or `middle`) is cut on token boundaries of the real tokenizer
and joined with a marker naming the event and how many tokens were cut; the whole truncated text
re-tokenizes to at most `max_tokens` tokens. If the capped view is still over budget and
`fallback="window"`, the oldest turn groups are dropped as `window` does.
"""

from __future__ import annotations

from typing import Any, Mapping

from ctxkit.compress.base import BaseCompressor, CompressionRequest, require_choice, require_fraction, require_int
from ctxkit.compress.window import base_messages, fit_window
from ctxkit.view import apply_edits

KEEPS: tuple[str, ...] = ("head", "tail", "head_tail", "middle")
MARKER = "[... {n_cut} tokens of {event_id} truncated ...]"


class TruncateToolOutput(BaseCompressor):
    """Cap every tool output at `max_tokens` tokens."""

    NAME = "truncate-tool-output"
    VERSION = 1
    DEFAULTS: Mapping[str, Any] = {"max_tokens": 256, "keep": "head_tail", "fallback": "window", "keep_first": 2,
                                   "target_fraction": 0.75}
    """`max_tokens`: cap per tool output (marker included); `keep`: which part survives; `fallback`:
    `"window"` drops oldest turns if capping leaves the view over budget (cutting it to
    `target_fraction * budget`), `"none"` leaves it to the budget check; `keep_first`: messages the
    fallback keeps."""

    def check_params(self, p: Mapping[str, Any]) -> None:
        require_int(self.NAME, p, "max_tokens", minimum=32)
        require_choice(self.NAME, p, "keep", KEEPS)
        require_choice(self.NAME, p, "fallback", ("window", "none"))
        require_int(self.NAME, p, "keep_first", minimum=0)
        require_fraction(self.NAME, p, "target_fraction")

    def propose(self, request: CompressionRequest, n_tokens: int):
        p = self.params
        view = request.view
        edits: list[dict[str, Any]] = []
        for m in base_messages(view):
            if m.role != "tool" or m.provenance.how != "verbatim":
                continue
            eid = m.provenance.event_ids[0]
            text = truncate_text(request.tokenizer, m.content, p["max_tokens"], p["keep"], eid)
            if text is not None:
                edits.append({"op": "truncate", "event_id": eid, "text": text})
        size = n_tokens
        details: dict[str, Any] = {"truncated": len(edits)}
        if edits:
            view = apply_edits(view, edits, where=self.spec.name)
            size = request.measure(view)
        if size > request.budget and p["fallback"] == "window":
            more, _, size = fit_window(request, view, size, keep_first=p["keep_first"],
                                       target=int(p["target_fraction"] * request.budget), who=self.spec.name)
            edits = edits + more
        details["tokens_after"] = size
        return edits, details


def truncate_text(tokenizer: Any, text: str, max_tokens: int, keep: str, event_id: str) -> str | None:
    """`text` cut to at most `max_tokens` tokens (marker included), or None when it already fits."""
    ids = tokenizer.encode(text)
    if len(ids) <= max_tokens:
        return None
    n = len(ids)
    room = max_tokens - tokenizer.count(MARKER.format(n_cut=n, event_id=event_id)) - 4
    while room > 0:
        out = _compose(tokenizer, ids, room, keep, event_id)
        if tokenizer.count(out) <= max_tokens:
            return out
        room -= max(1, room // 16)
    return MARKER.format(n_cut=n, event_id=event_id)


def _compose(tokenizer: Any, ids: list[int], room: int, keep: str, event_id: str) -> str:
    n = len(ids)
    if keep == "head":
        parts = [_dec(tokenizer, ids[:room]), None]
    elif keep == "tail":
        parts = [None, _dec(tokenizer, ids[n - room:])]
    elif keep == "head_tail":
        h = room - room // 2
        parts = [_dec(tokenizer, ids[:h]), _dec(tokenizer, ids[n - (room - h):])]
    else:  # middle
        start = (n - room) // 2
        parts = [None, _dec(tokenizer, ids[start:start + room]), None]
    kept = sum(tokenizer.count(p) for p in parts if p)
    marker = MARKER.format(n_cut=n - kept, event_id=event_id)
    if keep == "head":
        return f"{parts[0]}\n{marker}"
    if keep == "tail":
        return f"{marker}\n{parts[1]}"
    if keep == "head_tail":
        return f"{parts[0]}\n{marker}\n{parts[1]}"
    return f"{marker}\n{parts[1]}\n{marker}"


def _dec(tokenizer: Any, ids: list[int]) -> str:
    """Decode, dropping edge tokens that would decode to a broken character."""
    text = tokenizer.decode(ids)
    while ids and (text.endswith("\ufffd") or text.startswith("\ufffd")):
        ids = ids[:-1] if text.endswith("\ufffd") else ids[1:]
        text = tokenizer.decode(ids)
    return text
