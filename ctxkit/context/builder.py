"""The context builder: log -> view -> compaction -> exact token ids, with the invariants checked.

`ContextBuilder.build(log)` records new constraint detections as `Pin` events, asks the compressor for
a compaction (recorded as a `Compaction` event), renders the resulting view with the generation prompt
and checks, before returning: every active pin verbatim in the decoded context (`PinViolationError`), no
tool call or result that does not pair up (`ToolPairingError`, an `InvariantError`: orphaned result,
duplicated result, call left unanswered before a later turn; a trailing pending call, e.g. a final
`submit` with no result yet, is legal and kept), the real token count of the final render within the
budget (`BudgetError`). `rebuild(events, ...)` is the pure replay path: it appends nothing and lands on
the same ids and hash as the original build.

Per-turn cost stays low: the view is kept incrementally (only new events are fed), token counts are
cached per text by the tokenizer, renders are cached by view hash (a compressor's last measurement is
the builder's render), a view that extends the previous one is rendered incrementally, and any other
view (after a compaction) re-uses the prepared messages and segment ids of earlier renders
(`ctxkit.text.rendering.segments`), so only new or changed text is tokenized.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping, Sequence

from ctxkit.context.compress import make_compressor
from ctxkit.context.compress.base import CompressionRequest, Compressor, CompressorSpec
from ctxkit.errors import (BudgetError, ConfigError, InvariantError, LogFormatError, PinViolationError, ReplayError,
                           ToolPairingError)
from ctxkit.events import Compaction, EpisodeStart, Event, Pin, Unpin
from ctxkit.log.event_log import MemoryLog as MemoryLog  # its home is ctxkit.log.event_log; kept importable from here
from ctxkit.log.protocols import EpisodeLog
from ctxkit.context.pairing import PairingProblem, PairingScan
from ctxkit.context.pins import detect_constraints, resolve_pin_rules
from ctxkit.context.render_cache import RenderCache
from ctxkit.text.special_tokens import RECORDED_DEFAULT, resolve_special_tokens
from ctxkit.context.view import Provenance, View, ViewMessage, ViewState, apply_edits, build_view, make_view
from ctxkit.text.rendering.output import HISTORY_MODES
from ctxkit.text.template.chat_template import load_template, with_kwargs
from ctxkit.text.tokenizer.loader import load_tokenizer

BUILDER_VERSION = "ctxkit-builder-v1"

RENDERS_KEPT = 2
"""Rendered contexts a builder keeps by view hash: a build measures its view (or a compressor's candidate)
and renders the chosen one again, so two suffice (the same renders as with 8 on every arm of the
synthetic episode and ../shared/trajectories). Each kept render holds per-token tuples that every young
garbage collection walks until it is dropped: fewer kept, less collector time (gen-0 collections over the
200-turn window episode: 29 ms with 8 kept, 13 with 3, 10 with 2 at budget 16k; 41 with 3, 28 with 2 at 200k)."""


@dataclass(frozen=True)
class BuiltContext:
    """One built context: what to send to the inference engine, and how it was made."""

    view: View
    """The view that was rendered."""
    rendered: Any
    """The `ctxkit.text.rendering.renderer.RenderedContext`: ids, mask, spans and hash live there, once."""
    budget: int | None
    """The budget the context was built for (None when unknown, e.g. a rebuild of a log without one)."""
    pins_checked: tuple[str, ...]
    """Ids of the active pins verified verbatim in the decoded context."""
    compactions: tuple[str, ...] = ()
    """Ids of the events this build appended (detected pins and the compaction)."""
    truncated: bool = False
    """The context is over budget and the compressor was told to mark that instead of failing
    (`keep-all` with `on_overflow="truncate"`): end the episode `truncated`, cause `context_budget`."""

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The exact prompt ids (generation prompt included)."""
        return self.rendered.token_ids

    @property
    def loss_mask(self) -> tuple[int, ...]:
        """1 on tokens the policy sampled (earlier verbatim steps), 0 elsewhere."""
        return self.rendered.loss_mask

    @property
    def hash(self) -> str:
        """`rendered.hash`: what a `Step.context_hash` records."""
        return self.rendered.hash

    @property
    def n_tokens(self) -> int:
        """`len(token_ids)`, in real tokens of the final render."""
        return len(self.rendered.token_ids)

    @property
    def ref(self) -> str:
        """What a `Step` records as its `context_hash` (= `hash`)."""
        return self.hash

    @cached_property
    def provenance(self) -> tuple[tuple[int, Provenance | None], ...]:
        """Per token: (index of the view message, its provenance), or (-1, None) for template scaffold
        outside any message (e.g. the generation prompt)."""
        out: list[tuple[int, Provenance | None]] = [(-1, None)] * self.n_tokens
        msgs = self.view.messages
        for span in self.rendered.spans:
            if 0 <= span.index < len(msgs):
                item = (span.index, msgs[span.index].provenance)
                out[span.start:span.end] = [item] * (span.end - span.start)
        return tuple(out)


class ContextBuilder:
    """Builds contexts for one policy: tokenizer, template, compressor and budget fixed.

    `tokenizer` and `template` are spec strings (`load_tokenizer` / `load_template` specs) or loaded
    objects; `compressor` a registry name, a `CompressorSpec`, a `{"name", "params"}` dict or an instance
    (with `params` overriding). `budget` is in real tokens of the final render; `reserve_tokens` of it are
    kept free for the response. `detect_pins`: True runs the latest constraint detector
    (`constraint-rules-v2`), a name runs that registered one (`ctxkit.context.pins.DETECTORS`), False none; the
    rule set is recorded as `pin_rules`, so a resumed v1 episode keeps detecting with v1.
    `special_tokens`: policy for special-token text in message content (`ctxkit.text.special_tokens`: one of
    allow | escape | error, or a mapping role -> policy; default: escape tool content, allow the rest);
    recorded by `describe()` so a replay renders the same way. `history`: how a sampled turn the template
    re-renders otherwise enters the context (`ctxkit.text.rendering.output.HISTORY_MODES`: `sampled`, the
    default, keeps the sampled ids; `template` takes the template's render of a turn whose reasoning it drops),
    recorded by `describe()` when not the default. A template with kwargs (`chat_template.with_kwargs`, e.g.
    `preserve_thinking`) records them beside its id, and a replay renders with them.
    """

    def __init__(
        self,
        tokenizer: Any,
        template: Any = None,
        compressor: str | CompressorSpec | Mapping[str, Any] | Compressor = "keep-all",
        budget: int = 32_768,
        params: Mapping[str, Any] | None = None,
        detect_pins: bool | str = True,
        reserve_tokens: int = 0,
        special_tokens: str | Mapping[str, str] | None = None,
        history: str = "sampled",
    ) -> None:
        if history not in HISTORY_MODES:
            raise ConfigError(f"ContextBuilder: history is {history!r}; expected one of {list(HISTORY_MODES)}")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise ConfigError(f"ContextBuilder: budget is {budget!r}; expected a positive integer (tokens)")
        if isinstance(reserve_tokens, bool) or not isinstance(reserve_tokens, int) or not 0 <= reserve_tokens < budget:
            raise ConfigError(f"ContextBuilder: reserve_tokens is {reserve_tokens!r}; expected 0 <= reserve_tokens < budget ({budget})")
        if params is not None and not isinstance(params, Mapping):
            raise ConfigError(f"ContextBuilder: params is a {type(params).__name__} ({params!r}); expected a mapping of "
                              "compressor parameter names to values, e.g. {'keep_last': 2}")
        self.tokenizer = load_tokenizer(tokenizer)
        self.template_spec = template if (template is None or isinstance(template, str)) else getattr(template, "name", None)
        self.template = load_template(template, self.tokenizer)
        self.template_kwargs = dict(self.template.options.get("kwargs") or {})
        """Template kwargs the template renders with (`chat_template.with_kwargs`), recorded by `describe()`."""
        if self.template_kwargs:  # the spec of the template the kwargs apply to
            self.template_spec = None if self.template.origin == "tokenizer" else self.template.name.split("+")[0]
        self.history = history
        """How sampled turns the template re-renders otherwise enter the context (`HISTORY_MODES`)."""
        self.compressor = make_compressor(compressor, **dict(params or {}))
        self.budget = budget
        self.reserve_tokens = reserve_tokens
        self.pin_rules = resolve_pin_rules(detect_pins)
        self.detect_pins = self.pin_rules is not None
        self.special_tokens = resolve_special_tokens(special_tokens, "ContextBuilder: special_tokens")
        self._renderer = RenderCache(self.tokenizer, self.template, size=RENDERS_KEPT, special_tokens=self.special_tokens,
                                     history=history)
        self._state: ViewState | None = None
        self._fed_ids: list[str] = []
        self._scanned = 0
        self._seen_pins: set[str] = set()
        self._prefix_cache: dict[tuple, int] = {}
        self._pin_cache = PinCheckCache()  # for check_pins
        # Renders the fixed prefix (`_check_reserved`) apart from the views, incrementally: a new pin changes
        # only the pinned block. It shares the segment ids of the main cache (same tokenizer and template).
        self._prefix_renderer = RenderCache(self.tokenizer, self.template, size=2, special_tokens=self.special_tokens,
                                            history=history)
        self._prefix_renderer.segments = self._renderer.segments

    # ------------------------------------------------------------------------------------- describe

    @property
    def effective_budget(self) -> int:
        """Tokens the context itself may take: `budget - reserve_tokens`."""
        return self.budget - self.reserve_tokens

    def describe(self) -> dict[str, Any]:
        """How contexts are built, for `EpisodeStart.context` (enough for `from_description`)."""
        return {
            "builder": BUILDER_VERSION,
            "tokenizer": {"spec": str(self.tokenizer.spec), "id": self.tokenizer.id},
            "template": {"spec": None if self.template_spec is None else str(self.template_spec), "id": self.template.id,
                         **({"kwargs": dict(self.template_kwargs)} if self.template_kwargs else {})},
            "compressor": self.compressor.spec.to_dict() if hasattr(self.compressor.spec, "to_dict")
            else {"name": self.compressor.spec.name, "params": dict(self.compressor.spec.params)},
            "budget": self.budget,
            "reserve_tokens": self.reserve_tokens,
            "pin_rules": self.pin_rules,
            "special_tokens": dict(self.special_tokens),
            **({"history": self.history} if self.history != "sampled" else {}),
        }

    @classmethod
    def from_description(cls, desc: Mapping[str, Any], *, tokenizer: Any = None) -> "ContextBuilder":
        """A builder from `describe()` output; the tokenizer and template ids must match the recorded ones."""
        try:
            tok = load_tokenizer(tokenizer if tokenizer is not None else desc["tokenizer"]["spec"])
            builder = cls(
                tokenizer=tok,
                template=recorded_template(desc["template"], tok) if desc["template"].get("kwargs")
                else desc["template"]["spec"],
                compressor=desc["compressor"],
                budget=desc["budget"],
                detect_pins=desc.get("pin_rules") or False,
                reserve_tokens=desc.get("reserve_tokens", 0),
                special_tokens=desc.get("special_tokens", RECORDED_DEFAULT),  # older logs: as recorded, allow
                history=desc.get("history", "sampled"),
            )
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"builder description is missing {exc}: {dict(desc)!r}") from None
        for key, obj in (("tokenizer", builder.tokenizer), ("template", builder.template)):
            if desc[key].get("id") and desc[key]["id"] != obj.id:
                raise ReplayError(f"recorded {key} id {desc[key]['id']} differs from the loaded one {obj.id}")
        return builder

    # ------------------------------------------------------------------------------------- build

    def build(self, log: EpisodeLog) -> BuiltContext:
        """Build the context for the next assistant turn of `log` (an `EventLog` or `MemoryLog`), appending detected
        pins and the compaction (if any) to it. The compaction is recorded only once the context it
        gives has passed every check."""
        if not isinstance(log, EpisodeLog):
            raise ConfigError(f"build() needs an EventLog or MemoryLog to record its decisions, got {type(log).__name__}; "
                              "use rebuild(events, ...) to render a sequence of events without recording")
        events = log.events()
        self._sync(events)
        appended: list[str] = []
        if self.detect_pins:
            new = []
            for d in detect_constraints(events[self._scanned:], rules=self.pin_rules):
                if d.pin_id not in self._seen_pins:
                    self._seen_pins.add(d.pin_id)
                    new.append(d.to_pin())
            self._scanned = len(events)
            if new:
                recorded = log.extend(new)
                appended += [e.id for e in recorded]
                events = log.events()
                self._sync(events)
        view = self._state.view()
        budget = self.effective_budget
        self._check_reserved(view, budget)
        request = CompressionRequest(
            view=view, events=events, tokenizer=self.tokenizer, template=self.template, budget=budget,
            measure=self.measure, pinned_texts=tuple(p.text for p in view.active_pins),
            turn_starts=self.turn_starts, rendered=self.rendered,
        )
        try:
            compaction = self.compressor.compact(request)
        except LogFormatError as exc:  # e.g. an edit of an unknown kind, refused when the Compaction was made
            raise InvariantError(f"compressor {self.compressor.spec.name} proposed invalid edits: {exc}") from None
        truncated = False
        pending_before = None  # without a compaction the view keeps its pending calls: nothing to compare
        if compaction is not None:  # pending_calls(view.messages), from the view state's incremental scan
            pending_before = tuple(p.call_id or "" for p in self._state.pairing_problems(allow_pending=False)
                                   if p.problem == "pending_call")
            name = self.compressor.spec.name
            if not isinstance(compaction, Compaction):
                raise InvariantError(f"compressor {name} returned {type(compaction).__name__}, not a Compaction")
            try:
                view = apply_edits(view, compaction.edits, where=f"compaction proposed by {name}")
            except LogFormatError as exc:
                raise InvariantError(f"compressor {name} proposed invalid edits: {exc}") from None
            truncated = bool(compaction.details.get("overflow"))
        # Check everything before recording the compaction, so a failed build records no decision.
        check_pairing(view, pending_before=pending_before,
                      problems=self._state.pairing_problems() if compaction is None else None)
        rendered = self._renderer.render(view)
        ctx = _finish(view, rendered, self.tokenizer, budget, (), truncated, self._pin_cache)
        if ctx.n_tokens > budget and not truncated:
            raise BudgetError(
                f"context is {ctx.n_tokens} tokens of the final render, over the budget of {budget} "
                f"(budget {self.budget} - reserve {self.reserve_tokens}) after {self.compressor.spec.name}"
            )
        if compaction is not None:
            recorded = log.append(compaction)
            appended.append(recorded.id)
            self._sync(log.events())
            logged = self._state.view()
            if logged.hash != view.hash:  # the recorded copy must give the view that was checked
                raise InvariantError(f"compaction {recorded.id}: the view rebuilt from the log differs from the checked one")
            ctx = dataclasses.replace(ctx, view=logged)
        return dataclasses.replace(ctx, compactions=tuple(appended)) if appended else ctx

    def measure(self, view: View) -> int:
        """Exact token count of the final render of `view` (generation prompt included); cached by view hash."""
        return len(self._renderer.render(view).token_ids)

    def rendered(self, view: View) -> Any:
        """The final render of `view` (a `RenderedContext`, generation prompt included); cached by view hash."""
        return self._renderer.render(view)

    def turn_starts(self, view: View) -> list[int | None] | None:
        """Per message of `view`, the token where its turn opens in the final render (see
        `CompressionRequest.turn_starts`); None when the template does not render turns one after another."""
        return self._renderer.turn_starts(view)

    def _sync(self, events: Sequence[Event]) -> None:
        """Feed events not yet in the incremental view; start over if the log is not the one fed so far."""
        n = len(self._fed_ids)
        if self._state is None or len(events) < n or (n and events[n - 1].id != self._fed_ids[-1]):
            self._state = ViewState()
            self._fed_ids = []
            self._scanned = 0
            self._seen_pins = set()
            n = 0
        if n == 0:
            self._seen_pins = {e.pin_id for e in events if isinstance(e, (Pin, Unpin))}
        else:
            self._seen_pins.update(e.pin_id for e in events[n:] if isinstance(e, (Pin, Unpin)))
        self._state.feed(events[n:])
        self._fed_ids.extend(e.id for e in events[n:])

    def _check_reserved(self, view: View, budget: int) -> None:
        """Pins are reserved first: the leading system messages plus every active pin in the pinned block
        plus the generation prompt must fit, or `BudgetError` names the sizes."""
        if not view.active_pins:
            return
        lead: list[ViewMessage] = []
        for m in view.messages:
            if m.role == "system" and m.provenance.how != "pinned":
                lead.append(m)
            elif m.provenance.how != "pinned":
                break
        key = (tuple(m.content for m in lead), tuple(p.pin_id for p in view.active_pins), budget)
        size = self._prefix_cache.get(key)
        if size is None:
            # pins not verbatim in the leading system messages go to the pinned block
            prefix_view = make_view(lead, view.tools, view.active_pins, view.upto_seq)
            size = len(self._prefix_renderer.render(prefix_view).token_ids)
            self._prefix_cache[key] = size
        if size > budget:
            pin_tokens = sum(self.tokenizer.count(p.text) for p in view.active_pins)
            raise BudgetError(
                f"the pinned constraints ({len(view.active_pins)} pins, {pin_tokens} tokens of text) plus the fixed "
                f"prefix (system messages, tools, generation prompt) take {size} tokens, over the budget of {budget}"
            )


def rebuild(
    events: Any,
    *,
    tokenizer: Any,
    template: Any = None,
    upto_seq: int | None = None,
    budget: int | None = None,
    special_tokens: str | Mapping[str, str] | None = None,
) -> BuiltContext:
    """The context of the view after `events[..upto_seq]`, rendered exactly as `build` did. Pure: appends
    nothing and never runs a compressor. `budget` defaults to the one recorded in `EpisodeStart.context`;
    it is not enforced (a recorded overflow is reproduced), only reported in `truncated`. `special_tokens`
    defaults to the policy recorded in `EpisodeStart.context`, `"allow"` when none is (older logs)."""
    if hasattr(events, "events") and callable(events.events):
        events = events.events()
    tok = load_tokenizer(tokenizer)
    tmpl = load_template(template, tok)
    view = build_view(events, upto_seq)
    start = next((e for e in events if isinstance(e, EpisodeStart)), None)
    rec_special, rec_budget = recorded_render_policy(start)
    special_tokens = rec_special if special_tokens is None else special_tokens
    budget = rec_budget if budget is None else budget
    return render_view(view, RenderCache(tok, tmpl, special_tokens=special_tokens, history=recorded_history(start)),
                       tok, budget)


def recorded_history(start: EpisodeStart | None) -> str:
    """The `history` mode recorded in `start.context` (`sampled` when none is: the default, and older logs)."""
    ctx = start.context if start is not None else {}
    return str(ctx.get("history") or "sampled")


def recorded_template(rec: Mapping[str, Any], tokenizer: Any) -> Any:
    """The template a `describe()` `template` record names: its spec loaded, with its recorded kwargs."""
    tpl = load_template(rec.get("spec"), tokenizer)
    return with_kwargs(tpl, rec["kwargs"]) if rec.get("kwargs") else tpl


def recorded_render_policy(start: EpisodeStart | None) -> tuple[Any, int | None]:
    """`(special_tokens, budget)` a rebuild renders with by default: the special-token policy recorded in
    `start.context` (`"allow"` when none is: older logs) and the recorded budget less the reserve (None
    when none is recorded)."""
    ctx = start.context if start is not None else {}
    special = ctx.get("special_tokens") or RECORDED_DEFAULT
    budget = ctx["budget"] - int(ctx.get("reserve_tokens", 0) or 0) if isinstance(ctx.get("budget"), int) else None
    return special, budget


def render_view(view: View, renderer: RenderCache, tok: Any, budget: int | None, *,
                problems: Sequence[PairingProblem] | None = None, pin_cache: PinCheckCache | None = None) -> BuiltContext:
    """The `BuiltContext` of `view` as `rebuild` makes it, rendered with `renderer` (a `RenderCache` the caller
    may keep across views, as replay does across steps): pairing checked (`problems`: the view's pairing
    problems when the caller has them, see `check_pairing`), pins checked (`pin_cache` kept across calls
    too), the budget only reported in `truncated`."""
    check_pairing(view, problems=problems)
    rendered = renderer.render(view)
    truncated = budget is not None and len(rendered.token_ids) > budget
    return _finish(view, rendered, tok, budget, (), truncated, pin_cache)


# ---------------------------------------------------------------------------------------------- internals



def check_pairing(view: View, *, pending_before: Sequence[str] | None = None,
                  problems: Sequence[PairingProblem] | None = None) -> None:
    """`ToolPairingError` (an `InvariantError`) naming the event and call of every tool call or result of
    the view that does not pair up (`ctxkit.context.view.pairing_problems`); `problem` is the first one's.

    A trailing pending call is legal. When `pending_before` is given (the pending calls of the view before
    a compaction), a call pending only after it had its result dropped by the compressor: reported as an
    `unanswered_call`. `problems`: `pairing_problems(view.messages)` when the caller has it already (the
    builder's `ViewState.pairing_problems`, which scans only new messages)."""
    scan = PairingScan().feed(view.messages) if problems is None or pending_before is not None else None
    problems = scan.result() if problems is None else list(problems)
    if pending_before is not None:  # one scan gives both: result(allow_pending=False) adds the pending calls
        allowed = set(pending_before)
        problems += [dataclasses.replace(p, problem="unanswered_call", text=p.text.replace(
                         "has no result yet (pending call)", "lost its result to the compaction (unanswered call)"))
                     for p in scan.result(allow_pending=False)
                     if p.problem == "pending_call" and p.call_id not in allowed]
    if problems:
        first = problems[0]
        raise ToolPairingError("tool calls and results do not pair up in the view: " + "; ".join(p.text for p in problems),
                               problem=first.problem, event=first.event, call_id=first.call_id)


def _finish(view: View, rendered: Any, tok: Any, budget: int | None, appended: tuple[str, ...], truncated: bool,
            pin_cache: PinCheckCache | None = None) -> BuiltContext:
    checked = check_pins(view, rendered, tok, pin_cache)
    return BuiltContext(view=view, rendered=rendered, budget=budget, pins_checked=checked, compactions=appended,
                        truncated=truncated)


class PinCheckCache:
    """What `check_pins` keeps between the builds of one builder: the decoded text of recent message spans
    (by their ids) with the pin texts found in each, and which message objects hold which pin texts."""

    def __init__(self) -> None:
        self.decoded: dict[tuple[int, ...], tuple[str, dict[str, bool]]] = {}
        """Span ids -> (their decoded text, pin text -> whether the text holds it)."""
        self.holds: dict[tuple[int, str], tuple[Any, bool]] = {}
        """(id of a `ViewMessage`, pin text) -> (the message, kept so the id stays its own; whether its content
        holds the text)."""


def check_pins(view: View, rendered: Any, tok: Any, cache: PinCheckCache | None = None) -> tuple[str, ...]:
    """Verify every active pin verbatim in the decoded context; returns the pin ids checked.

    Decodes only the span of the message holding the pin when the renderer reports spans (each span once,
    however many pins it holds), the whole context otherwise (or when the span does not show it, e.g. a
    template that moves messages). `cache`: a `PinCheckCache` the caller keeps between calls, so an unchanged
    message is neither searched for a pin's text nor decoded again at the next build."""
    checked: list[str] = []
    full: str | None = None
    spans = getattr(rendered, "spans", ())
    by_index: dict | None = None  # index -> its (last) span, made only when spans are not one per message in order
    cache = PinCheckCache() if cache is None else cache
    memo, holds = cache.decoded, cache.holds
    if len(holds) >= 8192:
        holds.clear()
    msgs = view.messages
    texts: dict[int, tuple[str, dict[str, bool]]] = {}  # view message index -> its decoded span, this build
    for pin in view.active_pins:
        where = None
        for i, m in enumerate(msgs):  # the first message holding the text, by `PinCheckCache.holds`
            got = holds.get((id(m), pin.text))
            if got is None or got[0] is not m:
                got = holds[(id(m), pin.text)] = (m, pin.text in m.content)
            if got[1]:
                where = i
                break
        ok = False
        span = None
        if where is not None:
            if where < len(spans) and spans[where].index == where and (
                    where + 1 == len(spans) or spans[where + 1].index != where):
                span = spans[where]
            else:
                if by_index is None:
                    by_index = {sp.index: sp for sp in spans}
                span = by_index.get(where)
        if span is not None:
            got = texts.get(where)
            if got is None:
                s = span
                key = tuple(rendered.token_ids[s.start:s.end])
                got = memo.pop(key, None)  # re-inserted: the dict keeps the most recently used spans last
                if got is None:
                    got = (tok.decode(key), {})
                memo[key] = texts[where] = got
            text, found = got
            ok = found.get(pin.text)
            if ok is None:
                ok = found[pin.text] = pin.text in text
        if not ok:
            if full is None:
                full = tok.decode(rendered.token_ids)
            ok = pin.text in full
        if not ok:
            raise PinViolationError(
                f"pin {pin.pin_id} (event {pin.id}, rule {pin.rule}) is not verbatim in the built context: {pin.text!r}"
            )
        checked.append(pin.pin_id)
    if len(memo) > 256:  # keep the spans of the last builds only
        for key in list(memo)[: len(memo) - 128]:
            del memo[key]
    return tuple(checked)
