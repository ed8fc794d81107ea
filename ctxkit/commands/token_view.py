"""The colored token-by-token view shared by `ctxkit inspect` and `ctxkit replay --step` (L5).

Tokens are colored by role (`ROLE_STYLES`), loss-masked tokens (loss mask 1) are bold and underlined,
special tokens are reversed, and newlines show as `↵` before the line break.
"""

from __future__ import annotations

from typing import Any, Sequence

ROLE_STYLES = {
    "system": "magenta",
    "user": "green",
    "assistant": "cyan",
    "tool": "yellow",
    "scaffold": "grey50",
    "generation_prompt": "blue",
}
"""rich style per token role."""

LEGEND = "[grey50]bold underline = loss mask 1 (tokens the policy produces); reversed = special token[/]"
"""The legend printed under a token view."""


def token_texts(tok: Any, ids: Sequence[int]) -> list[str]:
    """Text of each token, decoded in context (keeps Metaspace word spaces; multi-token characters are
    shown on their first token)."""
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


def print_tokens(console: Any, tok: Any, token_ids: Sequence[int], roles: Sequence[str],
                 loss_mask: Sequence[int], max_tokens: int | None = None) -> None:
    """Print `token_ids` (the first `max_tokens` when given) colored by role on a rich `console`, then
    how many tokens were left out."""
    from rich.text import Text

    ids = list(token_ids if max_tokens is None else token_ids[:max_tokens])
    specials = set(tok.special_tokens.values())
    text = Text()
    for tid, piece, role, masked in zip(ids, token_texts(tok, ids), roles, loss_mask):
        style = ROLE_STYLES.get(role, "") + (" bold underline" if masked else "")
        if tid in specials:
            text.append(piece, style=style + " reverse")
            continue
        for k, part in enumerate(piece.split("\n")):
            if k:
                text.append("↵", style="grey42")
                text.append("\n")
            text.append(part, style=style)
    console.print(text)
    if max_tokens is not None and len(token_ids) > max_tokens:
        console.print(f"[grey50]... {len(token_ids) - max_tokens} more tokens[/]")
