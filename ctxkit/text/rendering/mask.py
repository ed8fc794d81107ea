"""Locating assistant turns in the rendered text and labelling each token's role and loss mask.

Part of `ctxkit.text.rendering.renderer` (see its module docstring for how turns are located): `TurnLabeller` holds
the `IncrementalRenderer` methods that find each message's region (`TextRegion`) in the rendered text
(structurally or per turn) and derive per-token roles, the loss mask and region token ranges from them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from ctxkit.text.chat_messages import message_text
from ctxkit.errors import RenderError, TemplateError
from ctxkit.text.special_tokens import SpecialTokenInContent


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


class TurnLabeller:
    """Mixin of `IncrementalRenderer`: locates message regions in the rendered text and labels tokens.

    Uses the renderer's state (`_chat`, `_profile`, `_ids`, `_starts`, `_regions`, ...) and `_render_text`."""

    # -- locating -----------------------------------------------------------------------------

    def _turn(self, i: int) -> str:
        """Assistant turn i's produced text, from prefix renders (cached)."""
        text = self._turn_text.get(i)
        if text is not None:
            return text
        eot = self._profile.end_of_turn
        contexts = [self._chat[:i]]
        if i > 1 and self._chat[0].get("role") == "system":
            contexts.append(self._chat[1:i])
        for ctx in contexts:
            try:
                before = self._render_text(ctx, True)
                after = self._render_text(ctx + [self._chat[i]], False)
            except TemplateError:
                continue
            if after.startswith(before):
                turn = after[len(before) :]
                if eot and eot in turn:
                    turn = turn[: turn.index(eot) + len(eot)]
                if turn:
                    self._turn_text[i] = turn
                    return turn
        raise RenderError(f"message {i}: cannot derive the assistant turn's text from prefix renders of template {self.template.id}")

    def _locate(self, text: str, agp: bool, stable: int) -> int:
        """Update the regions for `text`; return the char offset from which labels must be redone."""
        gp = self._profile.generation_prompt
        mode = "turns"
        found = self._count_prompts(text, stable) if gp else -1  # counted every render: `_gp_at` follows the text
        if self._structural_ok and found == self._n_assistant + (1 if agp and text.endswith(gp) else 0):
            mode = "structural"
        tail = self.shifted_tail()  # a kept tail's old regions (`SuffixSplice`), or None
        if mode != self._mode:
            self._regions, self._prefix_max, self._mode, self._unresolved = [], [], mode, []
            self._span_dirty = 0
            tail = None
        # Keep the regions of the leading messages that lie wholly in unchanged text (prefix max of
        # region ends is monotonic, so bisect finds where they stop).
        regions, pmax = self._regions, self._prefix_max
        pos = bisect.bisect_right(pmax, stable)
        while 0 < pos < len(regions) and regions[pos - 1].index == regions[pos].index:
            pos -= 1
        keep = regions[pos - 1].index + 1 if pos else 0
        unresolved = self._unresolved
        if unresolved and unresolved[0] < keep:  # a message not found so far: search again from it
            keep = unresolved[0]
            while pos and regions[pos - 1].index >= keep:
                pos -= 1
        del regions[pos:], pmax[pos:]
        self._new_at = pos  # regions before it were labelled by an earlier render (`_relabel`)
        self._span_dirty = min(self._span_dirty, pos)
        del unresolved[bisect.bisect_left(unresolved, keep) :]
        cursor = max((r.end for r in regions[-3:] if not (r.index == 0 and r.role == "system")), default=0)
        relabel_from = min(stable, cursor)
        new: list[TextRegion] = []
        try:
            if tail is not None and mode == "structural" and tail[0] >= keep:
                cursor = self._locate_from(text, keep, cursor, mode, new, tail[0] + 1)
                if not self.attach_tail(new, tail, cursor):
                    self._locate_from(text, tail[0] + 1, cursor, mode, new)
            else:
                self._locate_from(text, keep, cursor, mode, new)
        except _Fallback:
            self._tail_labels = None
            self._mode = "turns"
            del regions[:], pmax[:], unresolved[:]
            self._span_dirty = self._new_at = 0
            new, relabel_from = [], 0
            self._locate_from(text, 0, 0, "turns", new)
        top = pmax[-1] if pmax else 0
        for r in new:
            top = max(top, r.end)
            regions.append(r)
            pmax.append(top)
        self._final = None
        if agp and gp and text.endswith(gp):
            self._final = TextRegion(len(text) - len(gp), len(text), "generation_prompt", -1, "header")
        self._located = len(self._chat)
        return relabel_from

    def _count_prompts(self, text: str, stable: int) -> int:
        """`text.count(generation_prompt)`, rescanning only from char `stable` (`text[:stable]` is the last
        counted text's): the occurrences wholly before it are kept from the last count (`_gp_at`)."""
        gp, at = self._profile.generation_prompt, self._gp_at
        del at[bisect.bisect_right(at, stable - len(gp)) :]
        pos = at[-1] + len(gp) if at else 0
        find = text.find
        while (pos := find(gp, pos)) >= 0:  # left to right, not overlapping: as `str.count`
            at.append(pos)
            pos += len(gp)
        return len(at)

    def _locate_from(self, text: str, first: int, cursor: int, mode: str, out: list[TextRegion],
                     stop: int | None = None) -> int:
        """Locate messages `first` to `stop` (exclusive; default: all) from char `cursor` into `out`; return the
        cursor after them."""
        gp, eot, opener = self._profile.generation_prompt, self._profile.end_of_turn, self._profile.turn_opener
        for i in range(first, len(self._chat) if stop is None else stop):
            msg = self._chat[i]
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
                    e += len(eot)
                    out.append(TextRegion(pos, s, "generation_prompt", i, "header"))
                else:
                    turn = self._turn(i)
                    # Prefer the turn behind its generation prompt: the bare turn text (e.g. just the
                    # end-of-turn token of an empty reply) may also close the previous message.
                    s = text.find(gp + turn, cursor) + len(gp) if gp else -1
                    if s < len(gp) or not gp:
                        s = text.find(turn, cursor)
                    if s >= 0:
                        e = s + len(turn)
                    elif gp and eot and text.find(gp, cursor) >= 0:
                        # The template re-renders this turn (e.g. drops its reasoning): take what it
                        # renders between the next generation prompt and end-of-turn token.
                        s = text.find(gp, cursor) + len(gp)
                        e = text.find(eot, s)
                        if e < 0 or (opener and text.find(opener, s, e) >= 0):
                            raise RenderError(
                                f"message {i}: no end-of-turn {eot!r} closes the assistant turn rendered by "
                                f"template {self.template.id}; cannot locate it for the loss mask"
                            )
                        e += len(eot)
                    else:
                        raise RenderError(
                            f"message {i}: the assistant turn is not rendered as sampled by template "
                            f"{self.template.id} (it rewrites history); cannot locate it for the loss mask"
                        )
                    if gp and text[max(0, s - len(gp)) : s] == gp:
                        out.append(TextRegion(s - len(gp), s, "generation_prompt", i, "header"))
                out.append(TextRegion(s, e, "assistant", i, "produced"))
                cursor = e
            else:
                body = message_text(msg.get("content"))
                if not body:
                    continue
                pos = text.find(body) if i == 0 and role == "system" else text.find(body, cursor)
                if pos < 0:
                    self._unresolved.append(i)
                    continue
                out.append(TextRegion(pos, pos + len(body), role, i, "content"))
                if not (i == 0 and role == "system"):  # a system prompt may be moved (Mistral): no cursor
                    cursor = pos + len(body)
        return cursor

    # -- special tokens in content -------------------------------------------------------------

    def _occurrences(self, text: str) -> list[tuple[int, int, str, int | None]]:
        """`(message index, char in content, token, char in text or None)` of every special-token
        occurrence found in message content at `append` (`self._specials`), located in `text`."""
        where: dict[int, TextRegion] = {r.index: r for r in self._regions if r.kind in ("content", "produced")}
        out = []
        for i, occ in sorted(self._specials.items()):
            r = where.get(i)
            base = -1
            if r is not None:
                body = message_text(self._chat[i].get("content"))
                base = r.start if r.kind == "content" else text.find(body, r.start, r.end)
            out.extend((i, c, tok, base + c if base >= 0 else None) for c, tok in occ)
        return out

    def _special_literals(self, text: str) -> set[int]:
        """Offsets in `text` of the occurrences to encode as plain text (messages whose role escapes);
        `RenderError` when one cannot be located."""
        literal = set()
        for i, c, tok, at in self._occurrences(text):
            if self._policy[self._chat[i]["role"]] == "escape":
                if at is None:
                    raise RenderError(f"message {i}: cannot locate its content in the render of template "
                                      f"{self.template.id} to escape the special token {tok!r} at char {c}")
                literal.add(at)
        return literal

    def _special_report(self, text: str) -> tuple:
        """The `SpecialTokenInContent` records of the last render (positions in output ids)."""
        out = []
        for i, c, tok, at in self._occurrences(text):
            position = None
            if at is not None:
                p = bisect.bisect_right(self._starts, at) - 1
                k = bisect.bisect_right([sub.z for sub in self._subs], p)
                inside = k < len(self._subs) and self._subs[k].a <= p
                position = None if inside or p < 0 else p + (self._subs[k - 1].shift if k else 0)
            role = self._chat[i]["role"]
            out.append(SpecialTokenInContent(i, role, tok, c, position, self._policy[role]))
        return tuple(out)

    # -- labelling ---------------------------------------------------------------------------

    def _relabel(self, from_char: int) -> int:
        """Recompute roles/mask (and region token ranges) from `from_char` on; return the first token changed."""
        starts = self._starts
        t0 = bisect.bisect_left(starts, from_char)
        n = len(self._ids)
        tail, self._tail_labels = self._tail_labels, None
        first = bisect.bisect_right(self._prefix_max, from_char)
        self._span_dirty = min(self._span_dirty, first)
        upto = len(self._regions)
        if tail is not None and t0 <= tail[1] and first <= upto - tail[2]:
            # a kept tail (`SuffixSplice.attach_tail`): its tokens keep their labels, which depend only on its
            # own regions (each starts at or after its first token, the turn opener), shifted with them
            t_old, t_new, upto = tail[0], tail[1], upto - tail[2]
            roles_tail, mask_tail = self._roles[t_old:], self._mask[t_old:]
            del self._roles[t0:], self._mask[t0:]
            self._roles += ["scaffold"] * (t_new - t0)
            self._roles += roles_tail
            self._mask += [0] * (t_new - t0)
            self._mask += mask_tail
        else:
            del self._roles[t0:], self._mask[t0:]
            self._roles.extend(["scaffold"] * (n - t0))
            self._mask.extend([0] * (n - t0))
        todo = self._regions[first:upto] + ([self._final] if self._final is not None else [])
        for r in self._regions[min(self._new_at, first) : first]:  # those before `_new_at` were labelled
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
            if r.kind == "content" and z > a and self._roles[a] != "scaffold":
                a += 1  # a token already labelled by an earlier region keeps that label, so a full render
                # and an incremental one (which never relabels tokens before its first new one) agree
            if z > a:
                self._roles[a:z] = [r.role] * (z - a)
                if r.kind == "produced":
                    self._mask[a:z] = [1] * (z - a)
        return t0
