"""Token-exact rendering of a conversation, with a loss mask derived without generation markers.

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
of the conversation after its first render (`text.template.locality.window_delta`), checked against the
text already known; the window's old part is taken from an earlier build's core (`_core_marks`), so an
append costs one template render. Otherwise, and whenever the check fails, it renders the whole
conversation.

Token-in-token-out: an assistant dict may carry `"token_ids"` (the sampled ids). They replace the
rendered ids of that turn's produced region verbatim; where they differ, a `Drift` is recorded. If
the sampled ids lack the end-of-turn token (finish by length), the template's end-of-turn token stays
in the context as scaffold with mask 0.

Content follows `ctxkit.content` (text parts flattened, images refused). Special-token text inside a
message's content follows the `special_tokens` policy (`ctxkit.text.special_tokens`: allow | escape | error per
role; default escapes tool content) and every occurrence is reported in `special_tokens_in_content`.
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

from ctxkit.text.chat_messages import message_text, validate_message
from ctxkit.errors import MessageFormatError, SpecialTokenError, TemplateError
from ctxkit.text.rendering.cut import PrefixCut
from ctxkit.text.rendering.mask import TextRegion, TurnLabeller
from ctxkit.text.rendering.output import Drift, MessageSpan, OutputAssembly, RenderedContext, Sub, context_hash
from ctxkit.text.rendering.splice import SuffixSplice
from ctxkit.text.rendering.segments import SegmentCache, made_calls, message_key, safe_opener, strings_in
from ctxkit.text.special_tokens import encode_escaped, find_special_tokens, resolve_special_tokens
from ctxkit.text.template.locality import window_delta, window_start
from ctxkit.text.template.profile import template_profile
from ctxkit.text.template.chat_template import ChatTemplate, load_template, normalize_messages, plain_value
from ctxkit.text.tokenizer.loader import Tokenizer, load_tokenizer

TOKEN_ROLES = ("system", "user", "assistant", "tool", "scaffold", "generation_prompt")
"""Roles a token can have: the role of the message it renders, template scaffold, or a generation prompt."""
__all__ = ["TOKEN_ROLES", "Drift", "IncrementalRenderer", "MessageSpan", "RenderedContext", "context_hash",
           "encode_assistant_turn", "render"]


class IncrementalRenderer(TurnLabeller, PrefixCut, SuffixSplice, OutputAssembly):
    """Renders a growing conversation; each `render` tokenizes only text after the last stable
    special-token boundary and relabels only what changed. Ids equal a full `render` every time."""

    def __init__(self, tokenizer, template: ChatTemplate | str | None = None, tools: Sequence[Mapping] | None = None,
                 special_tokens: str | Mapping[str, str] | None = None, segments: SegmentCache | None = None):
        self.tokenizer: Tokenizer = load_tokenizer(tokenizer)
        self.segments = segments  # caches shared with other renderers (`ctxkit.text.rendering.segments`), or None
        self._policy = resolve_special_tokens(special_tokens)
        self.special_tokens: Mapping[str, str] = dict(self._policy)
        """The policy role -> allow | escape | error (see `ctxkit.text.special_tokens`)."""
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
        self._new_at = 0  # regions[:i] kept from an earlier render by the last `_locate`
        self._gp_at: list[int] = []  # generation-prompt positions in the last located text (`_count_prompts`)
        self._unresolved: list[int] = []  # messages whose text was not found in the last render
        self._n_assistant, self._any_sampled = 0, False
        self._hash_cp: list[tuple[int, Any]] = []  # (n, hash state of the output's first n ids), by n (`_hash`)
        self._mode = ""
        # windowed text rendering (templates found local by `template_locality`)
        locality = self._profile.locality
        self._local, self._reach, self._prompt = locality.local, locality.reach, locality.prompt
        self._core: tuple[int, str] | None = None  # (m, render of the first m messages without prompt)
        self._core_marks: list[tuple[int, int]] = []  # (m, its core's length) of earlier cores (`PrefixCut`)
        self._head: str | None = None  # render of the first `reach` messages (see window_delta)
        self._subs: list[Sub] = []  # sampled-id substitutions of the last output, in order
        self._sub_cols: tuple[list, list, list, list] = ([], [], [], [])  # kept in step with them (`_output`)
        self._out: tuple[list, list, list] = ([], [], [])  # output ids/mask/roles of rendered tokens [0, _out_at)
        self._out_at = 0  # 0 or the end of the last substitution that is not an identity (`_output`)
        self._span_list: list[MessageSpan] = []  # spans of the last output, in region order
        self._span_at: list[int] = [0]  # number of spans from regions[:i]
        self._span_dirty = 0  # regions[:i] unchanged since the last output for i <= this
        self.window_renders = 0
        """Renders whose text came from a suffix window (`text.template.locality.window_delta`)."""
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
                                   self._prompt, mark=self._window_mark(core[0]))
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

    def _window_mark(self, m: int, stretch: int = 4) -> tuple[int, int] | None:
        """`(j, p)` for `window_delta`: the latest earlier core (a checkpoint in `_core_marks`, whose text is
        `core[:p]` = the render of the first `j` messages) at or before the default window start for a core
        of `m` messages, at most `stretch` messages before it; None when there is none."""
        marks = self._core_marks
        if len(marks) < 2:
            return None
        j = window_start(self._chat, m, self._reach)
        k = bisect.bisect_right(marks, (j, float("inf"))) - 1
        if k < 0 or marks[k][0] < j - stretch or marks[k][0] <= max(1, self._reach):
            return None
        return marks[k]

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
                self._kept_tail = None  # used by this render's tokenization or by none
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
        self._new_at, self._gp_at = 0, []
        self._hash_cp = []
        self._subs, self._out, self._out_at = [], ([], [], []), 0
        self._span_list, self._span_at, self._span_dirty = [], [0], 0
        # `SuffixSplice` hints: each holds for the render that set it only
        self._kept_tail = self._tail_regions = self._tail_map = self._tail_labels = None


def render(
    messages: Sequence[Mapping[str, Any]],
    tokenizer,
    template: ChatTemplate | str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    special_tokens: str | Mapping[str, str] | None = None,
) -> RenderedContext:
    """Render OpenAI messages to token ids, loss mask, roles and spans (see module docstring).
    `special_tokens`: what to do with special-token text in content (`ctxkit.text.special_tokens`; default:
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
