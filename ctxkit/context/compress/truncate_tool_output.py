"""`truncate-tool-output-v2`: cap each tool output at `max_tokens` real tokens, and nothing else.

The kept part (`head`, `tail`, `head_tail` or `middle`) is cut on token boundaries of the real tokenizer
and joined with a marker naming the event and how many tokens were cut; the whole truncated text
re-tokenizes to at most `max_tokens` tokens. Capping alone may leave the view over budget: this version
drops no turns. Follow it with `window` (the `truncate-then-window` preset) to guarantee the budget.

Version 1 (the un-suffixed registry name `truncate-tool-output`, `ctxkit.context.compress.with_window_fallback`) also drops the
oldest turn groups itself when capping is not enough (`fallback="window"`).
"""

from __future__ import annotations

from typing import Any, Mapping

from ctxkit.context.compress.base import BaseCompressor, CompressionRequest, require_choice, require_int
from ctxkit.context.compress.turns import base_messages
from ctxkit.edits import TruncateEdit
from ctxkit.context.view import View, apply_edits

KEEPS: tuple[str, ...] = ("head", "tail", "head_tail", "middle")
"""Which part of an output survives."""
MARKER = "[... {n_cut} tokens of {event_id} truncated ...]"
"""The marker joined into a truncated output."""
FITS_KEPT = 50_000
"""How many fitting tool-output texts a compressor remembers (per tokenizer) before starting over."""


class TruncateToolOutput(BaseCompressor):
    """Cap every tool output at `max_tokens` tokens (version 2: capping only)."""

    NAME = "truncate-tool-output"
    VERSION = 2
    FITS_BUDGET = False
    DEFAULTS: Mapping[str, Any] = {"max_tokens": 256, "keep": "head_tail"}
    """`max_tokens`: cap per tool output (marker included); `keep`: which part survives."""

    def check_params(self, p: Mapping[str, Any]) -> None:
        require_int(self.NAME, p, "max_tokens", minimum=32)
        require_choice(self.NAME, p, "keep", KEEPS)

    def propose(self, request: CompressionRequest, n_tokens: int):
        edits, details, _, size = self.truncate(request, n_tokens)
        details["tokens_after"] = size
        return edits, details

    def known_to_fit(self, tokenizer: Any) -> set[str]:
        """Tool-output texts already found within `max_tokens` tokens of `tokenizer` (a verbatim output stays
        in the view, and is looked at again, at every later compaction); one tokenizer's at a time, at most
        `FITS_KEPT` texts (the set starts over beyond that, or for another tokenizer)."""
        key = getattr(tokenizer, "id", None) or tokenizer
        kept = getattr(self, "_fits", None)
        if kept is None or kept[0] != key or len(kept[1]) >= FITS_KEPT:
            kept = (key, set())
            self._fits = kept
        return kept[1]

    def truncate(self, request: CompressionRequest, n_tokens: int) -> tuple[list[TruncateEdit], dict[str, Any], View, int]:
        """`(edits, details, capped view, its measured size)`."""
        p = self.params
        view = request.view
        edits: list[TruncateEdit] = []
        tok = request.tokenizer
        fits = self.known_to_fit(tok)
        for m in base_messages(view):
            if m.role != "tool" or m.provenance.how != "verbatim":
                continue
            content = m.content
            if content in fits:  # known to fit: no need to encode it again
                continue
            eid = m.provenance.event_ids[0]
            text = truncate_text(tok, content, p["max_tokens"], p["keep"], eid)
            if text is not None:
                edits.append(TruncateEdit(eid, text))
            else:
                fits.add(content)
        size = n_tokens
        if edits:
            view = apply_edits(view, edits, where=self.spec.name)
            size = request.measure(view)
        return edits, {"truncated": len(edits)}, view, size


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
