"""Per-segment caches that let a render after a compaction re-use the work of earlier renders.

Part of `ctxkit.text.rendering.renderer`. A compaction (a window dropping turns, masking rewriting old tool outputs, a
summary, a retrieved block, the pinned block) changes the message list in the middle, so the
`IncrementalRenderer` of the previous view cannot be extended. What does not change is most messages
and most of the rendered text; `SegmentCache` keeps, across renderers:

- *prepared messages*: each message's validated, normalized chat dict, its special-token occurrences
  and the tool calls it makes, keyed by the message's content (the pure part of `append`; the stateful
  checks, tool-call pairing and the special-token policy, are re-run on every append);
- *segments*: the ids, token start offsets and special-token positions of each piece of rendered text
  between two occurrences of the template's turn opener (`<|im_start|>`): one message with its
  template scaffold, keyed by that text and by whether it begins the text (its position class). A
  render tokenizes only segments it has not seen; the rest is copied.

Exactness: a tokenizer is *segmentable* when encoding a text equals encoding its pieces between
special tokens one by one (`Tokenizer.segmentable`); cutting the text at every turn opener is one such
cut when no other special token overlaps the opener's text (checked once: `safe_opener`), so the
concatenated segment ids equal the ids of the whole text. The rendered text itself always comes from
the template (whole or through `text.template.locality.window_delta`), never from cached segments.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping  # not typing.Mapping: isinstance against it is several times slower
from typing import Any, Iterable

from ctxkit.text.template.chat_template import plain_value



class SegmentCache:
    """Caches shared by the renderers of one tokenizer and template (see the module docstring)."""

    def __init__(self, max_segments: int = 20_000, max_messages: int = 20_000):
        self.max_segments = max_segments
        """Segments kept (least recently used dropped first)."""
        self.max_messages = max_messages
        """Prepared messages kept."""
        self.segments: OrderedDict[tuple[str, bool], tuple] = OrderedDict()
        self.messages: OrderedDict[Any, tuple] = OrderedDict()
        self.segment_hits = 0
        """Segments copied from the cache."""
        self.segment_misses = 0
        """Segments tokenized."""
        self._tools: tuple[Any, Any] | None = None  # (tools object given, its plain copy)

    def plain_tools(self, tools: Any) -> Any:
        """`text.template.chat_template.plain_value(list(tools), "tools")`, made once per tools object (renderers of one
        builder are given the same, immutable, `View.tools` tuple again and again)."""
        if self._tools is not None and self._tools[0] is tools:
            return self._tools[1]
        plain = plain_value(list(tools), "tools")
        if isinstance(tools, tuple):  # a list could be changed in place by its owner: not kept
            self._tools = (tools, plain)
        return plain

    def prepared(self, key: Any, message: Mapping[str, Any], call_ids: set[str]) -> tuple | None:
        """The prepared form of a message stored under `key`, or None (also when the message is a tool
        result that answers no call in `call_ids`: the full validation then raises the orphaned result)."""
        hit = self.messages.get(key)
        if hit is not None:
            if message.get("role") == "tool":  # the pairing check, as `validate_message` does it
                call_id = message.get("tool_call_id")
                if not (str(call_id) in call_ids if call_id is not None else call_ids):
                    return None
            self.messages.move_to_end(key)
        return hit

    def store(self, key: Any, value: tuple) -> None:
        """Keep the prepared form of a message under `key`."""
        self.messages[key] = value
        if len(self.messages) > self.max_messages:
            self.messages.popitem(last=False)


def message_key(message: Mapping[str, Any]) -> Any:
    """A hashable key for a chat message's content, or None when it has none (unhashable parts)."""
    try:
        calls = message.get("tool_calls")
        call_key = None if calls is None else tuple(
            (c.get("id"), c.get("type"), _freeze(c.get("function"))) for c in calls)
        return (message.get("role"), _freeze(message.get("content")), call_key, message.get("tool_call_id"),
                message.get("name"), message.get("reasoning_content"),
                None if message.get("token_ids") is None else tuple(message["token_ids"]),
                tuple(sorted(message.keys() - _KNOWN_KEYS)) or None)
    except (TypeError, AttributeError):
        return None


_KNOWN_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content", "token_ids"})


def _freeze(value: Any) -> Any:
    if type(value) is str or value is None:  # the common leaves, hashable as they are
        return value
    if isinstance(value, Mapping):
        return tuple((k, _freeze(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ("__list__",) + tuple(_freeze(v) for v in value)
    hash(value)
    return value


def made_calls(message: Mapping[str, Any]) -> frozenset[str] | None:
    """The tool-call ids an (already validated) message makes, or None when one has no id (its stand-in
    id depends on the message's index, so the prepared form is not reusable)."""
    calls = message.get("tool_calls") if message.get("role") == "assistant" else None
    if not calls:
        return frozenset()
    if any(c.get("id") is None for c in calls):
        return None
    return frozenset(str(c["id"]) for c in calls)


def safe_opener(tokenizer: Any, opener: str | None) -> str | None:
    """`opener` if every occurrence of its text in a rendered text is a special-token match of its own
    (no other special token contains it or overlaps it), so cutting there keeps the ids; else None."""
    specials = getattr(tokenizer, "special_tokens", None) or {}
    if not opener or opener not in specials or not getattr(tokenizer, "segmentable", False):
        return None
    for s in specials:
        if s == opener:
            continue
        if opener in s or s in opener:
            return None
        for k in range(1, min(len(s), len(opener))):
            if s.endswith(opener[:k]) or opener.endswith(s[:k]):
                return None
    return opener


def encode_segments(cache: SegmentCache, tokenizer: Any, text: str, base: int, opener: str,
                    special_len: Mapping[int, int], out: tuple[list[int], list[int], list[int], list[int]]) -> None:
    """Append to `out = (ids, starts, special_ends, special_counts)` the tokens of `text`, which begins at
    char `base` of the whole rendered text (at a special-token boundary, after the `len(ids)` tokens
    already in `out`), cut at every `opener`: starts and special ends are absolute chars, special counts
    the number of tokens up to and including each special token."""
    ids, starts, sp_ends, sp_tok = out
    segments = cache.segments
    pos, n = 0, len(text)
    first = base == 0
    while pos < n:
        nxt = text.find(opener, pos + 1)
        if nxt < 0:
            nxt = n
        key = (text[pos:nxt], first)
        hit = segments.get(key)
        if hit is None:
            s_ids, s_starts, at = tokenizer.encode_with_specials(key[0], at_start=first)
            s_sp = tuple([(s_starts[k] + special_len[s_ids[k]], k + 1) for k in at])
            hit = (tuple(s_ids), tuple(s_starts), s_sp)
            segments[key] = hit
            cache.segment_misses += 1
            if len(segments) > cache.max_segments:
                segments.popitem(last=False)
        else:
            cache.segment_hits += 1
        k0 = len(ids)
        off = base + pos
        ids.extend(hit[0])
        starts.extend([off + s for s in hit[1]])  # a comprehension adds ints faster than map(off.__add__)
        for e, t in hit[2]:
            sp_ends.append(off + e)
            sp_tok.append(k0 + t)
        pos, first = nxt, False


def strings_in(value: Any) -> Iterable[str]:
    """Every string inside a nested dict/list value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from strings_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from strings_in(v)
