"""Rendering views for the builder: cached by view hash, incremental when a view extends or shares a prefix with one rendered before.

`RenderCache` is the builder's renderer (`ctxkit.context.builder.ContextBuilder.measure` and its final render).
A view that extends a recently rendered one is rendered by that view's `IncrementalRenderer` (only the
new text is tokenized). A view that differs from one in a single block of messages (a compaction: old
turns dropped after the leading messages, a run of tool outputs masked or truncated, a block replaced or
inserted) and shares its last messages is spliced into that renderer (`IncrementalRenderer.splice`,
`ctxkit.text.rendering.splice`): only the block's messages are prepared, the kept tail's messages, ids, regions
and labels are shifted, and its text comes from the old text and two window renders around the block, so
the work is that of the block, not of the kept tail; whatever the checks cannot confirm falls back to a
cut (`IncrementalRenderer.cut`, `ctxkit.text.rendering.cut`) and re-rendering from the first changed message.
A view that only shares a prefix is cut back to it; any other view gets a fresh renderer sharing the
`ctxkit.text.rendering.segments.SegmentCache`.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import cached_property
from typing import Any, Sequence

from ctxkit.context.view import View, ViewMessage
from ctxkit.text.rendering.renderer import IncrementalRenderer
from ctxkit.text.rendering.segments import SegmentCache, message_key, safe_opener
from ctxkit.text.template.profile import template_profile


def shared_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items `a` and `b` share (the same object or equal)."""
    n = min(len(a), len(b))
    if type(a) is not type(b) or not isinstance(a, (tuple, list)):
        a, b = list(a), list(b)
    if not n or a[:n] == b[:n]:  # compared in C, identity first (as `x is y or x == y`)
        return n
    lo, hi = 0, n - 1  # a[:lo] == b[:lo], the first difference in [lo, hi]: bisect on slices compared in C
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def shared_suffix(a: Sequence[Any], b: Sequence[Any], limit: int) -> int:
    """How many trailing items `a` and `b` share (the same object or equal), at most `limit`."""
    k = 0
    while k < limit and (a[-1 - k] is b[-1 - k] or a[-1 - k] == b[-1 - k]):
        k += 1
    return k


class RenderCache:
    """Renders views with the generation prompt. Results are cached by view hash; the renderer of the
    recent view sharing the longest prefix of messages with a new view is extended (cut back to that
    prefix first when the views part), so only the new text is tokenized. A view sharing nothing gets a
    new renderer sharing one `ctxkit.text.rendering.segments.SegmentCache`: every message seen before is taken
    prepared, and every piece of rendered text between turn openers seen before (an unchanged message
    in the same position class) keeps its ids, so only new or changed text is tokenized. Templates that
    are not local (`TemplateProfile.locality`: Qwen3, Mistral v0.3) are rendered whole each time; their
    text is still cut into segments when the tokenizer allows it."""

    def __init__(self, tokenizer: Any, template: Any, size: int = 8, special_tokens: Any = None,
                 history: str = "sampled"):
        self.tokenizer = tokenizer
        self.special_tokens = special_tokens
        self.history = history
        """How sampled turns the template re-renders otherwise enter the context (`rendering.output.HISTORY_MODES`)."""
        self.template = template
        self.size = size
        self.segments = SegmentCache()
        """Prepared messages and segment ids shared by every renderer of this cache."""
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._starts: dict[str, list[int | None]] = {}  # view hash -> turn_starts(view)
        self._chats: dict[ViewMessage, tuple[dict, Any]] = {}  # chat dicts of the messages of the last views
        # (IncrementalRenderer, its messages, its tools) of the last views rendered, newest last: a compressor
        # measures several candidates, and the next view extends the one it chose, not the last one measured
        self._bases: list[tuple[Any, tuple[ViewMessage, ...], tuple[Any, ...]]] = []

    @cached_property
    def _opener_id(self) -> int | None:
        """Id of the template's turn opener when a view's render is its turns one after another, each
        tokenized on its own (a local template, a segmentable tokenizer, a safe opener); else None."""
        profile = template_profile(self.tokenizer, self.template)
        opener = safe_opener(self.tokenizer, profile.turn_opener)
        return self.tokenizer.special_tokens[opener] if opener is not None and profile.locality.local else None

    def turn_starts(self, view: View) -> list[int | None] | None:
        """Per message of `view`, the token of its final render where its turn opener is (None for a message
        that opens no turn of its own, e.g. a tool result sharing the previous one's turn); None when the
        template does not render turns one after another or the render holds special-token text in content
        (see `CompressionRequest.turn_starts`)."""
        if self._opener_id is None:
            return None
        out = self.render(view)
        if out.special_tokens_in_content:
            return None
        hit = self._starts.get(view.hash)
        if hit is not None:
            return hit
        ids, opener = out.token_ids, self._opener_id
        by_index = {sp.index: sp for sp in out.spans}
        starts: list[int | None] = []
        prev_end = 0
        for i in range(len(view.messages)):
            sp = by_index.get(i)
            if sp is None or sp.end <= sp.start:
                return None  # a message without text of its own: the turn of the next one is not certain
            at = None
            for k in range(sp.start - 1, max(prev_end, sp.start - 32) - 1, -1):
                if ids[k] == opener:
                    at = k
                    break
            starts.append(at)
            prev_end = sp.end
        if len(self._starts) > 8:
            self._starts.clear()
        self._starts[view.hash] = starts
        return starts

    def _chat(self, m: ViewMessage) -> tuple[dict, Any]:
        """The chat dict of `m` and its `message_key`, made once per message (the dicts are never changed)."""
        hit = self._chats.get(m)
        if hit is None:
            chat = m.to_chat()
            hit = (chat, message_key(chat))
            if len(self._chats) > 50_000:
                self._chats.clear()
            self._chats[m] = hit
        return hit

    def render(self, view: View, *, cache: bool = True) -> Any:
        """The `RenderedContext` of `view` with the generation prompt; ids equal a full `render()`."""
        hit = self._cache.get(view.hash) if cache else None
        if hit is not None:
            self._cache.move_to_end(view.hash)
            return hit

        msgs = view.messages
        renderer, n = None, 0
        if cache:  # the base sharing the longest prefix of messages: extended in place, or cut back first
            bases, best = self._bases, -1
            for k in range(len(bases) - 1, -1, -1):
                if view.tools == bases[k][2] and (p := shared_prefix(msgs, bases[k][1])) > n:
                    best, n = k, p
            if best >= 0:
                renderer, old_msgs, _ = bases.pop(best)  # no longer the renderer of its old view
                s = shared_suffix(msgs, old_msgs, min(len(msgs), len(old_msgs)) - n)
                if s and n < len(old_msgs):  # one changed block: the kept tail is spliced, not appended again
                    renderer.splice(n, s, [self._chat(m) for m in msgs[n : len(msgs) - s]],
                                    lambda: [self._chat(m) for m in msgs[len(msgs) - s :]], form_checked=True)
                    n = len(msgs)
                else:
                    renderer.cut(n)
        if renderer is None:
            renderer = IncrementalRenderer(self.tokenizer, self.template, view.tools or None, self.special_tokens,
                                           segments=self.segments, history=self.history)
        for m in msgs[n:]:
            renderer.append(*self._chat(m), form_checked=True)  # a view's messages: their events checked the form
        out = renderer.render(add_generation_prompt=True)
        if cache:
            self._bases.append((renderer, msgs, view.tools))
            if len(self._bases) > 4:
                del self._bases[0]
            self._cache[view.hash] = out
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return out
