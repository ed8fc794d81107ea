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
  the render with it), cut after its last turn closer (`TemplateProfile.turn_closers`: gpt-oss closes
  with `<|return|>`, `<|end|>` or `<|call|>`; Gemma 4 ends a tool-call turn rendered last with
  `<|tool_response>`), and found in the full render in order. Where the render writes the turn otherwise
  (history drops its reasoning or the prompt's prefilled `<think>`), the turn is the tail of that text after
  one of its special tokens, written before the next turn opens (Gemma 4 v5 continues the model turn after
  tool responses), or what the render writes between the next generation prompt (or its longest prefix
  there, never a bare turn opener that may open another role's turn) and the first closer. If neither
  locates it, or a tool result lies inside it, that is a `RenderError`, never an all-zero or wrong mask.

Text: for a template `template_locality` finds local (Qwen2.5, SmolLM2, chatml-tools-v1; not Qwen3,
which rewrites earlier turns, nor Mistral), `IncrementalRenderer` renders only a short suffix window
of the conversation after its first render (`text.template.locality.window_delta`), checked against the
text already known; the window's old part is taken from an earlier build's core (`RenderState.core_marks`), so an
append costs one template render. A template that is not local but whose main loop's iterations read only their
message, neighbours and names set before the loop (Qwen3: `text.template.iteration_reuse`) renders its prelude,
first and newest iterations and keeps the others' text from the last render (`window.reused_text`). Otherwise,
and whenever a check fails, it renders the whole conversation.

Token-in-token-out: an assistant dict may carry `"token_ids"` (the sampled ids). They replace the
rendered ids of that turn's produced region verbatim; where they differ, a `Drift` is recorded with its
reason (`drift_reasons.classify_drift`). With `history="template"` a turn whose reasoning the template drops
from history keeps the template's render instead (`output.HISTORY_MODES`). If
the sampled ids lack the end-of-turn token (finish by length), the template's end-of-turn token stays
in the context as scaffold with mask 0.

Content follows `ctxkit.content` (text parts flattened, images refused). Special-token text inside a
message's content follows the `special_tokens` policy (`ctxkit.text.special_tokens`: allow | escape | error per
role; default escapes tool content) and every occurrence is reported in `special_tokens_in_content`.

Structure: the renderer holds its configuration (tokenizer, template, profile, special-token policy, segment
caches) and one `RenderState` (`state.py`); each step of a render is a function over that state: the text
(`window.rendered_text`, `splice.spliced_text`), its ids (`tokens.retokenize`), regions and labels
(`mask.locate`, `mask.relabel`) and the output (`output.assemble`); `cut.cut_messages` and the `splice`
functions change the messages held.
"""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from ctxkit.text.chat_messages import message_text, validate_message
from ctxkit.errors import ConfigError, MessageFormatError, SpecialTokenError, TemplateError
from ctxkit.text.rendering import splice as splicing
from ctxkit.text.rendering.cut import cut_messages
from ctxkit.text.rendering.mask import locate, relabel, special_literals, special_report
from ctxkit.text.rendering.drift_reasons import classify_drift
from ctxkit.text.rendering.output import HISTORY_MODES, Drift, MessageSpan, RenderedContext, assemble, context_hash
from ctxkit.text.rendering.segments import SegmentCache, made_calls, message_key, safe_opener, strings_in
from ctxkit.text.rendering.splice import SpliceHint
from ctxkit.text.rendering.state import RenderState, reset_rendered
from ctxkit.text.rendering.tokens import retokenize
from ctxkit.text.rendering.window import rendered_text, reused_text
from ctxkit.text.special_tokens import encode_escaped, find_special_tokens, resolve_special_tokens
from ctxkit.text.template.iteration_reuse import render_pieces
from ctxkit.text.template.profile import template_profile
from ctxkit.text.template.chat_template import ChatTemplate, load_template, normalize_messages, plain_value
from ctxkit.text.tokenizer.loader import Tokenizer, load_tokenizer
from ctxkit.text.vendor.oracle import is_vendor_spec
from ctxkit.text.vendor.vendor_render import render_vendor

TEXT_MEMO = 4
"""Plain template renders kept by the messages rendered (the same message objects, the same prompt flag)."""

TOKEN_ROLES = ("system", "user", "assistant", "tool", "scaffold", "generation_prompt")
"""Roles a token can have: the role of the message it renders, template scaffold, or a generation prompt."""
__all__ = ["TOKEN_ROLES", "Drift", "IncrementalRenderer", "MessageSpan", "RenderedContext", "context_hash",
           "encode_assistant_turn", "render"]


class IncrementalRenderer:
    """Renders a growing conversation; each `render` tokenizes only text after the last stable
    special-token boundary and relabels only what changed. Ids equal a full `render` every time.

    Holds its configuration and one `RenderState` (`state`); the steps of a render are functions over it."""

    def __init__(self, tokenizer, template: ChatTemplate | str | None = None, tools: Sequence[Mapping] | None = None,
                 special_tokens: str | Mapping[str, str] | None = None, segments: SegmentCache | None = None,
                 history: str = "sampled"):
        if history not in HISTORY_MODES:
            raise ConfigError(f"IncrementalRenderer: history is {history!r}; expected one of {list(HISTORY_MODES)}")
        self.history = history
        """How sampled turns the template re-renders otherwise enter the context (`output.HISTORY_MODES`)."""
        self.tokenizer: Tokenizer = load_tokenizer(tokenizer)
        """The tokenizer."""
        self.segments = segments
        """Caches shared with other renderers (`ctxkit.text.rendering.segments`), or None."""
        self._policy = resolve_special_tokens(special_tokens)
        self.special_tokens: Mapping[str, str] = dict(self._policy)
        """The policy role -> allow | escape | error (see `ctxkit.text.special_tokens`)."""
        self.template: ChatTemplate = load_template(template, self.tokenizer)
        """The chat template."""
        self.tools = None if tools is None else list(_checked_list(tools, "tools", "tool schema"))
        """The tool schemas given, or None."""
        self._tools_plain = None if tools is None else plain_value(list(tools), "tools") if segments is None else segments.plain_tools(tools)
        self._profile = template_profile(self.tokenizer, self.template)
        self._opener = safe_opener(self.tokenizer, self._profile.turn_opener) if segments is not None else None
        self._special_len = {i: len(t) for t, i in self.tokenizer.special_tokens.items()}
        plan = self._profile.reuse
        self._reuse = (self._render_pieces, plan.reach) if plan.ok and not self._profile.locality.local else None
        self.state = RenderState(structural_ok=bool(self._profile.generation_prompt and self._profile.end_of_turn))
        """The messages held and what the last render left (`ctxkit.text.rendering.state`)."""

    def __len__(self) -> int:
        return len(self.state.messages)

    @property
    def messages(self) -> tuple[dict, ...]:
        """The messages appended so far (as given)."""
        return tuple(self.state.messages)

    @property
    def window_renders(self) -> int:
        """Renders whose text came from a suffix window (`text.template.locality.window_delta`)."""
        return self.state.window_renders

    @property
    def full_renders(self) -> int:
        """Renders of the whole conversation through the template."""
        return self.state.full_renders

    @property
    def reuse_renders(self) -> int:
        """Renders that kept the template's earlier loop iterations (`text.template.iteration_reuse`)."""
        return self.state.reuse_renders

    @property
    def splice_renders(self) -> int:
        """Renders whose text was spliced from the previous text and windows around a changed block."""
        return self.state.splice_renders

    @property
    def tail_reuses(self) -> int:
        """Spliced renders that kept the tail's located regions and labels, shifted (`splice.attach_tail`)."""
        return self.state.tail_reuses

    @property
    def _chat(self) -> list[dict]:
        """The normalized chat dicts held (read-only view for tests: `state.chat`)."""
        return self.state.chat

    def append(self, message: Mapping[str, Any], key: Any = None, *, form_checked: bool = False) -> None:
        """Add one OpenAI message (validated; an assistant may carry sampled `token_ids`); `key`: its `message_key`.

        `form_checked`: its form was checked where it entered (a view's message, made from checked events),
        so only the checks that depend on this tokenizer and the messages before it run
        (`ctxkit.text.chat_messages.validate_message`)."""
        st = self.state
        index = len(st.messages)
        key = (message_key(message) if key is None else key) if (cache := self.segments) is not None else None
        hit = cache.prepared(key, message, st.call_ids) if key is not None else None
        markers = self._profile.markers
        if hit is not None:
            clean, sampled, chat, found, made, marked = hit
            st.call_ids.update(made)
        else:
            clean, sampled = validate_message(message, index, st.call_ids, self.tokenizer.vocab_size,
                                              form_checked=form_checked)
            chat = normalize_messages([clean])[0]
            found = find_special_tokens(message_text(chat.get("content")), self.tokenizer)
            marked = None
            if key is not None and (made := made_calls(message)) is not None:
                marked = any(m in s for s in strings_in(chat) for m in markers)
                cache.store(key, (clean, sampled, chat, found, made, marked))
        if found:
            role, policy = chat["role"], self._policy[chat["role"]]
            if policy == "error":
                c, tok = found[0]
                raise SpecialTokenError(f"message {index} ({role}): special token {tok!r} at char {c} of its content "
                                        f"(special_tokens policy 'error' for {role})", message_index=index, role=role,
                                        token=tok, char=c)
            st.specials[index] = found
            st.escape = st.escape or policy == "escape"
        if st.structural_ok and markers:
            if marked is None:
                marked = any(m in s for s in strings_in(chat) for m in markers)
            if marked:
                st.structural_ok, st.marked_at = False, index
        st.messages.append(dict(message))
        st.n_assistant += chat.get("role") == "assistant"
        st.chat.append(chat)
        st.sampled.append(sampled)
        st.any_sampled = st.any_sampled or sampled is not None

    def extend(self, messages: Iterable[Mapping[str, Any]]) -> None:
        """Append several messages."""
        for m in _checked_list(messages, "messages", "message"):
            self.append(m)

    def cut(self, n: int) -> None:
        """Forget every message from index `n` on (0 <= n); the next render of the messages kept plus
        those appended after equals a fresh renderer's render of them (`ctxkit.text.rendering.cut`)."""
        if n < 0:
            raise ConfigError(f"IncrementalRenderer.cut: parameter n is {n}; expected a message count >= 0")
        if n < len(self.state.messages):
            cut_messages(self.state, self._policy, self._profile, self._render_text, n)

    def splice_hint(self, a: int, s: int) -> SpliceHint | None:
        """What the next render needs to splice its text, taken before `cut`, for a view sharing the first `a`
        and the last `s` messages with the messages held; None when the renderer's last render does not
        describe its messages (or the template is not local)."""
        return splicing.splice_hint(self.state, self._profile.turn_opener, self._profile.locality, a, s)

    def expect_splice(self, hint: SpliceHint | None, a: int, s: int) -> None:
        """The messages now held are `hint`'s first `a` messages, a changed block, and its last `s` messages:
        the next render tries `splice.splice_text` first."""
        splicing.expect_splice(self.state, hint, a, s)

    def splice(self, a: int, s: int, block: Sequence[tuple[Any, Any]],
               tail: Callable[[], Sequence[tuple[Any, Any]]], *, form_checked: bool = False) -> None:
        """Make the messages held `self.messages[:a] + block + self.messages[len(self) - s:]` (`block`: pairs
        `(message, message_key or None)`; `tail()`: the same pairs for the last `s` messages, asked for only
        when they must be appended again). The next render tries `splice_text` first (`expect_splice`).

        The kept tail's prepared messages are reused with their indexes shifted, not appended again, when
        every check `append` makes of them has the outcome it had (`splice.attach_prepared`); else they are
        appended (`form_checked` as for `append`). Its located regions and labels are kept aside for the next render (`state.tail_regions`),
        which shifts them instead of locating and labelling the tail again when its text and ids were kept."""
        st = self.state
        n = len(st.chat)
        if not 0 <= a <= n - s or s <= 0:
            raise ConfigError(f"IncrementalRenderer.splice: parameters a={a}, s={s} do not fit {n} messages")
        hint = self.splice_hint(a, s)
        kept = splicing.keep_tail(st, hint, a, s)
        self.cut(a)
        for m, key in block:
            self.append(m, key, form_checked=form_checked)
        if kept is None or not splicing.attach_prepared(st, self._policy, *kept):
            st.tail_regions = None
            for m, key in tail():
                self.append(m, key, form_checked=form_checked)
        elif st.tail_regions is not None:
            st.tail_regions = (st.tail_regions[0], st.tail_regions[1], len(st.chat) - n)
        splicing.expect_splice(st, hint, a, s)

    def _classify(self, sampled: Sequence[int], rendered: Sequence[int]) -> str:
        return classify_drift(sampled, rendered, self.tokenizer)

    def _render_text(self, chat: list[dict], agp: bool) -> str:
        """The template's text of `chat`; for a prefix of the messages (the renders that locate turns), through
        the iteration reuse when the template allows it."""
        st = self.state
        if self._reuse is not None and len(chat) <= len(st.chat) and all(map(operator.is_, chat, st.chat)):
            try:
                text = reused_text(st, *self._reuse, agp, chat, count=False)
            except TemplateError:  # the plain render below decides (the markers count towards the output limit)
                st.reuse_bases.pop(agp, None)
                text = None
            if text is not None:
                return text
        # A turn is located from the render of the messages before it with the prompt: the last turn's render
        memo = st.text_memo
        for was_agp, held, text in memo:
            if was_agp == agp and len(held) == len(chat) and all(map(operator.is_, held, chat)):
                return text
        text = self.template.render_chat(chat, tools=self._tools_plain, add_generation_prompt=agp)
        memo.append((agp, list(chat), text))
        del memo[:-TEXT_MEMO]
        return text

    def _render_pieces(self, chat: list[dict], agp: bool, lead: int, start: int, restore: tuple | None = None,
                       resume: dict | None = None):
        return render_pieces(self.template, self._profile.reuse, chat, self._tools_plain, agp, lead, start, restore,
                             resume)

    def render(self, add_generation_prompt: bool = False) -> RenderedContext:
        """The context for the messages so far (ids equal `apply_chat_template(..., tokenize=True)`)."""
        st, profile, render_text = self.state, self._profile, self._render_text
        text = rendered_text(st, render_text, profile.locality, add_generation_prompt, self._reuse)
        st.last_agp = add_generation_prompt
        template_id = self.template.id
        try:
            if st.escape:  # locate first, then tokenize with the escaped occurrences as plain text
                core, head, bases = st.core, st.head, st.reuse_bases
                reset_rendered(st)
                st.core, st.head, st.reuse_bases = core, head, bases
                locate(st, profile, render_text, template_id, text, add_generation_prompt, 0)
                st.ids, st.starts = encode_escaped(self.tokenizer, text, special_literals(st, self._policy, template_id, text))
                st.text = ""  # no incremental reuse of an escaped tokenization
                changed = relabel(st, 0)
            else:
                stable = retokenize(st, self.tokenizer, self.segments, self._opener, self._special_len, text)
                st.kept_tail = None  # used by this render's tokenization or by none
                relabel_from = locate(st, profile, render_text, template_id, text, add_generation_prompt, stable)
                changed = relabel(st, min(stable, relabel_from))
            ctx = assemble(st, profile, template_id, self.tokenizer.id, changed, self._classify, self.history)
            if st.specials:
                ctx = replace(ctx, special_tokens_in_content=special_report(st, self._policy, text))
            return ctx
        except BaseException:
            reset_rendered(st)  # the next render starts from scratch rather than from half-updated state
            raise


def _checked_list(items: Any, param: str, what: str) -> Any:
    """`items` when it is a list-like of mappings (a generator passes through: each item is checked where it is
    used); a `MessageFormatError` naming `param` for a string, a single mapping, None or another non-sequence,
    which would otherwise be iterated character by character or key by key."""
    if isinstance(items, (str, bytes, Mapping)) or items is None or not hasattr(items, "__iter__"):
        hint = f"; wrap one {what} in a list" if isinstance(items, Mapping) else ""
        raise MessageFormatError(f"{param}: expected a list of {what}s (dicts), got {type(items).__name__}{hint}")
    if isinstance(items, Sequence):
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise MessageFormatError(f"{what.split()[0]} {i}: expected a dict, got {type(item).__name__}")
    return items


def render(
    messages: Sequence[Mapping[str, Any]],
    tokenizer,
    template: ChatTemplate | str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    special_tokens: str | Mapping[str, str] | None = None,
    history: str = "sampled",
) -> RenderedContext:
    """Render OpenAI messages to token ids, loss mask, roles and spans (see module docstring).
    `special_tokens`: what to do with special-token text in content (`ctxkit.text.special_tokens`; default:
    escape it in tool content, allow it elsewhere); `history`: one of `output.HISTORY_MODES`.

    `template="vendor:<name>"` (`ctxkit.text.vendor`: `mistral-v3`, `mistral-v7`, `mistral-tekken`, `harmony`,
    `harmony-keep-analysis`) renders through the vendor's own renderer instead of a chat template: the ids
    are the vendor's, `template_id` names the vendor and its package version, and `tokenizer` (None: the
    vendor's own) must be the vendor's vocabulary; the vendor decides how special-token text in content is
    encoded, so `special_tokens` must be None there."""
    if is_vendor_spec(template):
        if special_tokens is not None:
            raise ConfigError(f"render: special_tokens={special_tokens!r} does not apply to template {template!r} "
                              "(the vendor encodes content itself); leave it None")
        return render_vendor(messages, template, tools, add_generation_prompt,
                             tokenizer=None if tokenizer is None else load_tokenizer(tokenizer))
    renderer = IncrementalRenderer(tokenizer, template, tools, special_tokens, history=history)
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
