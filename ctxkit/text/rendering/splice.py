"""Rendering a view whose messages changed in a block, from a window around the block.

Part of `ctxkit.text.rendering.renderer`. A compaction changes a view in one block: `window` drops old turns after the
leading messages, `mask-observations` / `truncate-tool-output` rewrite a run of old tool outputs. The new
view is `old[:a] + block + old[len(old) - s:]`: it shares a prefix of `a` messages and a suffix of `s`
messages with a view rendered before. For a local template (`ctxkit.text.template.locality`), the new text is
the old text up to a turn boundary before the block, the render of a short window around the block, and
the old text from a turn boundary after it (`splice_text`), so the kept tail never goes through the
template again. `SuffixSplice.splice` also keeps the tail's prepared messages (indexes shifted, the append
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
from typing import Any, Callable, Sequence

from ctxkit.errors import ConfigError, TemplateError
from ctxkit.text.rendering.segments import encode_segments, made_calls

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


class SuffixSplice:
    """Mixin of `IncrementalRenderer`: `splice_hint()` before a cut, `expect_splice(...)` after it, and the
    next render takes its text from `splice_text` when the checks pass (else the ordinary path).

    Uses the renderer's state (`_text`, `_chat`, `_regions`, `_located`, `_local`, `_reach`, `_prompt`, ...)."""

    _splice: tuple[SpliceHint, int, int] | None = None
    _last_agp: bool | None = None
    _kept_tail: tuple[int, int] | None = None  # (char in the old text, char in the new) of a kept tail
    _tail_regions: tuple | None = None  # (old index of the first kept message, its regions on, index shift)
    _tail_map: tuple[int, int, int] | None = None  # (old token, new token, char shift) of a kept tail's ids
    _tail_labels: tuple[int, int, int] | None = None  # (old token, new token, regions) of a tail kept labelled
    splice_renders = 0
    """Renders whose text was spliced from the previous text and windows around a changed block."""
    tail_reuses = 0
    """Spliced renders that kept the tail's located regions and labels, shifted (`attach_tail`)."""

    def splice_hint(self, a: int, s: int) -> SpliceHint | None:
        """What the next render needs to splice its text, taken before `cut`, for a view sharing the first `a`
        and the last `s` messages with the messages held; None when the renderer's last render does not
        describe its messages (or the template is not local)."""
        opener = self._profile.turn_opener
        if not (self._local and opener and self._text and self._last_agp is not None
                and self._located == len(self._chat)):
            return None
        b, back = len(self._chat) - s, 2 * self._reach + _MAX_BACK + 4

        def wanted(i: int) -> bool:  # the indexes `splice_text` may look up
            return a - back <= i <= a or b <= i <= b + self._reach + 8
        # only the regions of those messages and of the ones just before them count (regions are in index order)
        regions = self._regions
        near = [r for lo, hi in ((a - back - 1, a), (b - 1, b + self._reach + 8))
                for r in regions[bisect.bisect_left(regions, lo, key=_region_index):
                                 bisect.bisect_right(regions, hi, key=_region_index)]]
        return SpliceHint(self._text, tuple(self._chat), self._last_agp,
                          opener_positions(self._text, opener, near, wanted))

    def splice(self, a: int, s: int, block: Sequence[tuple[Any, Any]],
               tail: Callable[[], Sequence[tuple[Any, Any]]]) -> None:
        """Make the messages held `self.messages[:a] + block + self.messages[len(self) - s:]` (`block`: pairs
        `(message, message_key or None)`; `tail()`: the same pairs for the last `s` messages, asked for only
        when they must be appended again). The next render tries `splice_text` first (`expect_splice`).

        The kept tail's prepared messages are reused with their indexes shifted, not appended again, when
        every check `append` makes of them has the outcome it had (`_attach_tail`); else they are appended.
        Its located regions and labels are kept aside for the next render (`_tail_regions`), which shifts
        them instead of locating and labelling the tail again when its text and ids were kept."""
        n = len(self._chat)
        if not 0 <= a <= n - s or s <= 0:
            raise ConfigError(f"IncrementalRenderer.splice: parameters a={a}, s={s} do not fit {n} messages")
        hint = self.splice_hint(a, s)
        b = n - s
        kept, self._tail_regions = None, None
        if hint is not None and (self._marked_at is None or self._marked_at < a) and not (
                self._unresolved and self._unresolved[-1] >= b):
            kept = (self._messages[b:], self._chat[b:], self._sampled[b:],
                    {i - b: f for i, f in self._specials.items() if i >= b})
            regions = self._regions
            if self._mode == "structural" and self._located == n:
                at = bisect.bisect_left(regions, b, key=_region_index)
                self._tail_regions = (b, regions[at:])
        self.cut(a)
        for m, key in block:
            self.append(m, key)
        if kept is None or not self._attach_tail(*kept):
            self._tail_regions = None
            for m, key in tail():
                self.append(m, key)
        elif self._tail_regions is not None:
            self._tail_regions = (self._tail_regions[0], self._tail_regions[1], len(self._chat) - n)
        self.expect_splice(hint, a, s)

    def _attach_tail(self, messages: list, chat: list, sampled: list, specials: dict) -> bool:
        """Append the prepared kept tail (its messages, chat dicts, sampled ids and special-token finds by
        tail position) after the messages held, when `append` would accept each message as it did before:
        the tool-call pairing (`SegmentCache.prepared`'s check) holds with the calls made before it here
        and no message makes a call without an id (whose stand-in id names its index). The special-token
        policy (`error`) and the marker check gave the same outcome when they were appended (same role, same
        content, same policy); a marked message in the tail was excluded by the caller. False: nothing done."""
        avail = set(self._call_ids)
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
        base = len(self._chat)
        self._call_ids = avail
        for i, found in specials.items():
            self._specials[base + i] = found
            self._escape = self._escape or self._policy[chat[i]["role"]] == "escape"
        self._messages += messages
        self._chat += chat
        self._sampled += sampled
        self._n_assistant += [c.get("role") for c in chat].count("assistant")
        self._any_sampled = self._any_sampled or sampled.count(None) < len(sampled)
        return True

    def expect_splice(self, hint: SpliceHint | None, a: int, s: int) -> None:
        """The messages now held are `hint`'s first `a` messages, a changed block, and its last `s` messages:
        the next render tries `splice_text` first."""
        self._splice = (hint, a, s) if hint is not None else None

    def _spliced_text(self, agp: bool) -> str | None:
        """The text of the render with `agp` by `splice_text`, or None (the hint is used up either way)."""
        got, self._splice = self._splice, None
        if got is None:
            return None
        hint, a, s = got
        prompt = self._prompt
        if hint.agp != agp or (agp and prompt is None):
            return None
        chat = self._chat
        try:
            if self._head is None and len(chat) >= self._reach:
                self._head = self._render_text(chat[: self._reach], False)
            got = splice_text(self._render_text, hint, chat, a, s, self._reach, self._head)
        except TemplateError:
            return None
        if got is None or (agp and not got[0].endswith(prompt)):
            return None
        text, kept = got
        if self._text is hint.text:  # the ids of the kept tail can be shifted rather than re-encoded
            self._kept_tail = (len(hint.text) - kept, len(text) - kept)
        self._set_core(len(chat), text[: len(text) - len(prompt)] if agp else text)
        self.splice_renders += 1
        return text

    def _tail_tokens(self, b: int, n: int) -> tuple | None:
        """For `_retokenize` (old tokens still held, new text of length `n` re-encoded from char `b`): the
        kept tail's new start char and its old tokens `(at, ids, starts, special ends, special counts,
        char shift, token index)` when they can be shifted, else None. The hint is used up."""
        (old_at, new_at), self._kept_tail = self._kept_tail, None
        if self._opener is None or new_at < b or new_at >= n:
            return None
        starts = self._starts
        t = bisect.bisect_left(starts, old_at)
        if t >= len(starts) or starts[t] != old_at or self.tokenizer.special_tokens.get(self._opener) != self._ids[t]:
            return None  # the tail does not begin with the turn opener's own token
        e = bisect.bisect_right(self._sp_ends, old_at)
        return (new_at, self._ids[t:], starts[t:], self._sp_ends[e:], self._sp_tok[e:], new_at - old_at, t)

    def _append_tail(self, new_at: int, ids: list, starts: list, sp_ends: list, sp_tok: list, shift: int,
                     t: int) -> None:
        """Append a kept tail from `_tail_tokens` after the tokens of the text before char `new_at`: the
        tokenizer is segmentable and the tail begins at a safe turn opener (`segments.safe_opener`),
        so its ids are those of its own encoding, which the old text held from its token `t` on."""
        k = len(self._ids) - t
        self._tail_map = (t, len(self._ids), shift)
        self._ids += ids
        self._starts += [s + shift for s in starts]
        self._sp_ends += [s + shift for s in sp_ends]
        self._sp_tok += [c + k for c in sp_tok]

    def shifted_tail(self) -> tuple[int, list, tuple[int, int, int]] | None:
        """For `_locate`, after a render that kept the old text's tail and its ids (`_tail_map`): `(anchor,
        regions, tail map)`: the new index of the first kept message whose regions all lie in the kept text,
        and the old regions from it on (old positions); None when there is none. Used up either way."""
        got, mapped, self._tail_regions, self._tail_map = self._tail_regions, self._tail_map, None, None
        if got is None or mapped is None or len(got) < 3 or not got[1]:
            return None
        _b, regions, mshift = got
        old_at = self._starts[mapped[1]] - mapped[2]
        at = next((k for k, r in enumerate(regions)
                   if r.start >= old_at and (k == 0 or regions[k - 1].index != r.index)), None)
        if at is None:
            return None
        return regions[at].index + mshift, regions[at:], mapped

    def attach_tail(self, located: list, tail: tuple, cursor: int) -> bool:
        """Shift the old regions of `tail` (from `shifted_tail`) into place after `located` (the regions found
        for the messages up to and including its anchor, `cursor` after them), when the anchor's regions were
        found where its old ones lie, shifted: every later message is then found at its old place shifted,
        since the text searched from the cursor on is the old text's, shifted. Sets `_tail_labels` for
        `_relabel` (the kept tokens keep their labels). False: nothing done."""
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
        self._tail_labels = (t_old, t_new, len(regions) - n)
        self.tail_reuses += 1
        return True

    def _encode_from(self, text: str, b: int, j: int, k: int) -> None:
        """`_retokenize` with a turn-opener cut (`segments.encode_segments`): drop the tokens from token
        `k` (special token `j`) on and encode `text` from char `b`, shifting the ids of a kept tail when a
        splice left one."""
        tail = self._tail_tokens(b, len(text)) if self._kept_tail is not None else None
        del self._ids[k:], self._starts[k:], self._sp_ends[j:], self._sp_tok[j:]
        end = len(text) if tail is None else tail[0]
        encode_segments(self.segments, self.tokenizer, text[b:end], b, self._opener, self._special_len,
                        (self._ids, self._starts, self._sp_ends, self._sp_tok))
        if tail is not None:
            self._append_tail(*tail)
