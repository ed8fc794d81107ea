"""The text of a render: spliced around a changed block, from a suffix window, or the whole conversation.

Part of `ctxkit.text.rendering.renderer`. For a template `template_locality` finds local, `rendered_text` takes
the text from `splice.spliced_text` when a splice is expected, else from a suffix window
(`text.template.locality.window_delta`) checked against the core (`RenderState.core`, the render of the
first messages without the generation prompt), whose old part may come from an earlier core's checkpoint
(`window_mark`). Whenever a check fails, and for any other template, the whole conversation is rendered.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable

from ctxkit.errors import TemplateError
from ctxkit.text.rendering.cut import set_core
from ctxkit.text.rendering.splice import spliced_text
from ctxkit.text.rendering.state import RenderState
from ctxkit.text.template.locality import window_delta, window_start

Render = Callable[[list, bool], str]


def rendered_text(st: RenderState, render: Render, locality: Any, agp: bool) -> str:
    """The full rendered text with `agp` (see the module docstring); `render`: `(chat, agp) -> text` by the
    template, `locality`: its `Locality`. Counts the render in `st.window_renders` or `st.full_renders`."""
    if st.splice is not None and (spliced := spliced_text(st, render, locality, agp)) is not None:
        return spliced
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
