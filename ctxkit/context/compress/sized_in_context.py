"""Version 3 of `mask-observations` and `truncate-tool-output`: sizes counted in context.

Versions 1 and 2 size each tool output on its own: `mask-observations` writes the output's standalone token
count into its placeholder, `truncate-tool-output` encodes every long output standalone to decide whether
it fits and where to cut. Each of those is a second tokenization of text the builder has just rendered.
Version 3 reads the same facts off the render the builder already has (`CompressionRequest.rendered`):

- An output's **in-context count** is the number of tokens of the current view's final render that its
  text occupies: the tokens of its `MessageSpan` (every token overlapping the text, a token merged across
  its first or last character included). It can differ by a token or two from the standalone count.
- `mask-observations-v3`: the placeholder's `{n_tokens}` is the in-context count of the message masked (the
  tokens masking frees; for an output already truncated, those of the truncated text, where version 2 gives
  the original's standalone count). Candidates of the halving search are estimated as the measured size
  less the in-context counts of the masked messages plus the placeholders' counts (no scaffold term, pins
  or not); as in version 2, only candidates estimated to fit, and the last, are measured.
- `truncate-tool-output-v3`: an output fits when its in-context count is at most `max_tokens`. A longer one
  is cut from its in-context ids: the kept head and tail are decoded from them (a token straddling the
  text's edge, merged with the template's text around it, is left out and the few characters of the text
  it held are kept with the part, up to `EDGE_CHARS`; each part is checked to be a literal prefix or suffix
  of the output), the marker's `n_cut` is the in-context count less the kept tokens, and only the short composed
  text is counted with the real tokenizer, shrinking the kept part until it is at most `max_tokens` tokens:
  the cap stays exact. Where the ids cannot be used (no span for the message, or its decoded tokens do not
  reproduce the text) the output is cut as version 2 cuts it.

Like version 2, both do one thing and drop no turns; `mask-then-window-v2` and `truncate-then-window-v2`
(`ctxkit.context.compress.presets`) follow them with `window`. Both need `CompressionRequest.rendered` (the builder
passes it); without it they raise `ConfigError`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ctxkit.context.compress.base import CompressionRequest
from ctxkit.context.compress.mask_observations import MaskObservations
from ctxkit.context.compress.truncate_tool_output import MARKER, TruncateToolOutput, truncate_text
from ctxkit.context.compress.turns import base_messages
from ctxkit.edits import TruncateEdit
from ctxkit.errors import ConfigError
from ctxkit.context.view import View, ViewMessage, apply_edits

__all__ = ["MaskObservationsV3", "TruncateToolOutputV3", "content_spans", "cut_in_context"]


def content_spans(request: CompressionRequest, who: str) -> tuple[Any, dict[int, tuple[int, int]]]:
    """`(rendered context of request.view, {id(message): (start, end)})`: the token range of each tool
    message's own text in the view's final render (messages the template drops are absent)."""
    if request.rendered is None:
        raise ConfigError(f"{who}: needs the builder's render of the view (CompressionRequest.rendered), which this "
                          "request does not carry; build with ctxkit.ContextBuilder or pass `rendered`")
    view = request.view
    out = request.rendered(view)
    msgs = view.messages
    spans: dict[int, tuple[int, int]] = {}
    for sp in out.spans:
        if sp.role == "tool" and sp.end > sp.start and 0 <= sp.index < len(msgs):
            spans[id(msgs[sp.index])] = (sp.start, sp.end)
    return out, spans


class MaskObservationsV3(MaskObservations):
    """`mask-observations-v3`: version 2 with each placeholder giving the tokens the output occupied in the
    render (its in-context count), read off the builder's render instead of encoding the output again."""

    VERSION = 3

    def output_counter(self, request: CompressionRequest) -> Callable[[ViewMessage], int]:
        """In-context count of a message of `request.view` (its standalone count if the render has no span
        for it)."""
        _, spans = content_spans(request, self.spec.name)
        tok = request.tokenizer

        def count(m: ViewMessage) -> int:
            sp = spans.get(id(m))
            if sp is None:
                return tok.count(m.content) if m.content else 0
            return sp[1] - sp[0]

        return count


class TruncateToolOutputV3(TruncateToolOutput):
    """`truncate-tool-output-v3`: version 2 deciding "fits" from each output's in-context count and cutting
    from its in-context ids; only the composed text is counted, so the cap is exact."""

    VERSION = 3

    def truncate(self, request: CompressionRequest, n_tokens: int) -> tuple[list[TruncateEdit], dict[str, Any], View, int]:
        """`(edits, details, capped view, its measured size)`."""
        p = self.params
        view = request.view
        out, spans = content_spans(request, self.spec.name)
        ids = out.token_ids
        tok = request.tokenizer
        edits: list[TruncateEdit] = []
        for m in base_messages(view):
            if m.role != "tool" or m.provenance.how != "verbatim" or not m.content:
                continue
            sp = spans.get(id(m))
            if sp is not None and sp[1] - sp[0] <= p["max_tokens"]:
                continue
            eid = m.provenance.event_ids[0]
            text = None if sp is None else cut_in_context(tok, m.content, ids[sp[0]:sp[1]], p["max_tokens"], p["keep"], eid)
            if text is None:  # no usable ids: cut as version 2 does
                text = truncate_text(tok, m.content, p["max_tokens"], p["keep"], eid)
            if text is not None:
                edits.append(TruncateEdit(eid, text))
        size = n_tokens
        if edits:
            view = apply_edits(view, edits, where=self.spec.name)
            size = request.measure(view)
        return edits, {"truncated": len(edits)}, view, size


def cut_in_context(tokenizer: Any, content: str, ids: Sequence[int], max_tokens: int, keep: str,
                   event_id: str) -> str | None:
    """`content` cut to at most `max_tokens` tokens (marker included) from `ids`, the tokens its text occupies
    in a render (`len(ids)` > `max_tokens`); None when those ids do not decode to parts of `content`."""
    n = len(ids)
    room = max_tokens - tokenizer.count(MARKER.format(n_cut=n, event_id=event_id)) - 4
    while room > 0:
        parts = _parts(tokenizer, content, ids, room, keep)
        if parts is None:
            return None
        texts, kept = parts
        marker = MARKER.format(n_cut=n - kept, event_id=event_id)
        if keep == "head":
            out = f"{texts[0]}\n{marker}"
        elif keep == "tail":
            out = f"{marker}\n{texts[1]}"
        elif keep == "head_tail":
            out = f"{texts[0]}\n{marker}\n{texts[1]}"
        else:
            out = f"{marker}\n{texts[1]}\n{marker}"
        if tokenizer.count(out) <= max_tokens:
            return out
        room -= max(1, room // 16)
    return MARKER.format(n_cut=n, event_id=event_id)


def _parts(tokenizer: Any, content: str, ids: Sequence[int], room: int, keep: str) -> tuple[list[str], int] | None:
    """`([head, tail or middle], tokens kept)` for `room` tokens; None when the ids do not reproduce `content`."""
    n = len(ids)
    if keep == "head":
        head = _head(tokenizer, content, ids, room)
        return None if head is None else ([head[0], ""], head[1])
    if keep == "tail":
        tail = _tail(tokenizer, content, ids, room)
        return None if tail is None else (["", tail[0]], tail[1])
    if keep == "head_tail":
        h = room - room // 2
        head, tail = _head(tokenizer, content, ids, h), _tail(tokenizer, content, ids, room - h)
        if head is None or tail is None:
            return None
        return [head[0], tail[0]], head[1] + tail[1]
    start = max(1, (n - room) // 2)  # middle: never the (possibly straddling) edge tokens
    k = min(room, n - 1 - start)
    text, used = _decode_clean(tokenizer, ids[start:start + k])
    if k <= 0 or not text or text not in content:
        return None
    return ["", text], used


EDGE_CHARS = 16
"""How far (in characters) a kept part decoded from behind a straddling edge token may start after the text's
start (head) or end before its end (tail); the characters between are kept with it."""


def _head(tokenizer: Any, content: str, ids: Sequence[int], k: int) -> tuple[str, int] | None:
    """The first `k` tokens as a literal prefix of `content`: `ids[:k]` decoded, or, when the first token
    straddles the text's start (a token merged with the template's text before it), `ids[1:k + 1]` decoded
    and extended back to the text's start."""
    text, used = _decode_clean(tokenizer, ids[:k])
    if text and content.startswith(text):
        return text, used
    text, used = _decode_clean(tokenizer, ids[1:k + 1])
    at = content.find(text, 0, EDGE_CHARS + len(text)) if text else -1
    if at < 0:
        return None
    return content[:at + len(text)], used + (at > 0)


def _tail(tokenizer: Any, content: str, ids: Sequence[int], k: int) -> tuple[str, int] | None:
    """The last `k` tokens as a literal suffix of `content`: `ids[-k:]` decoded, or, when the last token
    straddles the text's end (merged with the template's text after it, e.g. `",\n"`), the `k` tokens
    before it decoded and extended to the text's end."""
    n = len(ids)
    text, used = _decode_clean(tokenizer, ids[max(0, n - k):])
    if text and content.endswith(text):
        return text, used
    text, used = _decode_clean(tokenizer, ids[max(0, n - 1 - k):n - 1])
    at = content.rfind(text, max(0, len(content) - len(text) - EDGE_CHARS)) if text else -1
    if at < 0:
        return None
    return content[at:], used + (at + len(text) < len(content))


def _decode_clean(tokenizer: Any, ids: Sequence[int]) -> tuple[str, int]:
    """`(text, ids used)`: `ids` decoded, dropping edge tokens that decode to a broken character."""
    ids = list(ids)
    text = tokenizer.decode(ids)
    while ids and (text.endswith("\ufffd") or text.startswith("\ufffd")):
        ids = ids[:-1] if text.endswith("\ufffd") else ids[1:]
        text = tokenizer.decode(ids)
    return text, len(ids)
