"""Vendor renderers against the Hugging Face templates, on the template-family conversations.

For each vendor (`ctxkit.text.vendor.VENDORS`) and each generated conversation (`family_conversations`:
system, multi-turn, several tool calls per turn, a tool error, reasoning), with and without the generation
prompt:

- *vendor*: `render(..., template="vendor:<name>")` completes (ids and a derived loss mask) or refuses with
  a `VendorRenderError`;
- *vs HF*: the vendor's ids against the Hugging Face template on the matching tokenizer (`compare_vendor`):
  `mistral-v3` against the stock Mistral 7B v0.3 template and tokenizer (`<shared>/tokenizers/
  mistral-7b-instruct-v0.3`, converted from the same `tokenizer.model.v3`; TRL ships no Mistral template),
  `harmony` against TRL's `gptoss` template on `tiktoken:o200k_harmony` (o200k_base plus the harmony
  specials), both at the vendor's date. `mistral-v7` and `mistral-tekken` have no Hugging Face template
  here (none is shipped in an installed package or in shared/), so they are checked as renderers only.

`python -m ctxkit.benchmarks.vendor_oracles [--details]` prints the table vendor x tokenizer x conversations:
renders, ids equal to HF, differing, refused, the kinds of the first differences and of every difference.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ctxkit.benchmarks.family_conversations import family_conversations
from ctxkit.benchmarks.template_families import FamilySpec, templates_dir
from ctxkit.errors import CtxkitError

SPEC = FamilySpec(bos=None, eos="", specials=(), tools=True, system=True)
"""The conversations every vendor gets: all shapes, tools and a system prompt included."""


@dataclass(frozen=True)
class OracleCheck:
    """One conversation through one vendor."""

    vendor: str
    """Vendor name."""
    conversation: str
    """Conversation name (`family_conversations`)."""
    add_generation_prompt: bool
    """Whether the generation prompt was added."""
    renders: str
    """`yes` (ids and mask) | the `VendorRenderError` text."""
    outcome: str
    """`compare_vendor`'s outcome, or `no HF template`."""
    kind: str | None = None
    """The first difference's section kind (`different` only)."""
    position: int | None = None
    """The first differing token (`different` only)."""
    snippets: tuple[str, str] = ("", "")
    """(vendor, HF) decoded around the first difference."""
    kinds: tuple[str, ...] = ()
    """Every section kind where the ids differ (`compare.all_differences`)."""


def references(shared) -> dict[str, tuple[Any, Any]]:
    """Vendor name -> (ctxkit tokenizer, chat template) of its Hugging Face counterpart."""
    from ctxkit.text.template.chat_template import load_template  # lazy: the reference side only
    from ctxkit.text.tokenizer.loader import load_tokenizer  # lazy: the reference side only

    mistral = load_tokenizer(str(shared / "tokenizers" / "mistral-7b-instruct-v0.3"))
    harmony = load_tokenizer("tiktoken:o200k_harmony")
    gptoss = load_template(str(templates_dir().joinpath("gptoss.jinja")), harmony)  # TRL's, read in place
    return {"mistral-v3": (mistral, load_template(None, mistral)), "harmony": (harmony, gptoss),
            "harmony-keep-analysis": (harmony, gptoss)}


def check(vendor: str, conversation: str, agp: bool, refs: dict) -> OracleCheck:
    """Render one conversation through `vendor` and compare it with its HF counterpart (module docstring)."""
    from ctxkit.text.rendering.renderer import render  # lazy: L3 entry point
    from ctxkit.text.vendor.compare import compare_vendor  # lazy: L3 entry point

    msgs, tools = family_conversations(SPEC)[conversation]
    try:
        render(msgs, None, template=f"vendor:{vendor}", tools=tools, add_generation_prompt=agp)
        renders = "yes"
    except CtxkitError as exc:
        renders = f"{type(exc).__name__}: {exc}"
    where = dict(vendor=vendor, conversation=conversation, add_generation_prompt=agp, renders=renders)
    if vendor not in refs:
        return OracleCheck(outcome="no HF template", **where)
    tok, tpl = refs[vendor]
    c = compare_vendor(f"vendor:{vendor}", msgs, tok, tpl, tools=tools, add_generation_prompt=agp)
    return OracleCheck(outcome=c.outcome, kind=c.kind, position=c.position, snippets=(c.vendor_text, c.template_text),
                       kinds=c.kinds, **where)


def vendor_rows(checks: list[OracleCheck], tokenizer_of: dict[str, str]) -> list[str]:
    """Markdown rows: vendor | tokenizer | conversations | renders | equal | different | refused | kinds."""
    out = []
    for vendor in dict.fromkeys(c.vendor for c in checks):
        mine = [c for c in checks if c.vendor == vendor]
        compared = [c for c in mine if c.outcome != "no HF template"]
        kinds = Counter(c.kind for c in compared if c.outcome == "different")
        every = Counter(k for c in compared for k in c.kinds)
        refused = Counter(c.outcome for c in compared if "refuse" in c.outcome)
        hf = lambda n: f"{n}/{len(compared)}" if compared else "-"  # noqa: E731 - a column format
        out.append(f"| {vendor} | {tokenizer_of[vendor]} | {len(mine)} | {sum(c.renders == 'yes' for c in mine)}/{len(mine)} "
                   f"| {hf(sum(c.outcome == 'equal' for c in compared))} | {hf(sum(c.outcome == 'different' for c in compared))} "
                   f"| {', '.join(f'{k} {n}' for k, n in sorted(refused.items())) or '-'} "
                   f"| {', '.join(f'{k} {n}' for k, n in kinds.most_common()) or '-'} "
                   f"| {', '.join(f'{k} {n}' for k, n in every.most_common()) or '-'} |")
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the table (and, with `--details`, every refusal and first difference)."""
    from ctxkit.text.tokenizer.tiktoken_files import shared_dir  # lazy: where the shared fixtures are
    from ctxkit.text.vendor.oracle import VENDORS, load_vendor  # lazy: vendor packages load here

    parser = argparse.ArgumentParser(prog="python -m ctxkit.benchmarks.vendor_oracles", description=__doc__)
    parser.add_argument("vendors", nargs="*", help=f"vendor names (default: all of {sorted(VENDORS)})")
    parser.add_argument("--details", action="store_true", help="also print every refusal and first difference")
    args = parser.parse_args(argv)
    vendors = args.vendors or list(VENDORS)
    refs = references(shared_dir())
    checks = [check(v, c, agp, refs) for v in vendors for c in family_conversations(SPEC) for agp in (False, True)]
    oracles = {v: load_vendor(f"vendor:{v}") for v in vendors}
    print("vendors: " + ", ".join(sorted({o.template_id.split("@")[0].split("/")[1] for o in oracles.values()})))
    print("| vendor | vendor tokenizer | renders (conv x gen. prompt) | vendor renders + mask | ids equal to HF | "
          "differ from HF | refused | first difference (section of the vendor render) | every difference |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(vendor_rows(checks, {v: o.tokenizer_id for v, o in oracles.items()})))
    if args.details:
        for c in checks:
            if c.renders != "yes":
                print(f"{c.vendor} {c.conversation} agp={c.add_generation_prompt}: vendor refuses: {c.renders}")
            if c.outcome == "different":
                print(f"{c.vendor} {c.conversation} agp={c.add_generation_prompt}: first difference at {c.position} "
                      f"({c.kind}; all: {', '.join(c.kinds)}): vendor {c.snippets[0]!r} | HF {c.snippets[1]!r}")
            elif c.outcome not in ("equal", "no HF template"):
                print(f"{c.vendor} {c.conversation} agp={c.add_generation_prompt}: {c.outcome}")
    return 0


if __name__ == "__main__":  # pragma: no cover - the report script
    sys.exit(main())


__all__ = ["OracleCheck", "SPEC", "check", "main", "references", "vendor_rows"]
