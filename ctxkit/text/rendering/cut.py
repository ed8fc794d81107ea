"""Cutting an `IncrementalRenderer` back to a prefix of its messages.

Part of `ctxkit.text.rendering.renderer`. A compaction that masks or truncates tool outputs changes a view from its
first edited message on and keeps every message before it. `IncrementalRenderer.cut(n)` (`cut_messages`)
makes a renderer forget its messages from index `n` on, so the edited view's remaining messages can be
appended and rendered as if the renderer had been fresh, re-using the work done for the shared prefix:

- the message-level state (chat dicts, sampled ids, tool-call ids, special tokens, located regions,
  sampled-id substitutions, cached assistant turn texts) is cut to the first `n` messages;
- the rendered-space state (text, ids, labels) is kept whole: the next render compares its text with
  the old one and re-tokenizes and relabels only from the last special-token boundary before their
  first difference, as every incremental render does;
- for a local template (`template_locality`), the core text (the render of the first `m` messages
  without the generation prompt, which windowed rendering extends) is cut back to the latest
  checkpoint `m <= n`: each core the renderer held is a prefix of the later ones as long as they
  only grew (`set_core` records where each ended), so the cut core is exactly the render of the
  first `m` messages, and the next render draws only the tail from `m` on through the template.

Ids, labels, spans and hashes after a cut equal those of a fresh renderer given the same messages
(tests/text/test_render_cut.py checks random edits with hypothesis).
"""

from __future__ import annotations

import bisect
from typing import Any, Callable

from ctxkit.errors import TemplateError
from ctxkit.text.rendering.state import RenderState

Render = Callable[[list, bool], str]


def made_call_ids(messages: Any) -> set[str]:
    """The tool-call ids the (already validated) messages make, as `validate_message` collects them
    (a call without an id is `#anonymous<message index>.<call index>`)."""
    out: set[str] = set()
    for index, m in enumerate(messages):
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        for j, call in enumerate(calls or ()):
            out.add(str(call["id"]) if call.get("id") is not None else f"#anonymous{index}.{j}")
    return out


def cut_messages(st: RenderState, policy: Any, profile: Any, render: Render, n: int) -> None:
    """Forget every message from index `n` on (`0 <= n < len(st.messages)`): the next render of the messages
    kept plus those appended after equals a fresh renderer's render of them. `policy`: role -> special-token
    policy; `profile`: the template's `TemplateProfile`; `render`: `(chat, agp) -> text` by the template."""
    locality = profile.locality
    boundary = boundary_core(st, profile.turn_opener, locality.reach, render, n) if locality.local else None
    del st.messages[n:], st.chat[n:], st.sampled[n:]
    st.call_ids = made_call_ids(st.chat)
    st.specials = {i: f for i, f in st.specials.items() if i < n}
    st.escape = any(policy[st.chat[i]["role"]] == "escape" for i in st.specials)
    if st.marked_at is not None and st.marked_at >= n:
        st.marked_at = None
        st.structural_ok = bool(profile.generation_prompt and profile.end_of_turn)
    st.n_assistant = sum(c.get("role") == "assistant" for c in st.chat)
    st.any_sampled = any(s is not None for s in st.sampled)
    st.turn_text = {i: t for i, t in st.turn_text.items() if i < n}
    del st.unresolved[bisect.bisect_left(st.unresolved, n):]
    regions = st.regions
    pos = next((k for k, r in enumerate(regions) if r.index >= n), len(regions))
    del regions[pos:], st.prefix_max[pos:]
    st.span_dirty = min(st.span_dirty, pos)
    st.located = min(st.located, n)
    subs = st.subs
    del subs[next((k for k, s in enumerate(subs) if s.index >= n), len(subs)):]
    if n < locality.reach:
        st.head = None
    for bases in st.reuse_bases.values():  # their iterations before message n are still these messages'
        bases[:] = [(min(b[0], max(0, n - b[4])), *b[1:]) for b in bases]
    cut_core(st, n, boundary)


def cut_core(st: RenderState, n: int, boundary: tuple[int, str] | None) -> None:
    """Cut the core back to its latest checkpoint at or before message `n`, or to `boundary` (from
    `boundary_core`) when that is later."""
    core, marks = st.core, st.core_marks
    k = bisect.bisect_right(marks, (n, float("inf")))
    del marks[k:]
    if core is None or not marks:
        st.core = None
        marks.clear()
    elif marks[-1][0] != core[0]:
        st.core = (marks[-1][0], core[1][: marks[-1][1]])
    if boundary is not None and (st.core is None or st.core[0] < boundary[0]):
        st.core = boundary
        marks[:] = [(boundary[0], len(boundary[1]))]


def boundary_core(st: RenderState, opener: str | None, reach: int, render: Render, n: int,
                  tries: int = 8) -> tuple[int, str] | None:
    """`(m, render of the first m messages without the prompt)` for the latest turn boundary `m <= n`
    past every core checkpoint, cut from the last rendered text (whose first `n` messages are kept),
    or None. The text before message `m`'s turn opener is taken as that render when a suffix window
    ending at `m` renders to its tail: the check `text.template.locality.window_delta` makes of a core, under
    the same locality of the template."""
    text = st.text
    k = bisect.bisect_right(st.core_marks, (n, float("inf")))
    done = st.core_marks[k - 1][0] if st.core is not None and k else 0
    if not text or not opener or n - done < 8:
        return None
    at = {r.index: r for r in st.regions if r.kind != "header" and r.index <= n}
    lead = max(1, reach)
    chat = st.chat
    for m in range(min(n, st.located - 1), max(done, n - tries), -1):
        a, b = at.get(m - 1), at.get(m)
        if a is None or b is None or a.end > b.start:
            continue
        pos = text.rfind(opener, a.end, b.start)
        if pos < 0:
            continue
        j = m - max(2, reach + 1)
        while j > lead and chat[j].get("role") == "tool" and m - j < 64:
            j -= 1
        if j <= lead:
            return None
        try:
            head = st.head if st.head is not None else render(chat[:lead], False)
            window = render(chat[:lead] + chat[j:m], False)
        except TemplateError:
            return None
        body = window[len(head):]
        if body and window.startswith(head) and text.startswith(head) and text.startswith(body, pos - len(body)):
            return m, text[:pos]
        return None
    return None


def set_core(st: RenderState, m: int, text: str) -> None:
    """Hold `text` = the render of the first `m` messages without the generation prompt as the core,
    keeping the checkpoints of earlier cores it extends."""
    old, marks = st.core, st.core_marks
    if old is None or not text.startswith(old[1]):
        marks.clear()
    while marks and marks[-1][0] >= m:
        marks.pop()
    marks.append((m, len(text)))
    st.core = (m, text)
