"""Why two token sequences that should extend each other do not: the closed vocabulary of drift reasons.

Two places record a reason from `DRIFT_REASONS`: a `Drift` (a sampled assistant turn whose ids differ from the
template's re-rendering of it, `classify_drift`) and a non-prefix transition between two steps of an episode
(a training sample that had to split because the next context does not extend the tokens so far,
`classify_transition`). Both compare an *old* run of ids (the sampled turn; the sample so far) with a *new*
one (the rendered turn; the next context) and decide from where they first differ:

- `compaction`: a compaction was recorded between the two steps (the caller says so);
- `bos_duplication`: one side starts with the begin-of-sequence token twice, the other once (a rendered text
  that writes `bos_token` tokenized again with the tokenizer's own BOS);
- `context_truncated`: the new context is a strict prefix of the old tokens (a client cut the history
  without recording a compaction, e.g. a max-length truncation);
- `special_token_escape`: the same text, one side holding a special or added token as its own id where the
  other spells it in ordinary pieces;
- `bpe_merge`: the same text, tokenized at other boundaries;
- `thinking_stripped`: the difference sits in, or removes, a reasoning block (`<think>`, gpt-oss `analysis`);
- `value_roundtrip`: inside a tool call, a JSON literal re-spelled by a parse and re-render (`false` ->
  `False`, `null` -> `None`);
- `tool_call_reformat`: inside (or removing/adding) a tool call, its text re-formatted;
- `whitespace_normalized`: the texts differ in whitespace only (a template that strips or trims content);
- `default_system_prompt`: the difference sits in the system prompt a template writes when no system message
  is given (`template_default_system`), present on one side only;
- `template_rewrite` (first form): one run of special tokens written as another (gpt-oss ends a final turn
  with `<|return|>`, the same turn in history with `<|end|>`);
- `history_edited`: a sampled token's text changed otherwise: the message given as history is not what the
  policy sampled (a scaffold rewrote it);
- `template_rewrite` (second form): the template wrote an earlier, unsampled part of the conversation otherwise (Mistral
  moves its system prompt to the last user turn);
- `unexplained`: none of the above could be decided (no loss mask given to tell sampled from rendered
  tokens, or no tokenizer to decode with). A `Drift` made without a reason has this one.

The checks run in that order; the first that holds is the reason. They cover the cases PrimeIntellect's
`renderers` lists for a turn that cannot extend the previous one (BPE retokenization drift, tool-call
re-formatting, the boolean round trip, max-length truncation, scaffold-level history rewriting, reasoning
dropped by the thinking-retention policy). Imports L0 only (`ctxkit.errors`); the tokenizer is passed in
(`decode`, `special_tokens`, `bos_token`).
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Mapping, Sequence

from ctxkit.errors import CtxkitError

DRIFT_REASONS: tuple[str, ...] = (
    "compaction", "bos_duplication", "context_truncated", "special_token_escape", "bpe_merge", "thinking_stripped",
    "value_roundtrip", "tool_call_reformat", "whitespace_normalized", "default_system_prompt", "history_edited",
    "template_rewrite", "unexplained",
)
"""Every reason a drift or a non-prefix transition can carry, in the order the classifier checks them."""

UNEXPLAINED = "unexplained"
"""The reason of a drift or transition nothing explains (and of a `Drift` made without one)."""

REASONING_BLOCKS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"), ("<seed:think>", "</seed:think>"), ("◁think▷", "◁/think▷"),
    ("<|channel|>analysis<|message|>", "<|end|>"), ("<|channel>thought", "<channel|>"),
)
"""(open, close) texts of reasoning blocks: the `<think>` families (Qwen3, DeepSeek R1, GLM, Kimi, Nemotron),
Seed, Kimi's `◁think▷`, gpt-oss's analysis channel, Gemma 4's thought channel."""

PREFILLED_BLOCKS: tuple[tuple[str, str], ...] = REASONING_BLOCKS[:3]
"""Reasoning blocks a generation prompt may open (`<think>`): their closer alone, with no opener before it,
still marks reasoning (gpt-oss's `<|end|>` closes every message, so it does not)."""

TOOL_CALL_BLOCKS: tuple[tuple[str, str], ...] = (
    ("<tool_call>", "</tool_call>"), ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"),
    ("<|tool_call_begin|>", "<|tool_call_end|>"), ("<|tool_call_start|>", "<|tool_call_end|>"),
    ("<|tool_call>", "<tool_call|>"), ("[TOOL_CALLS]", "</s>"), ("to=functions.", "<|call|>"),
    ("<|python_tag|>", "<|eom_id|>"),
)
"""(open, close) texts of tool-call markup: ChatML/Qwen/GLM/Nemotron, DeepSeek, Kimi, LFM2, Gemma 4, Mistral,
gpt-oss (a commentary message to a function), Llama 3.1."""

_LITERALS = re.compile(r"\b(true|false|null|True|False|None)\b")
_LITERAL_FORM = {"true": "True", "false": "False", "null": "None"}


def _inside(text: str, pos: int, blocks: tuple[tuple[str, str], ...], prefilled: bool = False) -> bool:
    """Whether char `pos` of `text` lies inside an open block: its opener before `pos` and no closer between,
    or, with `prefilled` (a block opened before `text` begins, e.g. a `<think>` the generation prompt
    prefilled), no opener or closer before `pos` and a closer after it."""
    for opener, closer in blocks:
        at = text.rfind(opener, 0, pos + len(opener))
        if at >= 0 and text.find(closer, at + len(opener), pos) < 0:
            return True
        if (prefilled and (opener, closer) in PREFILLED_BLOCKS and at < 0 and text.find(closer, pos) >= 0
                and text.find(closer, 0, pos) < 0):
            return True
    return False


def _mentions(text: str, blocks: tuple[tuple[str, str], ...], closers: bool) -> bool:
    """Whether `text` holds a block's opener (or, with `closers`, the closer of a `PREFILLED_BLOCKS` block)."""
    return any(o in text or (closers and (o, c) in PREFILLED_BLOCKS and c in text) for o, c in blocks)


def _first_change(old: Sequence[int], new: Sequence[int], p: int) -> tuple[int, int, int, int]:
    """`(i1, i2, j1, j2)`: the first differing run `old[i1:i2]` vs `new[j1:j2]` from token `p` on."""
    matcher = difflib.SequenceMatcher(None, old[p:], new[p:], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            return p + i1, p + i2, p + j1, p + j2
    return len(old), len(old), len(new), len(new)  # pragma: no cover - the runs differ from p on


def classify(old: Sequence[int], new: Sequence[int], tokenizer: Any, *, old_mask: Sequence[int] | None = None,
             compacted: bool = False, default_system: str | None = None, whole: bool = False) -> str:
    """The reason (one of `DRIFT_REASONS`) why `new` does not start with `old` (see the module docstring).

    `old_mask`: 1 on the old tokens the policy sampled (None: unknown); `compacted`: a compaction was recorded
    between them; `default_system`: the template's default system prompt (`template_default_system`);
    `whole`: `new` stands in place of all of `old` (a drift: the rendered turn vs the sampled one), so a
    shorter `new` is no truncation."""
    old, new = list(old), list(new)
    if compacted:
        return "compaction"
    if tokenizer is None:
        return UNEXPLAINED
    bos = tokenizer.special_tokens.get(tokenizer.bos_token) if getattr(tokenizer, "bos_token", None) else None
    if bos is not None and old[:1] == new[:1] == [bos] and (old[1:2] == [bos]) != (new[1:2] == [bos]):
        return "bos_duplication"
    p = 0
    limit = min(len(old), len(new))
    while p < limit and old[p] == new[p]:
        p += 1
    if p == len(old) and not whole:
        return UNEXPLAINED  # `new` extends `old`: nothing to explain
    if p == len(new) and not whole:
        return "context_truncated"
    i1, i2, j1, j2 = (p, len(old), p, len(new)) if whole else _first_change(old, new, p)
    if whole:  # the common suffix of a turn is no part of the change
        while i2 > i1 and j2 > j1 and old[i2 - 1] == new[j2 - 1]:
            i2, j2 = i2 - 1, j2 - 1
    decode = tokenizer.decode
    # runs decoded after what precedes them (a SentencePiece decoder writes a leading space otherwise)
    before, old_to, new_before, new_to = decode(old[:i1]), decode(old[:i2]), decode(new[:j1]), decode(new[:j2])
    if old_to == new_to:
        specials = set(tokenizer.special_tokens.values())
        mine, theirs = [t for t in old[i1:i2] if t in specials], [t for t in new[j1:j2] if t in specials]
        return "special_token_escape" if mine != theirs else "bpe_merge"
    removed = old_to[len(before):] if old_to.startswith(before) else decode(old[i1:i2])
    inserted = new_to[len(new_before):] if new_to.startswith(new_before) else decode(new[j1:j2])
    at = len(before)
    old_text, new_text = decode(old), decode(new)
    if _inside(old_text, at, REASONING_BLOCKS, True) or _inside(new_text, at, REASONING_BLOCKS, True) or \
            _mentions(removed, REASONING_BLOCKS, True) or _mentions(inserted, REASONING_BLOCKS, True):
        return "thinking_stripped"
    if _inside(old_text, at, TOOL_CALL_BLOCKS) or _inside(new_text, at, TOOL_CALL_BLOCKS) or \
            _mentions(removed, TOOL_CALL_BLOCKS, False) or _mentions(inserted, TOOL_CALL_BLOCKS, False):
        return "value_roundtrip" if _same_values(removed, inserted) else "tool_call_reformat"
    if "".join(removed.split()) == "".join(inserted.split()):
        return "whitespace_normalized"
    if default_system:
        for text, other in ((old_text, new_text), (new_text, old_text)):
            d = text.find(default_system)
            if 0 <= d <= at <= d + len(default_system) and other.find(default_system) != d:
                return "default_system_prompt"
    specials = set(tokenizer.special_tokens.values())
    if old[i1:i2] and new[j1:j2] and set(old[i1:i2]) <= specials and set(new[j1:j2]) <= specials:
        return "template_rewrite"  # one scaffold token for another (gpt-oss closes a final `<|return|>` in history `<|end|>`)
    if old_mask is None:
        return UNEXPLAINED
    sampled = any(old_mask[i] for i in range(max(0, i1 - 1), min(len(old_mask), max(i2, i1 + 1))))
    return "history_edited" if sampled else "template_rewrite"


def _same_values(a: str, b: str) -> bool:
    """Whether `a` and `b` differ only in the spelling of JSON literals (`false` vs `False`, ...)."""
    if not (_LITERALS.search(a) or _LITERALS.search(b)):
        return False

    def norm(s: str) -> str:
        return _LITERALS.sub(lambda m: _LITERAL_FORM.get(m.group(1), m.group(1)), s)
    return norm(a) == norm(b)


def classify_drift(sampled_ids: Sequence[int], rendered_ids: Sequence[int], tokenizer: Any) -> str:
    """The reason a sampled assistant turn's ids (`sampled_ids`, the whole turn) differ from the template's
    re-rendering of it (`rendered_ids`): every sampled token is the policy's (`old_mask` all 1)."""
    return classify(sampled_ids, rendered_ids, tokenizer, old_mask=[1] * len(sampled_ids), whole=True)


def classify_transition(old_ids: Sequence[int], old_mask: Sequence[int] | None, new_ids: Sequence[int],
                        tokenizer: Any, *, compacted: bool = False, default_system: str | None = None) -> str:
    """The reason the next context `new_ids` does not extend a sample's tokens so far `old_ids` (`old_mask`:
    its loss mask, 1 on sampled tokens); `compacted`: a compaction was recorded between the two steps."""
    return classify(old_ids, new_ids, tokenizer, old_mask=old_mask, compacted=compacted,
                    default_system=default_system)


def template_default_system(template: Any) -> str | None:
    """The system prompt `template` (a `ChatTemplate`) writes when the conversation has no system message, or
    None when it writes none (found by rendering a user turn alone and beside a system message)."""
    user, system = "\x00u\x00", "\x00s\x00"
    try:
        alone = template.render_text([{"role": "user", "content": user}])
        both = template.render_text([{"role": "system", "content": system}, {"role": "user", "content": user}])
    except CtxkitError:  # a template that refuses a system message has no default one to find
        return None
    s = both.find(system)
    if s < 0 or both.find(user) < 0:
        return None
    head, between = both[:s], both[s + len(system): both.find(user)]
    if not head or not alone.startswith(head):
        return None
    end = alone.find(between + user, len(head))
    default = alone[len(head): end] if end > len(head) else ""
    return default or None


def count_reasons(reasons: Sequence[str] | Mapping[str, int]) -> dict[str, int]:
    """Reason -> count, every reason of `DRIFT_REASONS` present (0 when absent), in vocabulary order."""
    counts = dict.fromkeys(DRIFT_REASONS, 0)
    items = reasons.items() if isinstance(reasons, Mapping) else ((r, 1) for r in reasons)
    for r, n in items:
        counts[r if r in counts else UNEXPLAINED] += n
    return counts


__all__ = ["DRIFT_REASONS", "REASONING_BLOCKS", "TOOL_CALL_BLOCKS", "UNEXPLAINED", "classify", "classify_drift",
           "classify_transition", "count_reasons", "template_default_system"]
