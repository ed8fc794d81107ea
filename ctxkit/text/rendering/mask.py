"""Locating assistant turns in the rendered text and labelling each token's role and loss mask.

Part of `ctxkit.text.rendering.renderer` (see its module docstring for how turns are located): `locate` finds each
message's region (`TextRegion`) in the rendered text (structurally or per turn) and `relabel` derives
per-token roles, the loss mask and region token ranges from them, both over the renderer's `RenderState`;
`special_literals` and `special_report` place the special-token text found in message content; `turn_find` finds
where a turn's produced text lies.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Callable

from ctxkit.text.chat_messages import message_text
from ctxkit.errors import RenderError, TemplateError
from ctxkit.text.rendering.splice import attach_tail, shifted_tail
from ctxkit.text.rendering.state import RenderState
from ctxkit.text.rendering.turn_find import find_turn, past_closers, tool_result_inside_turn, turn_heads
from ctxkit.text.special_tokens import SpecialTokenInContent

Render = Callable[[list, bool], str]


@dataclass
class TextRegion:
    """Where one message's text (or a generation prompt) lies in a rendered text; mutable, since the
    renderer fills in its token range and span as it labels tokens."""

    start: int
    """First character (inclusive)."""
    end: int
    """Last character (exclusive)."""
    role: str
    """The message's role, or `generation_prompt`."""
    index: int
    """Message index; -1 for the final generation prompt."""
    kind: str
    """`content` (a message's own text), `produced` (an assistant turn) or `header` (a generation prompt)."""
    tokens: tuple[int, int] | None = None
    """Token range in the rendered (pre-substitution) ids, once labelled."""
    span: Any = None
    """Cached `MessageSpan` of the region."""


class _Fallback(Exception):
    """Structural location failed for this render; use per-turn location."""


# -- locating -------------------------------------------------------------------------------------

def turn_text(st: RenderState, profile: Any, render: Render, template_id: str, i: int) -> tuple[str, str] | None:
    """`(head, turn)` of assistant message i from prefix renders (cached in `st.turn_text`): `turn` is its
    produced text as rendered when it is the last message, cut after the last turn closer
    (`TemplateProfile.turn_closers`), and `head` the part of the generation prompt written before it. The
    head is the whole prompt unless the prompt prefills text the turn as rendered lacks (DeepSeek R1's
    `<think>\\n`): then it is their common prefix. None when no prefix render shows the turn (the template
    rewrites earlier messages once this one follows them, e.g. Qwen3 after two assistant turns in a row)."""
    if i in st.turn_text:
        return st.turn_text[i]
    chat = st.chat
    contexts = [chat[:i]]
    if i > 1 and chat[0].get("role") == "system":
        contexts.append(chat[1:i])
    found = None
    for ctx in contexts:
        try:
            prompted = render(ctx, True)
            after = render(ctx + [chat[i]], False)
            if after.startswith(prompted):
                head, rest = profile.generation_prompt, after[len(prompted) :]
            else:
                plain = render(ctx, False)
                if not prompted.startswith(plain):
                    continue
                if after.startswith(plain):
                    gp, suffix = prompted[len(plain) :], after[len(plain) :]
                    n = _token_boundary(gp, common_prefix(gp, suffix), profile.markers)
                    head, rest = gp[:n], suffix[n:]
                else:
                    # The template closes the last message otherwise once this turn follows it (DeepSeek V3 ends a
                    # tool block with `<｜tool▁outputs▁end｜>` unless a tool-call turn comes next): the turn is
                    # what follows the common prefix, when all the render dropped is special tokens and the turn
                    # opens with one (anything else may be the last message rewritten, not a closer dropped).
                    specials = profile.markers + profile.template_specials
                    n = _token_boundary(plain, common_prefix(plain, after), specials)
                    if not _closers_dropped(plain[n:], after[n:], specials, message_text(chat[i].get("content"))):
                        continue
                    rest = after[n:]
                    head = gp if (gp := profile.generation_prompt) and rest.startswith(gp) else ""
                    rest = rest[len(head):]
        except TemplateError:
            continue
        turn = _cut_after_closer(rest, profile.turn_closers)
        if turn:
            found = (head, turn)
            break
    st.turn_text[i] = found
    return found


def _closers_dropped(dropped: str, turn: str, markers: tuple[str, ...], content: str) -> bool:
    """Whether `dropped` (what a render without the turn writes past the common prefix) is one or more special
    tokens (`markers`), with whitespace between or after them (Gemma 4 v5 closes the turn with `<turn|>\n`), and
    `turn` opens, after whitespace, with one or with the message's own `content` (Gemma 4 v5 writes a reply
    after a turn's moved content without opening a turn: `A1<turn|>` becomes `A1Done.<turn|>`). Anything else
    may be the last message rewritten, not a closer dropped."""
    rest = dropped.lstrip()
    if not rest:
        return False
    while rest:
        m = next((m for m in markers if m and rest.startswith(m)), None)
        if m is None:
            return False
        rest = rest[len(m):].lstrip()
    body = turn.lstrip()
    own = content.strip()
    return any(m and body.startswith(m) for m in markers) or bool(own) and body.startswith(own)


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b`."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _token_boundary(gp: str, n: int, markers: tuple[str, ...]) -> int:
    """`n`, moved back to the start of a special token of `gp` (`markers`) that it would cut in two."""
    for m in markers:
        at = gp.find(m)
        while at >= 0:
            if at < n < at + len(m):
                n = at
            at = gp.find(m, at + 1)
    return n


def _cut_after_closer(turn: str, closers: tuple[str, ...]) -> str:
    """`turn` up to and including its last turn closer (the whole text when it holds none)."""
    ends = [turn.rfind(c) + len(c) for c in closers if c in turn]
    return turn[: max(ends)] if ends else turn


def locate(st: RenderState, profile: Any, render: Render, template_id: str, text: str, agp: bool, stable: int) -> int:
    """Update the regions of `st` for `text`; return the char offset from which labels must be redone.
    `profile`: the template's `TemplateProfile`; `render`: `(chat, agp) -> text` by the template."""
    gp = profile.generation_prompt
    mode = "turns"
    found = count_prompts(st, gp, text, stable) if gp else -1  # counted every render: `gp_at` follows the text
    if st.structural_ok and found == st.n_assistant + (1 if agp and text.endswith(gp) else 0):
        mode = "structural"
    tail = shifted_tail(st)  # a kept tail's old regions (`splice`), or None
    if mode != st.mode:
        st.regions, st.prefix_max, st.mode, st.unresolved = [], [], mode, []
        st.span_dirty = 0
        tail = None
    keep, cursor = _keep_regions(st, stable, text)
    relabel_from = min(stable, cursor)
    new: list[TextRegion] = []
    args = (st, profile, render, template_id, text)
    try:
        if tail is not None and mode == "structural" and tail[0] >= keep:
            cursor = locate_from(*args, keep, cursor, mode, new, tail[0] + 1)
            if not attach_tail(st, new, tail, cursor):
                locate_from(*args, tail[0] + 1, cursor, mode, new)
        else:
            locate_from(*args, keep, cursor, mode, new)
    except _Fallback:
        st.tail_labels = None
        st.mode = "turns"
        del st.regions[:], st.prefix_max[:], st.unresolved[:]
        st.span_dirty = st.new_at = 0
        new, relabel_from = [], 0
        locate_from(*args, 0, 0, "turns", new)
    regions, pmax = st.regions, st.prefix_max
    top = pmax[-1] if pmax else 0
    for r in new:
        top = max(top, r.end)
        regions.append(r)
        pmax.append(top)
    st.final = None
    if agp and gp and text.endswith(gp):
        st.final = TextRegion(len(text) - len(gp), len(text), "generation_prompt", -1, "header")
    st.located = len(st.chat)
    return relabel_from


def _keep_regions(st: RenderState, stable: int, text: str) -> tuple[int, int]:
    """Keep the regions of the leading messages that lie wholly in unchanged text (before char `stable`;
    prefix max of region ends is monotonic, so bisect finds where they stop); return `(the first message
    to locate, the char to search from)`."""
    regions, pmax = st.regions, st.prefix_max
    pos = bisect.bisect_right(pmax, stable)
    while 0 < pos < len(regions) and regions[pos - 1].index == regions[pos].index:
        pos -= 1
    keep = regions[pos - 1].index + 1 if pos else 0
    unresolved = st.unresolved
    if unresolved and unresolved[0] < keep and (again := _found_anew(st, unresolved, keep, stable, text)) is not None:
        keep = again  # a message not found so far now is: search again from it
        while pos and regions[pos - 1].index >= keep:
            pos -= 1
    del regions[pos:], pmax[pos:]
    st.new_at = pos  # regions before it were labelled by an earlier render (`relabel`)
    st.span_dirty = min(st.span_dirty, pos)
    del unresolved[bisect.bisect_left(unresolved, keep) :]
    cursor = max((r.end for r in regions[-3:] if not (r.index == 0 and r.role == "system")), default=0)
    return keep, cursor


def _found_anew(st: RenderState, unresolved: list[int], keep: int, stable: int, text: str) -> int | None:
    """The first of the `unresolved` messages below `keep` whose text the new text may now hold, or None.
    The last search for each failed on the old text from its cursor on, and `text[:stable]` is that text, so
    a match now starts past `stable - len(body)`: the search from there is what a full locate would find
    (a match between its cursor and there would have been found last time)."""
    chat, find = st.chat, text.find
    for u in unresolved:
        if u >= keep:
            break
        body = message_text(chat[u].get("content"))
        if find(body, max(0, stable - len(body) + 1)) >= 0:
            return u
    return None


def count_prompts(st: RenderState, gp: str, text: str, stable: int) -> int:
    """`text.count(gp)` (the generation prompt), rescanning only from char `stable` (`text[:stable]` is the
    last counted text's): the occurrences wholly before it are kept from the last count (`st.gp_at`)."""
    at = st.gp_at
    del at[bisect.bisect_right(at, stable - len(gp)) :]
    pos = at[-1] + len(gp) if at else 0
    find = text.find
    while (pos := find(gp, pos)) >= 0:  # left to right, not overlapping: as `str.count`
        at.append(pos)
        pos += len(gp)
    return len(at)


def locate_from(st: RenderState, profile: Any, render: Render, template_id: str, text: str, first: int,
                cursor: int, mode: str, out: list[TextRegion], stop: int | None = None) -> int:
    """Locate messages `first` to `stop` (exclusive; default: all) from char `cursor` into `out`; return the
    cursor after them."""
    gp, eot, opener = profile.generation_prompt, profile.end_of_turn, profile.turn_opener
    chat = st.chat
    for i in range(first, len(chat) if stop is None else stop):
        msg = chat[i]
        role = msg.get("role")
        if role == "assistant":
            if mode == "structural":
                pos = text.find(gp, cursor)
                if pos < 0:
                    raise _Fallback
                s = pos + len(gp)
                e = text.find(eot, s)
                if e < 0 or (opener and text.find(opener, s, e) >= 0):
                    raise _Fallback  # no end-of-turn before the next turn opens
                e = past_closers(text, e + len(eot), profile.turn_closers)
                out.append(TextRegion(pos, s, "generation_prompt", i, "header"))
            else:
                found = turn_text(st, profile, render, template_id, i)
                heads = turn_heads(found[0] if found is not None else gp, profile.markers)
                moved = (message_text(msg.get("content")), st.sampled[i] is not None)
                s, e, head = find_turn(text, found, heads, profile.turn_closers or (), opener, cursor, i,
                                        template_id, () if profile.turn_closers else profile.turn_starts,
                                        profile.markers + profile.template_specials, moved)
                if head and text[max(0, s - len(head)) : s] == head:
                    out.append(TextRegion(s - len(head), s, "generation_prompt", i, "header"))
            out.append(TextRegion(s, e, "assistant", i, "produced"))
            cursor = e
        else:
            body = message_text(msg.get("content"))
            if not body:
                continue
            pos = text.find(body) if i == 0 and role == "system" else text.find(body, cursor)
            if pos < 0:
                if role == "tool":
                    tool_result_inside_turn(text, body, out, i, template_id, st.chat)
                st.unresolved.append(i)
                continue
            out.append(TextRegion(pos, pos + len(body), role, i, "content"))
            if not (i == 0 and role == "system"):  # a system prompt may be moved (Mistral): no cursor
                cursor = pos + len(body)
    return cursor


def occurrences(st: RenderState, text: str) -> list[tuple[int, int, str, int | None]]:
    """`(message index, char in content, token, char in text or None)` of every special-token
    occurrence found in message content at `append` (`st.specials`), located in `text`."""
    where: dict[int, TextRegion] = {r.index: r for r in st.regions if r.kind in ("content", "produced")}
    out = []
    for i, occ in sorted(st.specials.items()):
        r = where.get(i)
        base = -1
        if r is not None:
            body = message_text(st.chat[i].get("content"))
            base = r.start if r.kind == "content" else text.find(body, r.start, r.end)
        out.extend((i, c, tok, base + c if base >= 0 else None) for c, tok in occ)
    return out


def special_literals(st: RenderState, policy: Any, template_id: str, text: str) -> set[int]:
    """Offsets in `text` of the occurrences to encode as plain text (messages whose role escapes under
    `policy`); `RenderError` when one cannot be located."""
    literal = set()
    for i, c, tok, at in occurrences(st, text):
        if policy[st.chat[i]["role"]] == "escape":
            if at is None:
                raise RenderError(f"message {i}: cannot locate its content in the render of template "
                                  f"{template_id} to escape the special token {tok!r} at char {c}")
            literal.add(at)
    return literal


def special_report(st: RenderState, policy: Any, text: str) -> tuple:
    """The `SpecialTokenInContent` records of the last render (positions in output ids)."""
    out = []
    subs = st.subs
    for i, c, tok, at in occurrences(st, text):
        position = None
        if at is not None:
            p = bisect.bisect_right(st.starts, at) - 1
            k = bisect.bisect_right([sub.z for sub in subs], p)
            inside = k < len(subs) and subs[k].a <= p
            position = None if inside or p < 0 else p + (subs[k - 1].shift if k else 0)
        role = st.chat[i]["role"]
        out.append(SpecialTokenInContent(i, role, tok, c, position, policy[role]))
    return tuple(out)


# -- labelling -----------------------------------------------------------------------------------

def relabel(st: RenderState, from_char: int) -> int:
    """Recompute roles/mask (and region token ranges) from `from_char` on; return the first token changed."""
    starts, roles, mask = st.starts, st.roles, st.mask
    t0 = bisect.bisect_left(starts, from_char)
    n = len(st.ids)
    tail, st.tail_labels = st.tail_labels, None
    first = bisect.bisect_right(st.prefix_max, from_char)
    st.span_dirty = min(st.span_dirty, first)
    regions = st.regions
    upto = len(regions)
    if tail is not None and t0 <= tail[1] and first <= upto - tail[2]:
        # a kept tail (`splice.attach_tail`): its tokens keep their labels, which depend only on its
        # own regions (each starts at or after its first token, the turn opener), shifted with them
        t_old, t_new, upto = tail[0], tail[1], upto - tail[2]
        roles_tail, mask_tail = roles[t_old:], mask[t_old:]
        del roles[t0:], mask[t0:]
        roles += ["scaffold"] * (t_new - t0)
        roles += roles_tail
        mask += [0] * (t_new - t0)
        mask += mask_tail
    else:
        del roles[t0:], mask[t0:]
        roles.extend(["scaffold"] * (n - t0))
        mask.extend([0] * (n - t0))
    todo = regions[first:upto] + ([st.final] if st.final is not None else [])
    for r in regions[min(st.new_at, first) : first]:  # those before `new_at` were labelled
        if r.tokens is None:  # pragma: no cover - every kept region was labelled before
            todo.insert(0, r)
    for r in todo:
        if r.kind == "produced":  # the mask covers tokens that start inside the produced text
            a = bisect.bisect_left(starts, r.start)
        else:  # a role label also covers a token that starts just before the text (e.g. "▁word")
            a = max(0, bisect.bisect_right(starts, r.start) - 1)
        z = bisect.bisect_left(starts, r.end, a)
        if r.kind == "produced" and z <= a:
            raise RenderError(f"message {r.index}: assistant turn covers no token; cannot derive its loss mask")
        r.tokens = (a, z)
        r.span = None
        a = max(a, t0)
        if r.kind == "content" and z > a and roles[a] != "scaffold":
            a += 1  # a token already labelled by an earlier region keeps that label, so a full render
            # and an incremental one (which never relabels tokens before its first new one) agree
        if z > a:
            roles[a:z] = [r.role] * (z - a)
            if r.kind == "produced":
                mask[a:z] = [1] * (z - a)
    return t0
