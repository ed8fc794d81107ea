"""The text of each token of an id sequence, decoded in context.

One home for the per-token text that the terminal token view (`ctxkit inspect`, `ctxkit replay --step`)
and the HTML viewer (`ctxkit view`) show, so both show the same pieces.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["token_texts"]


def token_texts(tok: Any, ids: Sequence[int]) -> list[str]:
    """Text of each token, decoded in context (keeps Metaspace word spaces; multi-token characters are
    shown on their first token, the others get "")."""
    out: list[str] = []
    prev_text = ""
    prev_id = None
    i = 0
    n = len(ids)
    while i < n:
        j = i + 1
        while True:
            if prev_id is None:
                piece = tok.decode(ids[i:j])
            else:
                both = tok.decode([prev_id, *ids[i:j]])
                piece = both[len(prev_text):] if both.startswith(prev_text) else tok.decode(ids[i:j])
            if "\ufffd" not in piece or j - i >= 4 or j >= n:
                break
            j += 1
        out.append(piece)
        out.extend([""] * (j - i - 1))
        prev_id = ids[j - 1]
        prev_text = tok.decode([prev_id])
        i = j
    return out
