"""Conformance of ctxkit's renderer with `apply_chat_template` over every stock template TRL ships.

For each family (`template_families.FAMILIES`) and each conversation (`family_conversations`), with and
without the generation prompt:

- *ids*: `ctxkit.render` through the family's tokenizer and TRL's stock template gives the ids
  `apply_chat_template` gives, or both refuse the conversation (a `TemplateError` in ctxkit where the
  template raises in transformers);
- *masks*: ctxkit's marker-free loss mask over TRL's `_training` variant equals that variant's
  `return_assistant_tokens_mask` mask, or the tokens where they differ are listed (`MaskCheck.diffs`).

Templates that print the date (`strftime_now`) are rendered by ctxkit with the clock set to the day the
check runs (`load_template(..., clock=...)`), which is the day transformers reads from the machine's
clock; the date is recorded in every result. `python -m ctxkit.benchmarks.family_conformance` prints the
table family x (renders, ids equal, masks equal, prefix-preserving, thinking policy).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ctxkit.benchmarks.family_conversations import family_conversations
from ctxkit.benchmarks.template_families import family_spec, family_tokenizer, stock_templates, training_name
from ctxkit.errors import CtxkitError, TemplateError


@dataclass(frozen=True)
class IdsCheck:
    """One conversation of one family rendered by ctxkit and by `apply_chat_template`."""

    family: str
    """Stock template name."""
    conversation: str
    """Conversation name (`family_conversations`)."""
    add_generation_prompt: bool
    """Whether the generation prompt was added."""
    outcome: str
    """`equal` (ids equal and the mask covers no user or tool text) | `ids differ` | `mask covers another
    message` | `both refuse` | `ctxkit refuses` | `ctxkit renders what transformers refuses`."""
    error: str | None
    """ctxkit's error (`Type: message`) when it refused, else None."""
    date: str
    """The date both renders saw (ISO), recorded because some templates print it."""


@dataclass(frozen=True)
class MaskCheck:
    """ctxkit's marker-free mask against the `_training` variant's `return_assistant_tokens_mask`."""

    family: str
    """Stock template name."""
    conversation: str
    """Conversation name."""
    add_generation_prompt: bool
    """Whether the generation prompt was added."""
    outcome: str
    """`equal` | `masks differ` | `ids differ` | `ctxkit refuses` | `both refuse` | `no training variant`."""
    diffs: tuple[tuple[str, str], ...] = ()
    """Sorted distinct `(token text, side)` where the masks differ: side `trl` (TRL marks it, ctxkit does
    not) or `ctxkit`."""
    error: str | None = None
    """ctxkit's error when it refused."""


@dataclass(frozen=True)
class FamilyRow:
    """One row of the conformance table."""

    family: str
    renders: str
    """`n/m`: renders (conversation x generation prompt) ctxkit completed, of those transformers completed."""
    ids_equal: str
    """`n/m`: renders whose ids equal `apply_chat_template`'s, of those transformers completed."""
    masks_equal: str
    """`n/m` against the `_training` variant, or `-` when trl ships none."""
    prefix_preserving: bool | None
    """ctxkit's `TemplateProfile.prefix_preserving` of the stock template (None if it cannot be probed)."""
    thinking: str
    """What the stock template does with `reasoning_content`: `none` | `last turn` | `every turn`."""
    date: str
    """The date of the renders."""


class FamilyHarness:
    """The tokenizers of every family (written once under `root`), loaded once for ctxkit and transformers."""

    def __init__(self, shared: Path, root: Path):
        self.shared, self.root = Path(shared), Path(root)
        self._cache: dict[str, tuple[Any, Any, Path]] = {}

    def load(self, family: str) -> tuple[Any, Any, Path]:
        """`(ctxkit Tokenizer, transformers tokenizer, folder)` of `family`."""
        hit = self._cache.get(family)
        if hit is None:
            from transformers import AutoTokenizer  # lazy: the reference side only

            from ctxkit.text.tokenizer.loader import load_tokenizer  # lazy: keeps the module import light

            folder = family_tokenizer(family, self.shared, self.root)
            hit = (load_tokenizer(str(folder)), AutoTokenizer.from_pretrained(str(folder)), folder)
            self._cache[family] = hit
        return hit


def today() -> datetime:
    """The clock ctxkit renders with: today at noon. transformers' `strftime_now` reads the machine's clock,
    so the two agree on the date (no stock template prints the time); one clock per day keeps one template
    id, so ctxkit probes each template once."""
    return datetime.now().replace(hour=12, minute=0, second=0, microsecond=0)


def _hf_ids(hf, msgs, tools, agp: bool, template: str | None = None, mask: bool = False):
    out = hf.apply_chat_template(msgs, tools=tools, tokenize=True, add_generation_prompt=agp, return_dict=True,
                                 chat_template=template, return_assistant_tokens_mask=mask)
    return list(out["input_ids"]), (list(out["assistant_masks"]) if mask else None)


def check_ids(harness: FamilyHarness, family: str, conversation: str, agp: bool) -> IdsCheck:
    """Render one conversation of `family` with ctxkit and transformers (see the module docstring)."""
    from ctxkit.text.rendering.renderer import render  # lazy: L3 entry point
    from ctxkit.text.template.chat_template import load_template  # lazy: L2 entry point

    tok, hf, _ = harness.load(family)
    msgs, tools = family_conversations(family_spec(family))[conversation]
    for _ in range(2):  # a render that straddles midnight is done again
        clock = today()
        try:
            expected, _m = _hf_ids(hf, msgs, tools, agp)
        except Exception:  # noqa: BLE001 - any refusal of the reference template counts as a refusal
            expected = None
        if clock.date() == today().date():
            break
    where = dict(family=family, conversation=conversation, add_generation_prompt=agp, date=clock.date().isoformat())
    try:
        ctx = render(msgs, tok, load_template(None, tok, clock=clock), tools=tools, add_generation_prompt=agp)
    except TemplateError as exc:
        outcome = "both refuse" if expected is None else "ctxkit refuses"
        return IdsCheck(outcome=outcome, error=f"{type(exc).__name__}: {exc}", **where)
    except CtxkitError as exc:
        return IdsCheck(outcome="ctxkit refuses", error=f"{type(exc).__name__}: {exc}", **where)
    if expected is None:
        return IdsCheck(outcome="ctxkit renders what transformers refuses", error=None, **where)
    if list(ctx.token_ids) != expected:
        return IdsCheck(outcome="ids differ", error=None, **where)
    leaked = _masked_other_text(tok, ctx, msgs)
    if leaked:
        return IdsCheck(outcome="mask covers another message", error=f"masked: {leaked!r}", **where)
    return IdsCheck(outcome="equal", error=None, **where)


def masked_runs(tok, ctx) -> list[str]:
    """The text of each maximal run of loss-bearing tokens of a rendered context, in order."""
    runs, cur = [], []
    for t, m in zip(ctx.token_ids, ctx.loss_mask):
        if m:
            cur.append(t)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    return runs + ([tok.decode(cur)] if cur else [])


def _masked_other_text(tok, ctx, msgs) -> str | None:
    """The first user or tool message text that masked tokens hold more often than the assistant messages
    write it (a mask that marks text the policy did not sample), or None."""
    runs = masked_runs(tok, ctx)
    if sum(m["role"] == "assistant" for m in msgs) and not runs:
        return "(nothing masked)"
    own = " ".join(str(m.get(k) or "") for m in msgs if m["role"] == "assistant"
                   for k in ("content", "reasoning_content", "tool_calls"))
    others = [m["content"] for m in msgs if m["role"] in ("user", "tool") and len(m["content"]) > 3]
    # masked more often than the assistant turns write it themselves
    return next((o for o in others if sum(r.count(o) for r in runs) > own.count(o)), None)


def check_mask(harness: FamilyHarness, family: str, conversation: str, agp: bool) -> MaskCheck:
    """ctxkit's mask over `family`'s `_training` variant against transformers' assistant mask of it."""
    from ctxkit.text.rendering.renderer import render  # lazy: L3 entry point
    from ctxkit.text.template.chat_template import load_template  # lazy: L2 entry point

    where = dict(family=family, conversation=conversation, add_generation_prompt=agp)
    name = training_name(family)
    if name is None:
        return MaskCheck(outcome="no training variant", **where)
    tok, hf, folder = harness.load(family)
    path = folder / f"{name}.jinja"
    msgs, tools = family_conversations(family_spec(family))[conversation]
    clock = today()
    try:
        ids, ref = _hf_ids(hf, msgs, tools, agp, path.read_text(encoding="utf-8"), mask=True)
    except Exception:  # noqa: BLE001 - the reference refuses
        ids = ref = None
    try:
        ctx = render(msgs, tok, load_template(str(path), tok, clock=clock), tools=tools, add_generation_prompt=agp)
    except CtxkitError as exc:
        outcome = "both refuse" if ids is None else "ctxkit refuses"
        return MaskCheck(outcome=outcome, error=f"{type(exc).__name__}: {exc}", **where)
    if ids is None or list(ctx.token_ids) != ids:
        return MaskCheck(outcome="ids differ", **where)
    diffs = sorted({(tok.decode([t]), "trl" if r else "ctxkit")
                    for t, m, r in zip(ids, ctx.loss_mask, ref) if m != r})
    return MaskCheck(outcome="equal" if not diffs else "masks differ", diffs=tuple(diffs), **where)


def thinking_policy(harness: FamilyHarness, family: str) -> str:
    """Which turns' `reasoning_content` the stock template renders, from the `reasoning` conversation."""
    from ctxkit.text.template.chat_template import load_template  # lazy: L2 entry point

    tok, _, _ = harness.load(family)
    msgs, _t = family_conversations(family_spec(family))["reasoning"]
    try:
        text = load_template(None, tok).render_text(msgs)
    except TemplateError:
        return "refuses"
    first, last = (m["reasoning_content"] for m in msgs if m.get("reasoning_content"))
    if first in text:
        return "every turn"
    return "last turn" if last in text else "none"


def family_row(harness: FamilyHarness, family: str) -> tuple[FamilyRow, list[IdsCheck], list[MaskCheck]]:
    """The table row of `family` and the checks behind it."""
    from ctxkit.text.template.chat_template import load_template  # lazy: L2 entry point
    from ctxkit.text.template.profile import template_profile  # lazy: L2 entry point

    convs = family_conversations(family_spec(family))
    ids = [check_ids(harness, family, c, agp) for c in convs for agp in (False, True)]
    masks = [check_mask(harness, family, c, agp) for c in convs for agp in (False, True)]
    reference = [r for r in ids if r.outcome != "both refuse"]
    rendered = [r for r in reference if r.outcome in ("equal", "ids differ")]
    compared = [m for m in masks if m.outcome not in ("both refuse", "no training variant")]
    tok, _, _ = harness.load(family)
    try:
        preserving: bool | None = template_profile(tok, load_template(None, tok)).prefix_preserving
    except CtxkitError:
        preserving = None
    row = FamilyRow(
        family=family, renders=f"{len(rendered)}/{len(reference)}",
        ids_equal=f"{sum(r.outcome == 'equal' for r in reference)}/{len(reference)}",
        masks_equal=f"{sum(m.outcome == 'equal' for m in compared)}/{len(compared)}" if training_name(family) else "-",
        prefix_preserving=preserving, thinking=thinking_policy(harness, family), date=ids[0].date,
    )
    return row, ids, masks


def format_table(rows: list[FamilyRow]) -> str:
    """The rows as a Markdown table."""
    head = "| family | renders | ids equal | masks equal | prefix-preserving | thinking |\n|---|---|---|---|---|---|"
    body = [f"| {r.family} | {r.renders} | {r.ids_equal} | {r.masks_equal} | "
            f"{'-' if r.prefix_preserving is None else 'yes' if r.prefix_preserving else 'no'} | {r.thinking} |"
            for r in rows]
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    """Print the conformance table (and, with `--details`, every check that is not equal)."""
    from ctxkit.text.tokenizer.tiktoken_files import shared_dir  # lazy: where the shared fixtures are

    parser = argparse.ArgumentParser(prog="python -m ctxkit.benchmarks.family_conformance", description=__doc__)
    parser.add_argument("families", nargs="*", help="stock template names (default: every one trl ships)")
    parser.add_argument("--details", action="store_true", help="also list every check that is not equal")
    args = parser.parse_args(argv)
    families = args.families or stock_templates()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ctxkit-families-") as tmp:
        harness = FamilyHarness(shared_dir(), Path(tmp))
        for family in families:
            row, ids, masks = family_row(harness, family)
            rows.append(row)
            if args.details:
                for r in ids:
                    if r.outcome not in ("equal", "both refuse"):
                        print(f"{family} {r.conversation} agp={r.add_generation_prompt}: {r.outcome} {r.error or ''}")
                for m in masks:
                    if m.outcome not in ("equal", "both refuse", "no training variant"):
                        print(f"{family} {m.conversation} agp={m.add_generation_prompt} mask: {m.outcome} "
                              f"{list(m.diffs) or ''} {m.error or ''}")
    print(f"date of the renders: {rows[0].date if rows else '-'}")
    print(format_table(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover - the report script
    sys.exit(main())


__all__ = ["FamilyHarness", "FamilyRow", "IdsCheck", "MaskCheck", "check_ids", "check_mask", "family_row",
           "format_table", "main", "masked_runs", "thinking_policy", "today"]
