"""A vendor renderer against a Hugging Face chat template on the same conversation.

`compare_vendor(spec, messages, tokenizer, template, tools, add_generation_prompt)` renders the conversation
through the vendor (`VendorOracle.encode`) and through the chat template in ctxkit's sandbox, tokenized by
`tokenizer` as `apply_chat_template` tokenizes (`template_ids`), and says whether the ids are equal and, if
not, where they first differ: the token position, both sides decoded around it, and the kind of section of
the vendor's render the position falls in (`first_difference`: the last section marker before it, e.g.
`tool call`, `system prompt`; `end` when one render is a prefix of the other), and the kinds of every other
block where they differ once aligned (`all_differences`). Either side refusing is an outcome, not an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ctxkit.errors import CtxkitError
from ctxkit.text.template.chat_template import ChatTemplate, load_template
from ctxkit.text.vendor.oracle import VendorOracle, load_vendor

SNIPPET = 12
"""Tokens decoded on each side of the first differing position."""


@dataclass(frozen=True)
class VendorComparison:
    """One conversation rendered by a vendor and by a chat template."""

    vendor: str
    """The vendor's `template_id`."""
    template: str
    """The chat template's id."""
    outcome: str
    """`equal` | `different` | `vendor refuses` | `template refuses` | `both refuse`."""
    position: int | None = None
    """First differing token position (`different` only)."""
    kind: str | None = None
    """The section of the vendor render at `position` (`first_difference`), or `end`."""
    vendor_text: str = ""
    """The vendor's ids decoded from `SNIPPET` tokens before `position` to `SNIPPET` after."""
    template_text: str = ""
    """The template's ids over the same range, decoded."""
    error: str | None = None
    """The refusal (`Type: message`) of the side(s) that refused."""
    lengths: tuple[int, int] = (0, 0)
    """`(vendor ids, template ids)` lengths."""
    kinds: tuple[str, ...] = ()
    """Every section kind where the renders differ, in order, each once (`all_differences`): what the first
    difference would hide."""


def template_ids(messages: Sequence[Mapping[str, Any]], tokenizer: Any, template: ChatTemplate | str | None,
                 tools: Sequence[Mapping[str, Any]] | None, add_generation_prompt: bool) -> list[int]:
    """`apply_chat_template(..., tokenize=True)`'s ids: the template's text in ctxkit's sandbox, encoded with
    special-token text parsed and no BOS added."""
    tpl = load_template(template, tokenizer)
    return list(tokenizer.encode(tpl.render_text(messages, tools=tools, add_generation_prompt=add_generation_prompt)))


def section_at(oracle: VendorOracle, ids: Sequence[int], position: int) -> str:
    """The kind of the section of `ids` (a render of `oracle`) holding token `position`: the marker of
    `oracle.sections()` whose last occurrence in the text before the token starts last (the longer on a tie)."""
    text = oracle.decode(list(ids[: position + 1]))
    best = (-1, 0, "start")
    for marker, kind in oracle.sections():
        at = text.rfind(marker)
        if at >= 0 and (at, len(marker)) > best[:2]:
            best = (at, len(marker), kind)
    return best[2]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where `a` and `b` differ (the shorter length when one is a prefix), or None."""
    n = min(len(a), len(b))
    for p in range(n):
        if a[p] != b[p]:
            return p
    return None if len(a) == len(b) else n


def all_differences(oracle: VendorOracle, mine: Sequence[int], theirs: Sequence[int]) -> tuple[str, ...]:
    """The section kinds (`section_at` of the vendor render) of every block where `mine` and `theirs` differ,
    aligned by `difflib.SequenceMatcher` over the ids, in order and each once; `end` past the vendor's last id."""
    import difflib  # lazy: only a comparison that differs aligns

    out: dict[str, None] = {}
    ops = difflib.SequenceMatcher(None, list(mine), list(theirs), autojunk=False).get_opcodes()
    for tag, i1, _i2, _j1, _j2 in ops:
        if tag != "equal":
            out[section_at(oracle, mine, i1) if i1 < len(mine) else "end"] = None
    return tuple(out)


def compare_vendor(spec: str, messages: Sequence[Mapping[str, Any]], tokenizer: Any,
                   template: ChatTemplate | str | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
                   add_generation_prompt: bool = False) -> VendorComparison:
    """Vendor `spec` against `template` (default: `tokenizer`'s own) on one conversation (module docstring)."""
    oracle = load_vendor(spec)
    tpl = load_template(template, tokenizer)
    errors = []
    try:
        mine = oracle.encode(list(messages), tools, add_generation_prompt)
    except CtxkitError as exc:
        mine = None
        errors.append(f"vendor: {type(exc).__name__}: {exc}")
    try:
        theirs = template_ids(messages, tokenizer, tpl, tools, add_generation_prompt)
    except CtxkitError as exc:
        theirs = None
        errors.append(f"template: {type(exc).__name__}: {exc}")
    head = dict(vendor=oracle.template_id, template=tpl.id, error="; ".join(errors) or None)
    if mine is None or theirs is None:
        outcome = "both refuse" if mine is None and theirs is None else "vendor refuses" if mine is None else "template refuses"
        return VendorComparison(outcome=outcome, **head)
    p = first_difference(mine, theirs)
    lengths = (len(mine), len(theirs))
    if p is None:
        return VendorComparison(outcome="equal", lengths=lengths, **head)
    lo, hi = max(0, p - SNIPPET), p + SNIPPET
    kind = "end" if p == min(lengths) else section_at(oracle, mine, p)
    return VendorComparison(outcome="different", position=p, kind=kind, vendor_text=oracle.decode(mine[lo:hi]),
                            template_text=tokenizer.decode(theirs[lo:hi]), lengths=lengths,
                            kinds=all_differences(oracle, mine, theirs), **head)


__all__ = ["SNIPPET", "VendorComparison", "all_differences", "compare_vendor", "first_difference", "section_at", "template_ids"]
