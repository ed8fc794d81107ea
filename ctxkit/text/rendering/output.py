"""A renderer's output: the rendered-context records and their assembly from the renderer's state.

Part of `ctxkit.text.rendering.renderer` (which re-exports the records): `MessageSpan`, `Drift`, `RenderedContext`,
`context_hash`, and `assemble`, which builds a render's `RenderedContext` from the renderer's `RenderState`:
it puts sampled ids in place of their rendered ids (`Sub`, kept between renders), computes spans and
resumes the context hash (`resume_hash`).
"""

from __future__ import annotations

import bisect
import hashlib
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from ctxkit.errors import RenderError
from ctxkit.text.rendering.state import RenderState

@dataclass(frozen=True)
class MessageSpan:
    """Token range of one message's own text in a rendered context (scaffold around it excluded)."""

    index: int
    """Index of the message in the list rendered."""
    role: str
    """The message's role."""
    start: int
    """First token (inclusive)."""
    end: int
    """Last token (exclusive); for assistant turns this is the produced region, end-of-turn included."""


@dataclass(frozen=True)
class Drift:
    """A sampled assistant turn whose ids differ from the template's re-rendering of it."""

    message_index: int
    """Index of the assistant message."""
    position: int
    """Token position (in the rendered context) of the first differing token."""
    sampled_ids: tuple[int, ...]
    """The differing run of sampled ids (kept in the context)."""
    rendered_ids: tuple[int, ...]
    """The run the template plus tokenizer would have produced in their place."""
    reason: str = "unexplained"
    """Why they differ: one of `ctxkit.text.rendering.drift_reasons.DRIFT_REASONS` (decided from the whole
    sampled and rendered turn by `classify_drift`)."""


@dataclass(frozen=True)
class RenderedContext:
    """A conversation rendered through a template and tokenizer."""

    token_ids: tuple[int, ...]
    """The ids, identical to `apply_chat_template(..., tokenize=True)` (sampled ids kept verbatim)."""
    loss_mask: tuple[int, ...]
    """1 on tokens the policy produced (assistant turns, end-of-turn included), 0 elsewhere."""
    roles: tuple[str, ...]
    """Per token: system | user | assistant | tool | scaffold | generation_prompt."""
    spans: tuple[MessageSpan, ...]
    """Token range of each message's own text (empty range if the template drops it)."""
    drifts: tuple[Drift, ...]
    """Token-in-token-out drifts: sampled turns the template would tokenize differently."""
    template_id: str
    """Id of the template used."""
    tokenizer_id: str
    """Id of the tokenizer used."""
    prefix_preserving: bool
    """Whether the template is prefix-preserving (see `TemplateReport.prefix_preserving`)."""
    hash: str
    """`context_hash(token_ids)`."""
    special_tokens_in_content: tuple = ()
    """`ctxkit.text.special_tokens.SpecialTokenInContent` records: special-token text found in message content."""

    def __len__(self) -> int:
        return len(self.token_ids)


def context_hash(token_ids: Iterable[int]) -> str:
    """sha256 hex of `b"ctxkit-context-v1"` followed by the ids as little-endian int32."""
    h = hashlib.sha256(b"ctxkit-context-v1")
    h.update(int32_bytes(list(token_ids)))
    return h.hexdigest()


def int32_bytes(ids: Sequence[int]) -> bytes:
    """The ids as little-endian int32 (`struct` packs twice as fast as an `array` of a tuple)."""
    return struct.pack(f"<{len(ids)}i", *ids)


HASH_STEP = 256
"""Tokens between two checkpoints of `resume_hash`."""


@dataclass(slots=True)
class Sub:
    """One sampled turn's ids put in place of its rendered ids (kept between renders)."""

    index: int  # message index
    a: int  # rendered token range replaced
    z: int
    start: int  # output token range of the sampled ids
    end: int
    shift: int  # cumulative length change after it
    drift: Drift | None


def _index(region) -> int:
    return region.index


HISTORY_MODES: tuple[str, ...] = ("sampled", "template")
"""How a sampled turn the template re-renders otherwise enters the context: `sampled` keeps the sampled ids
verbatim everywhere (prefix-preserving; each such turn is a `Drift` with its reason); `template` puts the
template's own render in place of a turn whose reasoning it drops from history (`thinking_stripped`), so the
context equals `apply_chat_template` there and the next training sample starts where the template rewrote
history (any other drift keeps the sampled ids, as in `sampled`)."""

Classify = Callable[[Sequence[int], Sequence[int]], str]
"""`(sampled turn ids, rendered turn ids) -> reason` (`drift_reasons.classify_drift` bound to a tokenizer)."""


def assemble(st: RenderState, profile: Any, template_id: str, tokenizer_id: str, changed: int,
             classify: Classify | None = None, history: str = "sampled") -> RenderedContext:
    """The context of the last render; `changed` is the first rendered token that may differ from last time.
    `classify` gives each new drift its reason (None: `unexplained`); `history` is one of `HISTORY_MODES`.

    Sampled-id substitutions are kept between renders: those wholly before `changed` (same turn,
    same token range) are reused with the output before them; only later ones are redone. The output
    is copied up to the end of the last substitution that changes it (`st.out_at`), never past it."""
    produced = _kept_subs(st, changed)
    subs = st.subs
    cut, shift = (subs[-1].z, subs[-1].shift) if subs else (0, 0)
    reused_to = cut
    out_at = _substitute(st, produced, profile.end_of_turn_id, cut, shift, classify, history == "template",
                         template_id)
    drifts = [subs[j].drift for j in st.sub_cols[3]]
    ids, mask, roles = st.ids, st.mask, st.roles
    if not out_at:  # every substitution (if any) is an identity
        token_ids, loss_mask, token_roles = tuple(ids), tuple(mask), tuple(roles)
    else:
        o_ids, o_mask, o_roles = st.out
        token_ids, loss_mask, token_roles = (_joined(o_ids, ids, out_at), _joined(o_mask, mask, out_at),
                                             _joined(o_roles, roles, out_at))
    out_changed = _output_changed(st, changed)
    spans = _spans(st, reused_to)
    if st.n_assistant and not any(loss_mask):
        raise RenderError("loss mask is all zero although the conversation has assistant turns")
    return RenderedContext(
        token_ids=token_ids,
        loss_mask=loss_mask,
        roles=token_roles,
        spans=spans,
        drifts=tuple(drifts),
        template_id=template_id,
        tokenizer_id=tokenizer_id,
        prefix_preserving=profile.prefix_preserving,
        hash=resume_hash(st.hash_cp, token_ids, out_changed),
    )


def _joined(out: list, rendered: list, at: int) -> tuple:
    """`tuple(out + rendered[at:])` in one copy of `out` (which is left as it was): `(*out, *rendered[at:])`
    builds a list and copies it again, six times slower on a long context."""
    n = len(out)
    out += rendered[at:]
    try:
        return tuple(out)
    finally:
        del out[n:]


def _kept_subs(st: RenderState, changed: int) -> list:
    """Drop the substitutions not reused from the last output (`st.subs` and `st.sub_cols` in step); return
    the produced regions after the ones kept whose sampled ids must be put in place."""
    subs, regions = st.subs, st.regions
    # per substitution, kept in step with `subs`: its rendered end, the cumulative shift after it, its
    # message; and the positions in `subs` of those with a drift (`cut` and `reset_rendered` only shorten `subs`)
    sub_ends, sub_shift, sub_index, drift_at = st.sub_cols
    if len(sub_ends) > len(subs):
        del sub_ends[len(subs):], sub_shift[len(subs):], sub_index[len(subs):]
        del drift_at[bisect.bisect_left(drift_at, len(subs)):]
    # Reused: the substitutions wholly before `changed` of the regions unchanged since the last output
    # (`span_dirty`: same regions, same token ranges, so the same produced regions before them).
    m = min(st.span_dirty, len(regions))
    k = min(bisect.bisect_right(sub_ends, changed),
            bisect.bisect_left(sub_index, regions[m].index) if m < len(regions) else len(subs))
    if st.any_sampled:
        pos = bisect.bisect_right(regions, sub_index[k - 1], key=_index) if k else 0
        sampled_of = st.sampled
        produced = [r for r in regions[pos:] if r.kind == "produced" and sampled_of[r.index] is not None]
    else:
        produced = []
    del subs[k:], sub_ends[k:], sub_shift[k:], sub_index[k:]
    del drift_at[bisect.bisect_left(drift_at, k):]
    return produced


def _substitute(st: RenderState, produced: list, eot_id: int | None, cut: int, shift: int,
                classify: Classify | None, template_history: bool, template_id: str) -> int:
    """Put the sampled ids of the `produced` regions in place (after the kept substitutions, which end at
    rendered token `cut` with cumulative `shift`), extending `st.out`; return the new `st.out_at`. With
    `template_history`, a turn whose drift is `thinking_stripped` keeps the template's render instead.
    A turn whose first character is inside a rendered token (the template writes it right after text the
    tokenizer merges with it: Qwen 3.5's prompt ends `<think>\n` and the turn's `\n` joins it as `\n\n`) keeps
    the render when its sampled ids are the rendered ones from the next token on, and is refused when they
    differ: other ids put there may repeat that token's text."""
    ids, mask, roles = st.ids, st.mask, st.roles
    subs = st.subs
    sub_ends, sub_shift, sub_index, drift_at = st.sub_cols
    o_ids, o_mask, o_roles = st.out  # the output of rendered tokens [0, out_at), out_at a sub's end
    out_at = st.out_at
    if out_at > cut:
        del o_ids[cut + shift :], o_mask[cut + shift :], o_roles[cut + shift :]
        out_at = cut
    for r in produced:
        sampled = st.sampled[r.index]
        a, z = r.tokens
        rendered = ids[a:z]
        n = z - a
        sub_ends.append(z)
        sub_index.append(r.index)
        identity = (len(sampled) == n and rendered == list(sampled) and mask[a:z].count(1) == n
                    and roles[a:z].count("assistant") == n)
        compare = rendered
        finished_by_length = (eot_id is not None and (not sampled or sampled[-1] != eot_id) and bool(rendered)
                              and rendered[-1] == eot_id)
        if finished_by_length:
            compare = rendered[:-1]  # finished by length: the template's end-of-turn stays, as scaffold
        reason = None
        if not identity and list(sampled) != compare:
            reason = classify(sampled, compare) if classify is not None else "unexplained"
            identity = template_history and reason == "thinking_stripped"
        if identity:  # its output is the render itself
            subs.append(Sub(r.index, a, z, a + shift, z + shift, shift, None))
            sub_shift.append(shift)
            continue
        if reason is not None and st.starts[a] != r.start:
            raise RenderError(_straddled(st, r, template_id))
        out_ids, out_mask, out_roles = list(sampled), [1] * len(sampled), ["assistant"] * len(sampled)
        if finished_by_length:
            out_ids.append(eot_id)
            out_mask.append(0)
            out_roles.append("scaffold")
        pos0 = a + shift
        drift = None
        if reason is not None:
            drift = _drift(r.index, pos0, sampled, compare, reason)
            drift_at.append(len(subs))
        o_ids += ids[out_at:a]
        o_ids += out_ids
        o_mask += mask[out_at:a]
        o_mask += out_mask
        o_roles += roles[out_at:a]
        o_roles += out_roles
        shift += len(out_ids) - (z - a)
        subs.append(Sub(r.index, a, z, pos0, pos0 + len(sampled), shift, drift))
        sub_shift.append(shift)
        out_at = z
    st.out_at = out_at
    return out_at


def _straddled(st: RenderState, r: Any, template_id: str) -> str:
    """Why the sampled ids of produced region `r` cannot be put in place: a rendered token spans its start."""
    a = r.tokens[0]
    return (f"message {r.index}: template {template_id} writes the assistant turn right after text it merges with "
            f"(rendered token {st.ids[a - 1]} at char {st.starts[a - 1]} spans the turn's start at char {r.start}); "
            "sampled ids cannot be put there without repeating that token's text (give this message without "
            "token_ids to render it as history)")


def _drift(index: int, pos0: int, sampled: Sequence[int], compare: list[int], reason: str) -> Drift:
    """The `Drift` of message `index`'s sampled ids against the rendered ones (`compare`), the turn's
    output starting at token `pos0`: the differing run between their common prefix and suffix, and why."""
    p = 0
    limit = min(len(sampled), len(compare))
    while p < limit and sampled[p] == compare[p]:
        p += 1
    q = 0
    while q < limit - p and sampled[-1 - q] == compare[-1 - q]:
        q += 1
    return Drift(index, pos0 + p, tuple(sampled[p : len(sampled) - q]), tuple(compare[p : len(compare) - q]), reason)


def _output_changed(st: RenderState, changed: int) -> int:
    """The first output token that may differ from the last output, for rendered token `changed`."""
    sub_ends, sub_shift = st.sub_cols[0], st.sub_cols[1]
    k = bisect.bisect_right(sub_ends, changed)
    out_changed = changed + (sub_shift[k - 1] if k else 0)
    for sub in st.subs[k:]:  # a substitution straddling `changed` may have moved: hash from its start
        if sub.a < changed < sub.z:
            out_changed = min(out_changed, sub.start)
    return out_changed


def _spans(st: RenderState, reused_to: int) -> tuple[MessageSpan, ...]:
    """The spans of the output (one per message). Those of leading regions unchanged since the last output
    (same token range, same substitutions before them, which end at rendered token `reused_to`) are kept;
    the rest are recomputed."""
    regions, subs, chat = st.regions, st.subs, st.chat
    sub_ends, sub_shift, sub_index = st.sub_cols[0], st.sub_cols[1], st.sub_cols[2]
    spans, at = st.span_list, st.span_at
    p = min(st.span_dirty, len(regions), len(at) - 1)
    if st.any_sampled:
        starts = st.starts
        p = min(p, bisect.bisect_right(st.prefix_max, starts[reused_to]) if reused_to < len(starts) else p)
    del spans[at[p] :], at[p + 1 :]
    for r in regions[p:]:
        if r.kind != "header":
            j = bisect.bisect_left(sub_index, r.index) if r.kind == "produced" else len(subs)
            if j < len(subs) and sub_index[j] == r.index:
                spans.append(MessageSpan(r.index, r.role, subs[j].start, subs[j].end))
            else:
                a, z = r.tokens
                d = 0
                if sub_ends:
                    k = bisect.bisect_right(sub_ends, a)
                    d = sub_shift[k - 1] if k else 0
                if r.span is None or r.span.start != a + d:
                    r.span = MessageSpan(r.index, chat[r.index]["role"], a + d, z + d)
                spans.append(r.span)
        at.append(len(spans))
    st.span_dirty = len(regions)
    if len(spans) < len(chat):
        seen = {sp.index for sp in spans}
        return tuple(sorted(spans + [MessageSpan(i, m["role"], 0, 0) for i, m in enumerate(chat) if i not in seen],
                            key=lambda sp: sp.index))
    return tuple(spans)


def resume_hash(cps: list, token_ids: tuple[int, ...], changed: int) -> str:
    """`context_hash(token_ids)`, resuming from the latest checkpoint in `cps` (`RenderState.hash_cp`) at or
    before `changed` (the first token that may differ from the last output). Checkpoints are kept every
    `HASH_STEP` tokens, so a build hashes at most that many unchanged tokens again (one after a compaction too)."""
    while cps and cps[-1][0] > changed:
        cps.pop()
    n, h = cps[-1] if cps else (0, None)
    h = hashlib.sha256(b"ctxkit-context-v1") if h is None else h.copy()
    end = len(token_ids)
    step = (n // HASH_STEP + 1) * HASH_STEP
    while step <= end:
        h.update(int32_bytes(token_ids[n:step]))
        n = step
        cps.append((n, h.copy()))
        step += HASH_STEP
    h.update(int32_bytes(token_ids[n:end]))
    return h.hexdigest()
