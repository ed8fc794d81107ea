"""The colored token-by-token view shared by `ctxkit inspect` and `ctxkit replay --step`.

Tokens are colored by role (`ROLE_STYLES`), loss-masked tokens (loss mask 1) are bold and underlined,
special tokens are reversed, and newlines show as `↵` before the line break.
"""

from __future__ import annotations

from typing import Any, Sequence

from ctxkit.text.tokenizer.pieces import token_texts as token_texts  # its home is ctxkit.text.tokenizer.pieces; kept importable here

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


def print_tokens(console: Any, tok: Any, token_ids: Sequence[int], roles: Sequence[str],
                 loss_mask: Sequence[int], max_tokens: int | None = None) -> None:
    """Print `token_ids` (the first `max_tokens` when given) colored by role on a rich `console`, then
    how many tokens were left out."""
    from rich.text import Text  # lazy: per command: keeps `ctxkit --help` fast

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


def drift_summary(drifts: Sequence[Any]) -> str:
    """`N` or `N (reason n, ...)`: the drifts of a context counted by reason, in `DRIFT_REASONS` order."""
    from ctxkit.text.rendering.drift_reasons import count_reasons  # lazy: per command: keeps `ctxkit --help` fast

    counts = count_reasons([getattr(d, "reason", "unexplained") for d in drifts])
    by = ", ".join(f"{r} {n}" for r, n in counts.items() if n)
    return f"{len(drifts)} ({by})" if drifts else "0"


def print_drifts(console: Any, tok: Any, drifts: Sequence[Any], limit: int = 20) -> None:
    """One line per drift (the first `limit`): message, token position, reason, sampled vs rendered text."""
    from rich.markup import escape  # lazy: per command: keeps `ctxkit --help` fast

    for d in list(drifts)[:limit]:
        sampled, rendered = tok.decode(list(d.sampled_ids)), tok.decode(list(d.rendered_ids))
        console.print(f"  drift message {d.message_index} at token {d.position}: "
                      f"[bold]{getattr(d, 'reason', 'unexplained')}[/]  sampled {escape(repr(sampled))} "
                      f"-> rendered {escape(repr(rendered))}", soft_wrap=True)
    if len(drifts) > limit:
        console.print(f"  ... {len(drifts) - limit} more drift(s)")
