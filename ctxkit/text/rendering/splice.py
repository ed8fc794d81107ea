"""Rendering a view whose messages changed in a block, from a window around the block.

Part of `ctxkit.text.rendering.renderer`. A compaction changes a view in one block: `window` drops old turns after the
leading messages, `mask-observations` / `truncate-tool-output` rewrite a run of old tool outputs. The new
view is `old[:a] + block + old[len(old) - s:]`: it shares a prefix of `a` messages and a suffix of `s`
messages with a view rendered before. For a local template (`ctxkit.text.template.locality`), the new text is
the old text up to a turn boundary before the block, the render of a short window around the block, and
the old text from a turn boundary after it (`splice_text`), so the kept tail never goes through the
template again. `IncrementalRenderer.splice` (`keep_tail`, `attach_prepared`) also keeps the tail's prepared messages (indexes shifted, the append
checks redone only where their outcome could differ) and, when the tail's text and ids were kept, its
located regions and token labels (shifted, `attach_tail`). Whatever the checks cannot confirm falls back to
the ordinary path.

Exactness argument (the one `text.template.locality.window_delta` makes, on both sides of the block): a local
template renders each message as a piece that depends only on the message, its neighbours within `reach`,
the leading messages and global values. Pieces of messages before `a - reach` and from `b + reach` on (`b`
the first suffix message in the old view) are the same in both views. A window (the leading messages plus
a run of messages) renders the pieces of its messages exactly once they are `reach` messages away from its
ends; the checks confirm it where it cannot be proved: the old window must reproduce the known old text
between its two turn boundaries, and the new window must reproduce the known text before the block and end
with exactly the text the old window ends with after the turn boundary `q` (the same messages, the same
context within reach). The text of the new view is then `old[:start] + new window's middle + old[q:]`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Callable

from ctxkit.errors import TemplateError
from ctxkit.text.rendering.cut import set_core
from ctxkit.text.rendering.segments import made_calls
from ctxkit.text.rendering.state import RenderState

Render = Callable[[list, bool], str]
_MAX_BACK = 64  # messages a window start may move back over (a run of tool results)


@dataclass(frozen=True)
class SpliceHint:
    """What a renderer knew about its last render before a cut: enough to splice the next render's text."""

    text: str
    """The old rendered text (with the generation prompt when `agp`)."""
    chat: tuple
    """The old chat dicts, in order."""
    agp: bool
    """Whether `text` was rendered with the generation prompt."""
    openers: dict
    """Message index -> char of its turn opener in `text` (only messages that open a turn of their own)."""


def _region_index(r: Any) -> int:
    return r.index


def opener_positions(text: str, opener: str, regions: Any, wanted: Callable[[int], bool] = lambda i: True
                     ) -> dict[int, int]:
    """Message index -> char of the turn opener that opens the message's turn in `text`, from the located
    regions (`TextRegion`): the last opener between the previous message's text and this one's; only for
    messages `i` with `wanted(i)` (and their predecessors)."""
    spans: dict[int, list[int]] = {}
    for r in regions:
        if r.kind == "header" or not (wanted(r.index) or wanted(r.index + 1)):
            continue
        got = spans.get(r.index)
        if got is None:
            spans[r.index] = [r.start, r.end]
        else:
            got[0], got[1] = min(got[0], r.start), max(got[1], r.end)
    out: dict[int, int] = {}
    for i, (start, _end) in spans.items():
        prev = spans.get(i - 1)
        if prev is None or prev[1] > start:
            continue
        pos = text.rfind(opener, prev[1], start)
        if pos >= 0:
            out[i] = pos
    return out


def _boundary_at_or_before(openers: dict[int, int], m: int, low: int, chat: Any, max_back: int) -> int | None:
    """The latest message index `g` with `low < g <= m` that opens a turn (in `openers`), or None."""
    g = m
    while g > low and m - g < max_back:
        if g in openers:
            return g
        g -= 1
    return None


def splice_text(render: Render, old: SpliceHint, new_chat: list, a: int, s: int, reach: int, head: str | None,
                max_back: int = _MAX_BACK) -> tuple[str, int] | None:
    """`(text, kept)`: `text` is the render of `new_chat` (with the generation prompt when `old.agp`) from `old` and two window renders,
    where `new_chat[:a]` and `new_chat[len(new_chat) - s:]` are the old view's first `a` and last `s` messages;
    None where a window cannot be placed or a check fails (see the module docstring). `head` is the render
    of the first `reach` messages (None: rendered here when needed); the last `kept` chars of `text` are
    the old text's from a turn opener on."""
    chat, text, openers = old.chat, old.text, old.openers
    nb, nv = len(chat), len(new_chat)
    lead = max(1, reach)
    shift = nv - nb
    b = nb - s
    if s <= 0 or a < lead or a > b or a > nv - s or not text:
        return None
    # the turn boundary q after the block: its piece and those after it see only suffix messages
    q = next((g for g in range(b + reach, min(nb, b + reach + 8)) if g in openers), None)
    if q is None:
        return None
    k = min(nb, q + reach + 1)  # both windows end here: q's forward neighbours are in them
    first = list(chat[:lead])
    if head is None:
        head = render(first, False)
    # the old window: it must give the known text between its start boundary and q
    jb = _boundary_at_or_before(openers, q - max(2, 2 * reach + 1), lead, chat, max_back)
    if jb is None:
        w_old = render(list(chat[:k]), False)
        h_old, known = 0, text[: openers[q]]
    else:
        w_old = render(first + list(chat[jb:k]), False)
        h_old, known = len(head), text[openers[jb] : openers[q]]
        if not w_old.startswith(head):
            return None
    if not w_old.startswith(known, h_old):
        return None
    tail = w_old[h_old + len(known) :]
    if not tail:
        return None
    # the new window: it must give the known text before the block and end with the old window's tail
    g = _boundary_at_or_before(openers, a - reach, lead, chat, max_back)
    jv = None if g is None else _boundary_at_or_before(openers, g - reach - 1, lead, chat, max_back)
    if jv is None:  # the window starts at the front: a prefix of the new view, exact without a check
        w_new = render(list(new_chat[: k + shift]), False)
        prefix, h_new, checked = "", 0, 0
    else:
        w_new = render(first + list(new_chat[jv : k + shift]), False)
        prefix, h_new = text[: openers[jv]], len(head)
        checked = openers[g] - openers[jv]
        if not (w_new.startswith(head) and w_new.startswith(text[openers[jv] : openers[g]], h_new)):
            return None
    end = len(w_new) - len(tail)
    if end < h_new + checked or not w_new.endswith(tail):
        return None
    return prefix + w_new[h_new:end] + text[openers[q] :], len(text) - openers[q]


def splice_hint(st: RenderState, opener: str | None, locality: Any, a: int, s: int) -> SpliceHint | None:
    """What the next render needs to splice its text, taken before a cut, for a view sharing the first `a`
    and the last `s` messages with the messages held; None when the last render does not describe the
    messages (or the template is not local: `locality`, its `Locality`)."""
    if not (locality.local and opener and st.text and st.last_agp is not None and st.located == len(st.chat)):
        return None
    reach = locality.reach
    b, back = len(st.chat) - s, 2 * reach + _MAX_BACK + 4

    def wanted(i: int) -> bool:  # the indexes `splice_text` may look up
        return a - back <= i <= a or b <= i <= b + reach + 8
    # only the regions of those messages and of the ones just before them count (regions are in index order)
    regions = st.regions
    near = [r for lo, hi in ((a - back - 1, a), (b - 1, b + reach + 8))
            for r in regions[bisect.bisect_left(regions, lo, key=_region_index):
                             bisect.bisect_right(regions, hi, key=_region_index)]]
    return SpliceHint(st.text, tuple(st.chat), st.last_agp, opener_positions(st.text, opener, near, wanted))


def keep_tail(st: RenderState, hint: SpliceHint | None, a: int, s: int) -> tuple | None:
    """Before `IncrementalRenderer.splice` cuts to `a` messages: the prepared last `s` messages `(messages,
    chat dicts, sampled ids, special-token finds by tail position)` when they may be reused (`attach_prepared`),
    else None; their located regions are kept aside in `st.tail_regions` when the last render located
    them structurally."""
    n = len(st.chat)
    b = n - s
    kept, st.tail_regions = None, None
    if hint is not None and (st.marked_at is None or st.marked_at < a) and not (
            st.unresolved and st.unresolved[-1] >= b):
        kept = (st.messages[b:], st.chat[b:], st.sampled[b:], {i - b: f for i, f in st.specials.items() if i >= b})
        regions = st.regions
        if st.mode == "structural" and st.located == n:
            at = bisect.bisect_left(regions, b, key=_region_index)
            st.tail_regions = (b, regions[at:])
    return kept


def attach_prepared(st: RenderState, policy: Any, messages: list, chat: list, sampled: list, specials: dict) -> bool:
    """Append the prepared kept tail (its messages, chat dicts, sampled ids and special-token finds by
    tail position) after the messages held, when `append` would accept each message as it did before:
    the tool-call pairing (`SegmentCache.prepared`'s check) holds with the calls made before it here
    and no message makes a call without an id (whose stand-in id names its index). The special-token
    policy (`error`) and the marker check gave the same outcome when they were appended (same role, same
    content, same policy); a marked message in the tail was excluded by `keep_tail`. False: nothing done."""
    avail = set(st.call_ids)
    for c in chat:
        role = c.get("role")
        if role == "tool":
            call_id = c.get("tool_call_id")
            if not (str(call_id) in avail if call_id is not None else avail):
                return False
        elif role == "assistant" and c.get("tool_calls"):
            made = made_calls(c)
            if made is None:
                return False
            avail |= made
    base = len(st.chat)
    st.call_ids = avail
    for i, found in specials.items():
        st.specials[base + i] = found
        st.escape = st.escape or policy[chat[i]["role"]] == "escape"
    st.messages += messages
    st.chat += chat
    st.sampled += sampled
    st.n_assistant += [c.get("role") for c in chat].count("assistant")
    st.any_sampled = st.any_sampled or sampled.count(None) < len(sampled)
    return True


def expect_splice(st: RenderState, hint: SpliceHint | None, a: int, s: int) -> None:
    """The messages now held are `hint`'s first `a` messages, a changed block, and its last `s` messages:
    the next render tries `splice_text` first."""
    st.splice = (hint, a, s) if hint is not None else None


def spliced_text(st: RenderState, render: Render, locality: Any, agp: bool) -> str | None:
    """The text of the render with `agp` by `splice_text`, or None (the hint is used up either way)."""
    got, st.splice = st.splice, None
    if got is None:
        return None
    hint, a, s = got
    prompt, reach = locality.prompt, locality.reach
    if hint.agp != agp or (agp and prompt is None):
        return None
    chat = st.chat
    try:
        if st.head is None and len(chat) >= reach:
            st.head = render(chat[:reach], False)
        got = splice_text(render, hint, chat, a, s, reach, st.head)
    except TemplateError:
        return None
    if got is None or (agp and not got[0].endswith(prompt)):
        return None
    text, kept = got
    if st.text is hint.text:  # the ids of the kept tail can be shifted rather than re-encoded
        st.kept_tail = (len(hint.text) - kept, len(text) - kept)
    set_core(st, len(chat), text[: len(text) - len(prompt)] if agp else text)
    st.splice_renders += 1
    return text


def tail_tokens(st: RenderState, tokenizer: Any, opener: str | None, b: int, n: int) -> tuple | None:
    """For `tokens.retokenize` (old tokens still held, new text of length `n` re-encoded from char `b`): the
    kept tail's new start char and its old tokens `(at, ids, starts, special ends, special counts,
    char shift, token index)` when they can be shifted, else None. The hint is used up."""
    (old_at, new_at), st.kept_tail = st.kept_tail, None
    if opener is None or new_at < b or new_at >= n:
        return None
    starts = st.starts
    t = bisect.bisect_left(starts, old_at)
    if t >= len(starts) or starts[t] != old_at or tokenizer.special_tokens.get(opener) != st.ids[t]:
        return None  # the tail does not begin with the turn opener's own token
    e = bisect.bisect_right(st.sp_ends, old_at)
    return (new_at, st.ids[t:], starts[t:], st.sp_ends[e:], st.sp_tok[e:], new_at - old_at, t)


def append_tail(st: RenderState, new_at: int, ids: list, starts: list, sp_ends: list, sp_tok: list, shift: int,
                t: int) -> None:
    """Append a kept tail from `tail_tokens` after the tokens of the text before char `new_at`: the
    tokenizer is segmentable and the tail begins at a safe turn opener (`segments.safe_opener`),
    so its ids are those of its own encoding, which the old text held from its token `t` on."""
    k = len(st.ids) - t
    st.tail_map = (t, len(st.ids), shift)
    st.ids += ids
    st.starts += [s + shift for s in starts]
    st.sp_ends += [s + shift for s in sp_ends]
    st.sp_tok += [c + k for c in sp_tok]


def shifted_tail(st: RenderState) -> tuple[int, list, tuple[int, int, int]] | None:
    """For `mask.locate`, after a render that kept the old text's tail and its ids (`tail_map`): `(anchor,
    regions, tail map)`: the new index of the first kept message whose regions all lie in the kept text,
    and the old regions from it on (old positions); None when there is none. Used up either way."""
    got, mapped, st.tail_regions, st.tail_map = st.tail_regions, st.tail_map, None, None
    if got is None or mapped is None or len(got) < 3 or not got[1]:
        return None
    _b, regions, mshift = got
    old_at = st.starts[mapped[1]] - mapped[2]
    at = next((k for k, r in enumerate(regions)
               if r.start >= old_at and (k == 0 or regions[k - 1].index != r.index)), None)
    if at is None:
        return None
    return regions[at].index + mshift, regions[at:], mapped


def attach_tail(st: RenderState, located: list, tail: tuple, cursor: int) -> bool:
    """Shift the old regions of `tail` (from `shifted_tail`) into place after `located` (the regions found
    for the messages up to and including its anchor, `cursor` after them), when the anchor's regions were
    found where its old ones lie, shifted: every later message is then found at its old place shifted,
    since the text searched from the cursor on is the old text's, shifted. Sets `st.tail_labels` for
    `mask.relabel` (the kept tokens keep their labels). False: nothing done."""
    anchor, regions, (t_old, t_new, d) = tail
    first = regions[0].index
    n = 0
    while n < len(regions) and regions[n].index == first:
        n += 1
    if len(located) < n:
        return False
    mine = located[len(located) - n:]
    if cursor != mine[-1].end or any((x.start, x.end, x.role, x.kind, x.index) != (r.start + d, r.end + d, r.role,
                                                                                  r.kind, anchor)
                                     for x, r in zip(mine, regions)):
        return False
    ts, mshift = t_new - t_old, anchor - first
    for r in regions[n:]:
        r.start += d
        r.end += d
        r.index += mshift
        a, z = r.tokens
        r.tokens = (a + ts, z + ts)
        r.span = None
    located += regions[n:]
    st.tail_labels = (t_old, t_new, len(regions) - n)
    st.tail_reuses += 1
    return True
