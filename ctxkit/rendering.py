"""Token-exact rendering of a conversation, with a loss mask derived without generation markers (L3).

`render(messages, tokenizer, template=None, tools=None, add_generation_prompt=False)` gives the ids
`apply_chat_template(messages, tools=tools, tokenize=True, ...)` gives, plus per-token roles, a loss
mask that is 1 exactly on the tokens the policy produces in each assistant turn (content, tool calls,
the end-of-turn token) and message spans. `IncrementalRenderer` does the same for a growing
conversation and tokenizes only the text after the last stable special-token boundary.

How assistant turns are located in the rendered text (never from `{% generation %}` markers):

- *structural* (one render): the template's generation prompt `G` (e.g. `<|im_start|>assistant\\n`)
  opens every assistant turn and its end-of-turn token `E` closes it. Used when `G` occurs exactly
  once per assistant turn (plus the final prompt) and no message text contains their special tokens.
  The produced region is the text after `G` up to and including `E`.
- *per turn* (otherwise, e.g. Mistral, whose generation prompt is empty): each assistant turn's own
  text is taken from prefix renders (render of the messages before it with the generation prompt vs.
  the render with it), cut after `E`, and found in the full render in order. If it cannot be found
  (the template rewrites the turn), that is a `RenderError`, never an all-zero mask.

Text: for a template `template_locality` finds local (Qwen2.5, SmolLM2, chatml-tools-v1; not Qwen3,
which rewrites earlier turns, nor Mistral), `IncrementalRenderer` renders only a short suffix window
of the conversation after its first render (`template_locality.window_delta`), checked against the
text already known; otherwise, and whenever that check fails, it renders the whole conversation.

Token-in-token-out: an assistant dict may carry `"token_ids"` (the sampled ids). They replace the
rendered ids of that turn's produced region verbatim; where they differ, a `Drift` is recorded. If
the sampled ids lack the end-of-turn token (finish by length), the template's end-of-turn token stays
in the context as scaffold with mask 0.

Content follows `ctxkit.content` (text parts flattened, images refused). Special-token text inside a
message's content follows the `special_tokens` policy (`ctxkit.special_tokens`: allow | escape | error per
role; default escapes tool content) and every occurrence is reported in `special_tokens_in_content`.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from ctxkit.chat_messages import message_text, validate_message
from ctxkit.errors import MessageFormatError, RenderError, SpecialTokenError, TemplateError
from ctxkit.render_cut import PrefixCut
from ctxkit.render_mask import TextRegion, TurnLabeller
from ctxkit.render_splice import SuffixSplice
from ctxkit.render_segments import SegmentCache, made_calls, message_key, safe_opener, strings_in
from ctxkit.special_tokens import encode_escaped, find_special_tokens, resolve_special_tokens
from ctxkit.template_locality import window_delta
from ctxkit.template_profile import template_profile
from ctxkit.templates import ChatTemplate, load_template, normalize_messages, plain_value
from ctxkit.tokenizers import Tokenizer, load_tokenizer

TOKEN_ROLES = ("system", "user", "assistant", "tool", "scaffold", "generation_prompt")
"""Roles a token can have: the role of the message it renders, template scaffold, or a generation prompt."""


@dataclass(frozen=True)
class MessageSpan:
    """Token range of one message's own text in a rendered context (scaffold around it excluded)."""

    index: int
    """Index of the message in the list rendered."""
    role: str
    """The message's role."""
    start: int
    """First token (inclusive)."""
    end: int
    """Last token (exclusive); for assistant turns this is the produced region, end-of-turn included."""


@dataclass(frozen=True)
class Drift:
    """A sampled assistant turn whose ids differ from the template's re-rendering of it."""

    message_index: int
    """Index of the assistant message."""
    position: int
    """Token position (in the rendered context) of the first differing token."""
    sampled_ids: tuple[int, ...]
    """The differing run of sampled ids (kept in the context)."""
    rendered_ids: tuple[int, ...]
    """The run the template plus tokenizer would have produced in their place."""


@dataclass(frozen=True)
class RenderedContext:
    """A conversation rendered through a template and tokenizer."""

    token_ids: tuple[int, ...]
    """The ids, identical to `apply_chat_template(..., tokenize=True)` (sampled ids kept verbatim)."""
    loss_mask: tuple[int, ...]
    """1 on tokens the policy produced (assistant turns, end-of-turn included), 0 elsewhere."""
    roles: tuple[str, ...]
    """Per token: system | user | assistant | tool | scaffold | generation_prompt."""
    spans: tuple[MessageSpan, ...]
    """Token range of each message's own text (empty range if the template drops it)."""
    drifts: tuple[Drift, ...]
    """Token-in-token-out drifts: sampled turns the template would tokenize differently."""
    template_id: str
    """Id of the template used."""
    tokenizer_id: str
    """Id of the tokenizer used."""
    prefix_preserving: bool
    """Whether the template is prefix-preserving (see `TemplateReport.prefix_preserving`)."""
    hash: str
    """`context_hash(token_ids)`."""
    special_tokens_in_content: tuple = ()
    """`ctxkit.special_tokens.SpecialTokenInContent` records: special-token text found in message content."""

    def __len__(self) -> int:
        return len(self.token_ids)


def context_hash(token_ids: Iterable[int]) -> str:
    """sha256 hex of `b"ctxkit-context-v1"` followed by the ids as little-endian int32."""
    h = hashlib.sha256(b"ctxkit-context-v1")
    h.update(_int32_bytes(list(token_ids)))
    return h.hexdigest()



class IncrementalRenderer(TurnLabeller, PrefixCut, SuffixSplice):
    """Renders a growing conversation; each `render` tokenizes only text after the last stable
    special-token boundary and relabels only what changed. Ids equal a full `render` every time."""

    def __init__(self, tokenizer, template: ChatTemplate | str | None = None, tools: Sequence[Mapping] | None = None,
                 special_tokens: str | Mapping[str, str] | None = None, segments: SegmentCache | None = None):
        self.tokenizer: Tokenizer = load_tokenizer(tokenizer)
        self.segments = segments  # caches shared with other renderers (`ctxkit.render_segments`), or None
        self._policy = resolve_special_tokens(special_tokens)
        self.special_tokens: Mapping[str, str] = dict(self._policy)
        """The policy role -> allow | escape | error (see `ctxkit.special_tokens`)."""
        self._specials: dict[int, list[tuple[int, str]]] = {}  # message index -> (char, token) in its content
        self._escape = False  # some escaped message holds special-token text: tokenize with escapes
        self.template: ChatTemplate = load_template(template, self.tokenizer)
        self.tools = None if tools is None else list(tools)
        self._tools_plain = None if tools is None else plain_value(list(tools), "tools") if segments is None else segments.plain_tools(tools)
        self._profile = template_profile(self.tokenizer, self.template)
        self._opener = safe_opener(self.tokenizer, self._profile.turn_opener) if segments is not None else None
        self._messages: list[dict] = []
        self._chat: list[dict] = []
        self._sampled: list[tuple[int, ...] | None] = []
        self._call_ids: set[str] = set()
        self._structural_ok = bool(self._profile.generation_prompt and self._profile.end_of_turn)
        self._marked_at: int | None = None  # the message that turned structural location off
        self._turn_text: dict[int, str] = {}
        self._special_len = {i: len(t) for t, i in self.tokenizer.special_tokens.items()}
        # rendered-space state
        self._text = ""
        self._ids: list[int] = []
        self._starts: list[int] = []
        self._sp_ends: list[int] = []  # char end of each special token, in order
        self._sp_tok: list[int] = []  # number of tokens up to and including it
        self._roles: list[str] = []
        self._mask: list[int] = []
        self._regions: list[TextRegion] = []  # message regions, in message order
        self._prefix_max: list[int] = []  # running max of region ends (monotonic, for bisect)
        self._final: TextRegion | None = None  # the trailing generation prompt, if rendered
        self._located = 0  # messages whose regions are in self._regions (in order)
        self._unresolved: list[int] = []  # messages whose text was not found in the last render
        self._n_assistant, self._any_sampled = 0, False
        self._hash_cp: tuple[int, Any] = (0, hashlib.sha256(b"ctxkit-context-v1"))
        self._mode = ""
        # windowed text rendering (templates found local by `template_locality`)
        locality = self._profile.locality
        self._local, self._reach, self._prompt = locality.local, locality.reach, locality.prompt
        self._core: tuple[int, str] | None = None  # (m, render of the first m messages without prompt)
        self._core_marks: list[tuple[int, int]] = []  # (m, its core's length) of earlier cores (`PrefixCut`)
        self._head: str | None = None  # render of the first `reach` messages (see window_delta)
        self._subs: list[_Sub] = []  # sampled-id substitutions of the last output, in order
        self._out: tuple[list, list, list] = ([], [], [])  # output ids/mask/roles of rendered tokens [0, _out_at)
        self._out_at = 0  # 0 or the end of the last substitution that is not an identity (`_output`)
        self._span_list: list[MessageSpan] = []  # spans of the last output, in region order
        self._span_at: list[int] = [0]  # number of spans from regions[:i]
        self._span_dirty = 0  # regions[:i] unchanged since the last output for i <= this
        self.window_renders = 0
        """Renders whose text came from a suffix window (`template_locality.window_delta`)."""
        self.full_renders = 0
        """Renders of the whole conversation through the template."""

    def __len__(self) -> int:
        return len(self._messages)

    @property
    def messages(self) -> tuple[dict, ...]:
        """The messages appended so far (as given)."""
        return tuple(self._messages)

    def append(self, message: Mapping[str, Any], key: Any = None) -> None:
        """Add one OpenAI message (validated; an assistant may carry sampled `token_ids`); `key`: its `message_key`."""
        index = len(self._messages)
        key = (message_key(message) if key is None else key) if (cache := self.segments) is not None else None
        hit = cache.prepared(key, message, self._call_ids) if key is not None else None
        if hit is not None:
            clean, sampled, chat, found, made, marked = hit
            self._call_ids.update(made)
        else:
            clean, sampled = validate_message(message, index, self._call_ids, self.tokenizer.vocab_size)
            chat = normalize_messages([clean])[0]
            found = find_special_tokens(message_text(chat.get("content")), self.tokenizer)
            marked = None
            if key is not None and (made := made_calls(message)) is not None:
                marked = any(m in s for s in strings_in(chat) for m in self._profile.markers)
                cache.store(key, (clean, sampled, chat, found, made, marked))
        if found:
            role, policy = chat["role"], self._policy[chat["role"]]
            if policy == "error":
                c, tok = found[0]
                raise SpecialTokenError(f"message {index} ({role}): special token {tok!r} at char {c} of its content "
                                        f"(special_tokens policy 'error' for {role})", message_index=index, role=role,
                                        token=tok, char=c)
            self._specials[index] = found
            self._escape = self._escape or policy == "escape"
        if self._structural_ok and self._profile.markers:
            if marked is None:
                marked = any(m in s for s in strings_in(chat) for m in self._profile.markers)
            if marked:
                self._structural_ok, self._marked_at = False, index
        self._messages.append(dict(message))
        self._n_assistant += chat.get("role") == "assistant"
        self._chat.append(chat)
        self._sampled.append(sampled)
        self._any_sampled = self._any_sampled or sampled is not None

    def extend(self, messages: Iterable[Mapping[str, Any]]) -> None:
        """Append several messages."""
        for m in messages:
            self.append(m)

    def _render_text(self, chat: list[dict], agp: bool) -> str:
        return self.template.render_chat(chat, tools=self._tools_plain, add_generation_prompt=agp)

    def _retokenize(self, text: str) -> int:
        """Bring ids/starts up to date with `text`; return the char offset from which labels may change."""
        prev = self._text
        if text.startswith(prev):
            common = len(prev)
        else:
            lo, hi = 0, min(len(text), len(prev))
            while lo < hi:  # longest common prefix by bisection (memcmp-speed slices)
                mid = (lo + hi + 1) // 2
                if text[:mid] == prev[:mid]:
                    lo = mid
                else:
                    hi = mid - 1
            common = lo
        if not self.tokenizer.segmentable:
            ids, starts = self.tokenizer.encode_with_offsets(text)
            self._ids, self._starts, self._sp_ends, self._sp_tok = ids, starts, [], []
            self._text = text
            return 0
        j = bisect.bisect_right(self._sp_ends, common)
        b = self._sp_ends[j - 1] if j else 0
        k = self._sp_tok[j - 1] if j else 0
        if self._opener is not None:  # segment by segment, re-using ids of segments seen before or a kept tail
            self._encode_from(text, b, j, k)
        else:
            del self._ids[k:], self._starts[k:], self._sp_ends[j:], self._sp_tok[j:]
            new_ids, new_starts = self.tokenizer.encode_with_offsets(text[b:], at_start=(b == 0))
            special_len = self._special_len
            for n in [n for n, tid in enumerate(new_ids) if tid in special_len]:  # specials are few
                self._sp_ends.append(b + new_starts[n] + special_len[new_ids[n]])
                self._sp_tok.append(k + n + 1)
            self._ids.extend(new_ids)
            self._starts.extend(map(b.__add__, new_starts)) if b else self._starts.extend(new_starts)
        self._text = text
        return b

    # -- output -------------------------------------------------------------------------------

    def _text_for(self, agp: bool) -> str:
        """The full rendered text: from a suffix window when the template is local and the delta passes
        its check against the text already known, else a render of the whole conversation."""
        if self._splice is not None and (spliced := self._spliced_text(agp)) is not None:
            return spliced
        chat, core = self._chat, self._core
        if self._local and core is not None:
            try:
                if self._head is None and len(chat) >= self._reach:
                    self._head = self._render_text(chat[: self._reach], False)
                got = window_delta(self._render_text, chat, core[0], core[1], agp, self._head, self._reach,
                                   self._prompt)
            except TemplateError:
                got = None  # the full render below decides (and raises if the template rejects it)
            if got is not None:
                self._set_core(len(chat), got[0])
                self.window_renders += 1
                return got[1]
        text = self._render_text(chat, agp)
        self.full_renders += 1
        if self._local:
            try:
                cut = agp and self._prompt is not None and text.endswith(self._prompt)  # see Locality.prompt
                self._set_core(len(chat), text[: len(text) - len(self._prompt)] if cut
                               else self._render_text(chat, False) if agp else text)
            except TemplateError:  # the template wants the prompt here: no window base this time
                self._core = None
        return text

    def render(self, add_generation_prompt: bool = False) -> RenderedContext:
        """The context for the messages so far (ids equal `apply_chat_template(..., tokenize=True)`)."""
        text = self._text_for(add_generation_prompt)
        self._last_agp = add_generation_prompt
        try:
            if self._escape:  # locate first, then tokenize with the escaped occurrences as plain text
                core, head = self._core, self._head
                self._reset()
                self._core, self._head = core, head
                self._locate(text, add_generation_prompt, 0)
                self._ids, self._starts = encode_escaped(self.tokenizer, text, self._special_literals(text))
                self._text = ""  # no incremental reuse of an escaped tokenization
                ctx = self._output(self._relabel(0))
            else:
                stable = self._retokenize(text)
                relabel_from = self._locate(text, add_generation_prompt, stable)
                changed = self._relabel(min(stable, relabel_from))
                ctx = self._output(changed)
            if self._specials:
                ctx = replace(ctx, special_tokens_in_content=self._special_report(text))
            return ctx
        except BaseException:
            self._reset()  # the next render starts from scratch rather than from half-updated state
            raise

    def _reset(self) -> None:
        self._text, self._roles, self._mask = "", [], []
        self._ids, self._starts, self._sp_ends, self._sp_tok = [], [], [], []
        self._regions, self._prefix_max, self._unresolved = [], [], []
        self._final, self._located, self._mode, self._core = None, 0, "", None
        self._hash_cp = (0, hashlib.sha256(b"ctxkit-context-v1"))
        self._subs, self._out, self._out_at = [], ([], [], []), 0
        self._span_list, self._span_at, self._span_dirty = [], [0], 0

    def _output(self, changed: int) -> RenderedContext:
        """Assemble the context; `changed` is the first rendered token that may differ from last time.

        Sampled-id substitutions are kept between renders: those wholly before `changed` (same turn,
        same token range) are reused with the output before them; only later ones are redone. The output
        is copied up to the end of the last substitution that changes it (`_out_at`), never past it."""
        ids, mask, roles = self._ids, self._mask, self._roles
        eot_id = self._profile.end_of_turn_id
        subs = self._subs
        produced = ([r for r in self._regions if r.kind == "produced" and self._sampled[r.index] is not None]
                    if self._any_sampled else [])
        k = 0
        while (k < len(subs) and k < len(produced) and subs[k].index == produced[k].index
               and (subs[k].a, subs[k].z) == produced[k].tokens and subs[k].z <= changed):
            k += 1
        del subs[k:]
        cut, shift = (subs[-1].z, subs[-1].shift) if subs else (0, 0)
        reused_to = cut
        o_ids, o_mask, o_roles = self._out  # the output of rendered tokens [0, out_at), out_at a sub's end
        out_at = self._out_at
        if out_at > cut:
            del o_ids[cut + shift :], o_mask[cut + shift :], o_roles[cut + shift :]
            out_at = cut
        for r in produced[k:]:
            sampled = self._sampled[r.index]
            a, z = r.tokens
            rendered = ids[a:z]
            n = z - a
            if (len(sampled) == n and rendered == list(sampled) and mask[a:z].count(1) == n
                    and roles[a:z].count("assistant") == n):  # an identity: its output is the render itself
                subs.append(_Sub(r.index, a, z, a + shift, z + shift, shift, None))
                cut = z
                continue
            out_ids, out_mask, out_roles = list(sampled), [1] * len(sampled), ["assistant"] * len(sampled)
            compare = rendered
            if eot_id is not None and (not sampled or sampled[-1] != eot_id) and rendered and rendered[-1] == eot_id:
                compare = rendered[:-1]  # finished by length: the template's end-of-turn stays, as scaffold
                out_ids.append(eot_id)
                out_mask.append(0)
                out_roles.append("scaffold")
            pos0 = a + shift
            drift = None
            if list(sampled) != compare:
                p = 0
                limit = min(len(sampled), len(compare))
                while p < limit and sampled[p] == compare[p]:
                    p += 1
                q = 0
                while q < limit - p and sampled[-1 - q] == compare[-1 - q]:
                    q += 1
                drift = Drift(r.index, pos0 + p, tuple(sampled[p : len(sampled) - q]), tuple(compare[p : len(compare) - q]))
            o_ids += ids[out_at:a]
            o_ids += out_ids
            o_mask += mask[out_at:a]
            o_mask += out_mask
            o_roles += roles[out_at:a]
            o_roles += out_roles
            shift += len(out_ids) - (z - a)
            subs.append(_Sub(r.index, a, z, pos0, pos0 + len(sampled), shift, drift))
            cut = out_at = z
        self._out_at = out_at
        drifts = [sub.drift for sub in subs if sub.drift is not None]
        # per substitution: the rendered token index where it ends, the cumulative shift after it
        sub_ends, sub_shift = [sub.z for sub in subs], [sub.shift for sub in subs]
        span_pos = {sub.index: (sub.start, sub.end) for sub in subs}
        if not out_at:  # every substitution (if any) is an identity
            token_ids, loss_mask, token_roles = tuple(ids), tuple(mask), tuple(roles)
        else:
            token_ids = (*o_ids, *ids[out_at:])  # one copy each (a list concatenation would make two)
            loss_mask = (*o_mask, *mask[out_at:])
            token_roles = (*o_roles, *roles[out_at:])
        k = bisect.bisect_right(sub_ends, changed)
        out_changed = changed + (sub_shift[k - 1] if k else 0)
        for sub in subs[k:]:  # a substitution straddling `changed` may have moved: hash from its start
            if sub.a < changed < sub.z:
                out_changed = min(out_changed, sub.start)
        # Spans: those of leading regions unchanged since the last output (same token range, same
        # substitutions before them) are kept; the rest are recomputed.
        regions = self._regions
        spans, at = self._span_list, self._span_at
        p = min(self._span_dirty, len(regions), len(at) - 1)
        if self._any_sampled:
            starts = self._starts
            p = min(p, bisect.bisect_right(self._prefix_max, starts[reused_to]) if reused_to < len(starts) else p)
        del spans[at[p] :], at[p + 1 :]
        for r in regions[p:]:
            if r.kind != "header":
                if r.index in span_pos:
                    start, end = span_pos[r.index]
                    spans.append(MessageSpan(r.index, r.role, start, end))
                else:
                    a, z = r.tokens
                    d = 0
                    if sub_ends:
                        k = bisect.bisect_right(sub_ends, a)
                        d = sub_shift[k - 1] if k else 0
                    if r.span is None or r.span.start != a + d:
                        r.span = MessageSpan(r.index, self._chat[r.index]["role"], a + d, z + d)
                    spans.append(r.span)
            at.append(len(spans))
        self._span_dirty = len(regions)
        out_spans: list[MessageSpan] | tuple[MessageSpan, ...] = tuple(spans)
        if len(spans) < len(self._chat):
            seen = {sp.index for sp in spans}
            out_spans = sorted(spans + [MessageSpan(i, m["role"], 0, 0) for i, m in enumerate(self._chat) if i not in seen],
                               key=lambda sp: sp.index)
        if self._n_assistant and not any(loss_mask):
            raise RenderError("loss mask is all zero although the conversation has assistant turns")
        return RenderedContext(
            token_ids=token_ids,
            loss_mask=loss_mask,
            roles=token_roles,
            spans=tuple(out_spans),
            drifts=tuple(drifts),
            template_id=self.template.id,
            tokenizer_id=self.tokenizer.id,
            prefix_preserving=self._profile.prefix_preserving,
            hash=self._hash(token_ids, out_changed),
        )

    def _hash(self, token_ids: tuple[int, ...], changed: int) -> str:
        """`context_hash(token_ids)`, resuming from a checkpoint over the unchanged prefix."""
        n_cp, h_cp = self._hash_cp
        if n_cp > changed:
            n_cp, h_cp = 0, hashlib.sha256(b"ctxkit-context-v1")
        h = h_cp.copy()
        if changed > n_cp:
            h.update(_int32_bytes(token_ids[n_cp:changed]))
        self._hash_cp = (changed, h.copy())
        h.update(_int32_bytes(token_ids[changed:]))
        return h.hexdigest()


def _int32_bytes(ids: Sequence[int]) -> bytes:
    """The ids as little-endian int32 (`struct` packs twice as fast as an `array` of a tuple)."""
    return struct.pack(f"<{len(ids)}i", *ids)


@dataclass(slots=True)
class _Sub:
    """One sampled turn's ids put in place of its rendered ids (kept between renders)."""

    index: int  # message index
    a: int  # rendered token range replaced
    z: int
    start: int  # output token range of the sampled ids
    end: int
    shift: int  # cumulative length change after it
    drift: Drift | None


def render(
    messages: Sequence[Mapping[str, Any]],
    tokenizer,
    template: ChatTemplate | str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    special_tokens: str | Mapping[str, str] | None = None,
) -> RenderedContext:
    """Render OpenAI messages to token ids, loss mask, roles and spans (see module docstring).
    `special_tokens`: what to do with special-token text in content (`ctxkit.special_tokens`; default:
    escape it in tool content, allow it elsewhere)."""
    renderer = IncrementalRenderer(tokenizer, template, tools, special_tokens)
    renderer.extend(messages)
    return renderer.render(add_generation_prompt=add_generation_prompt)


def encode_assistant_turn(
    message: Mapping[str, Any],
    tokenizer,
    template: ChatTemplate | str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[int, ...]:
    """The ids a policy produces for this assistant message under the template: its content, tool-call
    formatting and end-of-turn token, exactly the loss-masked ids of the turn."""
    if not isinstance(message, Mapping) or message.get("role") != "assistant":
        raise MessageFormatError("encode_assistant_turn needs an assistant message")
    clean = {k: v for k, v in message.items() if k != "token_ids"}
    renderer = IncrementalRenderer(tokenizer, template, tools)
    renderer.append({"role": "user", "content": "Go on."})
    renderer.append(clean)
    ctx = renderer.render()
    span = ctx.spans[1]
    return ctx.token_ids[span.start : span.end]
