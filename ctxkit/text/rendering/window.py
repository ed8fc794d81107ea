"""The text of a render: spliced around a changed block, from a suffix window, or the whole conversation.

Part of `ctxkit.text.rendering.renderer`. For a template `template_locality` finds local, `rendered_text` takes
the text from `splice.spliced_text` when a splice is expected, else from a suffix window
(`text.template.locality.window_delta`) checked against the core (`RenderState.core`, the render of the
first messages without the generation prompt), whose old part may come from an earlier core's checkpoint
(`window_mark`). For a template that is not local but whose main loop's iterations may be kept
(`text.template.iteration_reuse`), `reused_text` renders the prelude, the first `reach` iterations and the
iterations from `m - reach` on, and keeps the text of those between from the last such render of `m` messages
with the same generation-prompt flag (the renderer's prefix renders for locating turns go the same way).
Whenever a check fails, and for any other template, the whole conversation is rendered.
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from itertools import accumulate
from typing import Any, Callable

from ctxkit.errors import TemplateError
from ctxkit.text.rendering.cut import set_core
from ctxkit.text.rendering.splice import spliced_text
from ctxkit.text.rendering.state import RenderState
from ctxkit.text.template.locality import window_delta, window_start

Render = Callable[[list, bool], str]
Pieces = Callable[..., Any]
"""`(chat, agp, lead, start, restore=None, resume=None) -> iteration_reuse.Pieces | None`: a marked render writing
iterations `< lead` and `>= start`, the carried namespaces set to `restore` at `start`, its scans resumed from
`resume` (`text.template.scan_reuse`)."""


def rendered_text(st: RenderState, render: Render, locality: Any, agp: bool,
                  reuse: tuple[Pieces, int] | None = None) -> str:
    """The full rendered text with `agp` (see the module docstring); `render`: `(chat, agp) -> text` by the
    template, `locality`: its `Locality`; `reuse`: `(pieces, reach)` when the template's loop iterations may be
    kept (`ReusePlan`). Counts the render in `st.window_renders`, `st.reuse_renders` or `st.full_renders`."""
    if st.splice is not None and (spliced := spliced_text(st, render, locality, agp)) is not None:
        return spliced
    if reuse is not None:
        try:
            reused = reused_text(st, reuse[0], reuse[1], agp)
        except TemplateError:  # the plain render below decides (the markers count towards the output limit)
            st.reuse_bases.pop(agp, None)
            reused = None
        if reused is not None:
            return reused
    chat, core = st.chat, st.core
    local, reach, prompt = locality.local, locality.reach, locality.prompt
    if local and core is not None:
        try:
            if st.head is None and len(chat) >= reach:
                st.head = render(chat[:reach], False)
            got = window_delta(render, chat, core[0], core[1], agp, st.head, reach, prompt,
                               mark=window_mark(st, reach, core[0]))
        except TemplateError:
            got = None  # the full render below decides (and raises if the template rejects it)
        if got is not None:
            set_core(st, len(chat), got[0])
            st.window_renders += 1
            return got[1]
    text = render(chat, agp)
    st.full_renders += 1
    if local:
        try:
            cut = agp and prompt is not None and text.endswith(prompt)  # see Locality.prompt
            set_core(st, len(chat), text[: len(text) - len(prompt)] if cut else render(chat, False) if agp else text)
        except TemplateError:  # the template wants the prompt here: no window base this time
            st.core = None
    return text


def window_mark(st: RenderState, reach: int, m: int, stretch: int = 4) -> tuple[int, int] | None:
    """`(j, p)` for `window_delta`: the latest earlier core (a checkpoint in `st.core_marks`, whose text is
    `core[:p]` = the render of the first `j` messages) at or before the default window start for a core
    of `m` messages, at most `stretch` messages before it; None when there is none."""
    marks = st.core_marks
    if len(marks) < 2:
        return None
    j = window_start(st.chat, m, reach)
    k = bisect.bisect_right(marks, (j, float("inf"))) - 1
    if k < 0 or marks[k][0] < j - stretch or marks[k][0] <= max(1, reach):
        return None
    return marks[k]


KEPT_BASES = 2
"""Reuse bases kept per generation-prompt flag (the longest renders): a turn's main render and the prefix render
of the turn before, which locating the next assistant turn asks for again."""


def reused_text(st: RenderState, pieces: Pieces, reach: int, agp: bool, chat: list | None = None,
                count: bool = True) -> str | None:
    """The text of `chat` (a prefix of `st.chat`; default: all of it) with `agp` through the marked template:
    a base's text when it rendered these very messages, else the earlier iterations kept from the base that
    keeps most (`st.reuse_bases[agp]`) when its snapshot is this render's, else every iteration rendered (a new
    base). None when the markers do not cut the render as expected (the caller renders the plain template).
    `count`: count it in `st.reuse_renders` / `st.full_renders`.

    A base of more messages serves a shorter prefix too: the iterations it keeps are below `len(chat) - reach`,
    so each reads messages of the prefix only and is not its last."""
    chat = st.chat if chat is None else chat
    n = len(chat)
    bases = st.reuse_bases.setdefault(agp, [])
    for base in bases:
        if base[5] == n == base[0] + base[4]:  # these very messages (none cut since): the same text
            st.reuse_renders += count
            return base[1]
    base = max(bases, key=lambda b: min(b[0], n - b[4]), default=None)
    new = _from_base(base, pieces, reach, chat, agp) if base is not None else None
    if new is None:
        got = pieces(chat, agp, n, n)
        if got is None:
            bases.clear()
            return None
        text = "".join((got.prelude, *got.iterations, got.epilogue))
        new = (len(got.iterations), text, _ends(len(got.prelude), got.iterations), got.snapshot, got.offset, n,
               got.states, got.scans)
        st.full_renders += count
    else:
        st.reuse_renders += count
    bases.append(new)
    if len(bases) > KEPT_BASES:
        bases.remove(min(bases, key=lambda b: b[5]))
    return new[1]


def _from_base(base: tuple, pieces: Pieces, reach: int, chat: list, agp: bool) -> tuple | None:
    """The new base of rendering `chat` with the iterations `[reach, start)` kept from `base`; None when it keeps
    none or its snapshot differs."""
    m, old, ends, snapshot, offset, _, states, scans = base
    n, lead = len(chat), reach
    start = min(m, n - offset) - reach
    if start <= lead:
        return None
    # the scans' records hold for the messages the base's kept iterations still render (fewer after a cut)
    resume = {k: replace(r, known=min(r.known, m + offset)) for k, r in (scans or {}).items()}
    got = pieces(chat, agp, lead, start, None if states is None else states[start][1], resume)
    if got is None or got.snapshot != snapshot:
        return None
    if states is not None:
        # the kept iterations start from the base's state at `lead` (this render's, before the restore at `start`)
        if got.states is None or got.states[lead][0] != states[lead][0]:
            return None
        states = got.states[:lead] + states[lead:start + 1] + got.states[lead + 1:]
    head = got.prelude + "".join(got.iterations[:lead])
    a, b = ends[lead - 1], ends[start - 1]
    shift = len(head) - a
    tail = got.iterations[lead:]
    new_ends = (_ends(len(got.prelude), got.iterations[:lead]) + [e + shift for e in ends[lead:start]]
                + _ends(b + shift, tail))
    return n - offset, "".join((head, old[a:b], *tail, got.epilogue)), new_ends, snapshot, offset, n, states, got.scans


def _ends(offset: int, texts: list[str]) -> list[int]:
    """End char of each of `texts` written one after another from `offset`."""
    return list(accumulate(map(len, texts), initial=offset))[1:]
