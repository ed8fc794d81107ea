"""Cutting an `IncrementalRenderer` back to a prefix of its messages.

Part of `ctxkit.text.rendering.renderer`. A compaction that masks or truncates tool outputs changes a view from its
first edited message on and keeps every message before it. `PrefixCut.cut(n)` makes a renderer forget
its messages from index `n` on, so the edited view's remaining messages can be appended and rendered
as if the renderer had been fresh, re-using the work done for the shared prefix:

- the message-level state (chat dicts, sampled ids, tool-call ids, special tokens, located regions,
  sampled-id substitutions, cached assistant turn texts) is cut to the first `n` messages;
- the rendered-space state (text, ids, labels) is kept whole: the next render compares its text with
  the old one and re-tokenizes and relabels only from the last special-token boundary before their
  first difference, as every incremental render does;
- for a local template (`template_locality`), the core text (the render of the first `m` messages
  without the generation prompt, which windowed rendering extends) is cut back to the latest
  checkpoint `m <= n`: each core the renderer held is a prefix of the later ones as long as they
  only grew (`_set_core` records where each ended), so the cut core is exactly the render of the
  first `m` messages, and the next render draws only the tail from `m` on through the template.

Ids, labels, spans and hashes after a cut equal those of a fresh renderer given the same messages
(tests/text/test_render_cut.py checks random edits with hypothesis).
"""

from __future__ import annotations

import bisect
from typing import Any

from ctxkit.errors import ConfigError, TemplateError


def made_call_ids(messages: Any) -> set[str]:
    """The tool-call ids the (already validated) messages make, as `validate_message` collects them
    (a call without an id is `#anonymous<message index>.<call index>`)."""
    out: set[str] = set()
    for index, m in enumerate(messages):
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        for j, call in enumerate(calls or ()):
            out.add(str(call["id"]) if call.get("id") is not None else f"#anonymous{index}.{j}")
    return out


class PrefixCut:
    """Mixin of `IncrementalRenderer`: `cut(n)` and the core checkpoints it needs (see the module docstring).

    Uses the renderer's state (`_messages`, `_chat`, `_regions`, `_subs`, `_core`, ...)."""

    def cut(self, n: int) -> None:
        """Forget every message from index `n` on (0 <= n); the next render of the messages kept plus
        those appended after equals a fresh renderer's render of them."""
        if n < 0:
            raise ConfigError(f"IncrementalRenderer.cut: parameter n is {n}; expected a message count >= 0")
        if n >= len(self._messages):
            return
        boundary = self._boundary_core(n) if self._local else None
        del self._messages[n:], self._chat[n:], self._sampled[n:]
        self._call_ids = made_call_ids(self._chat)
        self._specials = {i: f for i, f in self._specials.items() if i < n}
        self._escape = any(self._policy[self._chat[i]["role"]] == "escape" for i in self._specials)
        if self._marked_at is not None and self._marked_at >= n:
            self._marked_at = None
            self._structural_ok = bool(self._profile.generation_prompt and self._profile.end_of_turn)
        self._n_assistant = sum(c.get("role") == "assistant" for c in self._chat)
        self._any_sampled = any(s is not None for s in self._sampled)
        self._turn_text = {i: t for i, t in self._turn_text.items() if i < n}
        del self._unresolved[bisect.bisect_left(self._unresolved, n):]
        regions = self._regions
        pos = next((k for k, r in enumerate(regions) if r.index >= n), len(regions))
        del regions[pos:], self._prefix_max[pos:]
        self._span_dirty = min(self._span_dirty, pos)
        self._located = min(self._located, n)
        subs = self._subs
        del subs[next((k for k, s in enumerate(subs) if s.index >= n), len(subs)):]
        if n < self._reach:
            self._head = None
        core, marks = self._core, self._core_marks
        k = bisect.bisect_right(marks, (n, float("inf")))
        del marks[k:]
        if core is None or not marks:
            self._core = None
            marks.clear()
        elif marks[-1][0] != core[0]:
            self._core = (marks[-1][0], core[1][: marks[-1][1]])
        if boundary is not None and (self._core is None or self._core[0] < boundary[0]):
            self._core = boundary
            marks[:] = [(boundary[0], len(boundary[1]))]

    def _boundary_core(self, n: int, tries: int = 8) -> tuple[int, str] | None:
        """`(m, render of the first m messages without the prompt)` for the latest turn boundary `m <= n`
        past every core checkpoint, cut from the last rendered text (whose first `n` messages are kept),
        or None. The text before message `m`'s turn opener is taken as that render when a suffix window
        ending at `m` renders to its tail: the check `text.template.locality.window_delta` makes of a core, under
        the same locality of the template."""
        text, opener, reach = self._text, self._profile.turn_opener, self._reach
        k = bisect.bisect_right(self._core_marks, (n, float("inf")))
        done = self._core_marks[k - 1][0] if self._core is not None and k else 0
        if not text or not opener or n - done < 8:
            return None
        at = {r.index: r for r in self._regions if r.kind != "header" and r.index <= n}
        lead = max(1, reach)
        chat = self._chat
        for m in range(min(n, self._located - 1), max(done, n - tries), -1):
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
                head = self._head if self._head is not None else self._render_text(chat[:lead], False)
                window = self._render_text(chat[:lead] + chat[j:m], False)
            except TemplateError:
                return None
            body = window[len(head):]
            if body and window.startswith(head) and text.startswith(head) and text.startswith(body, pos - len(body)):
                return m, text[:pos]
            return None
        return None

    def _set_core(self, m: int, text: str) -> None:
        """Hold `text` = the render of the first `m` messages without the generation prompt as the core,
        keeping the checkpoints of earlier cores it extends."""
        old, marks = self._core, self._core_marks
        if old is None or not text.startswith(old[1]):
            marks.clear()
        while marks and marks[-1][0] >= m:
            marks.pop()
        marks.append((m, len(text)))
        self._core = (m, text)
