"""Replay: rebuild any step's context from the saved log alone and check it against the recorded hash.

`replay(log, step=K)` rebuilds the context step K (0-based, in log order) saw: the view of every event
before the step, with the recorded compactions, summaries and retrieval results applied as recorded
(`builder.rebuild`, which never re-runs a compressor), rendered with the recorded tokenizer and template.
Those come from `EpisodeStart.context` (the builder's `describe()`), or the ones passed, and their ids
must equal the recorded ids; otherwise `ReplayError`, unless `allow_hash_mismatch=True` (then a warning
is kept in the result).

Locating the first differing token. A step records only its context's hash and length, not its ids, so
the first differing token is located from what is known to be true: the previous step's verified
context followed by the ids it sampled (`P`). When no compaction happened in between and the template is
prefix-preserving, the recorded context extended `P`, so if the rebuilt ids leave `P` at position i,
i is the first differing token (expected `P[i]`, got the rebuilt id). When the rebuilt ids do extend `P`,
the difference lies at or after `len(P)` and the result names the events rendered from there
(`suspect_events`). Otherwise (first step, compaction in between, history-rewriting template) only the
lengths and hashes are compared, and that is said.

`replay_steps(log)` replays every step in one incremental walk (`StepContexts`: one view state fed each
event once, one kept render cache), so it costs about what building the episode live did; its results
equal rebuilding each step from scratch (`replay_steps(..., reference=True)`, the quadratic reference).
`verify_log(log)` replays every step. `resume(log_path)` gathers what continuing an interrupted episode
needs (restored external state, pending tool calls, pins, sampler, a ready builder).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from ctxkit.errors import ConfigError, CtxkitError, ReplayError
from ctxkit.events import Compaction, EpisodeEnd, EpisodeStart, Event, Message, Pin, Step, ToolCall, ToolResult
from ctxkit.context.builder import (RENDERS_KEPT, ContextBuilder, PinCheckCache, rebuild, recorded_history,
                                    recorded_render_policy, recorded_template, render_view)
from ctxkit.context.render_cache import RenderCache
from ctxkit.context.view import ViewState
from ctxkit.context.pins import active_pins
from ctxkit.log.event_log import read_events, read_header, repair, verify
from ctxkit.log.protocols import ReadableLog
from ctxkit.log.state import BlobStore, latest_snapshots, restore_snapshot
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.tokenizer.loader import load_tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from ctxkit.context.builder import BuiltContext

__all__ = ["Mismatch", "ReplayResult", "StepContexts", "VerifyResult", "load_events", "replay", "replay_steps", "resolve_setup", "verify_log", "ResumeState", "resume"]


def load_events(log_or_events: Any) -> tuple[tuple[Event, ...], str]:
    """`(events, header episode id)` of a log (`ReadableLog`: an `EventLog` or `MemoryLog`), a log path, or a
    sequence of events.

    A path is read and its hash chain verified (`LogFormatError` names the line of any corruption).
    """
    if isinstance(log_or_events, ReadableLog):
        return tuple(log_or_events.events()), str(getattr(log_or_events, "episode_id", "") or "")
    if isinstance(log_or_events, (str, os.PathLike)):
        events = read_events(log_or_events)
        return events, str(read_header(log_or_events).get("episode_id", ""))
    if isinstance(log_or_events, Sequence):
        return tuple(log_or_events), ""
    raise ConfigError(f"expected an EventLog, a log path or a sequence of events, got {type(log_or_events).__name__}")


def resolve_setup(events: Sequence[Event], *, tokenizer: Any = None, template: Any = None,
                  allow_hash_mismatch: bool = False) -> tuple[Any, Any, tuple[str, ...]]:
    """`(tokenizer, template, warnings)` to replay `events` with: the recorded ones from
    `EpisodeStart.context` unless given; a recorded id that differs from the loaded one is a `ReplayError`
    unless `allow_hash_mismatch` (then it is a warning)."""
    start = next((e for e in events if isinstance(e, EpisodeStart)), None)
    desc = dict(start.context) if start is not None else {}
    rec_tok = desc.get("tokenizer") if isinstance(desc.get("tokenizer"), dict) else {}
    rec_tpl = desc.get("template") if isinstance(desc.get("template"), dict) else {}
    if tokenizer is None:
        if not rec_tok.get("spec"):
            raise ReplayError("the log records no tokenizer (EpisodeStart.context['tokenizer']['spec']); pass tokenizer=")
        tokenizer = rec_tok["spec"]
    tok = load_tokenizer(tokenizer)
    tpl = load_template(template, tok) if template is not None else recorded_template(rec_tpl, tok)
    warnings = []
    for what, rec, obj in (("tokenizer", rec_tok, tok), ("template", rec_tpl, tpl)):
        if rec.get("id") and rec["id"] != obj.id:
            msg = f"recorded {what} id {rec['id']} differs from the loaded {what} {obj.id}"
            if not allow_hash_mismatch:
                raise ReplayError(msg + " (pass allow_hash_mismatch=True / --allow-hash-mismatch to replay anyway)")
            warnings.append(msg)
        elif not rec.get("id"):
            warnings.append(f"the log records no {what} id; replaying with {obj.id}")
    return tok, tpl, tuple(warnings)


@dataclass(frozen=True)
class Mismatch:
    """How a rebuilt context differs from the recorded one (see the module docstring)."""

    expected_length: int
    """The recorded `Step.context_length`."""
    got_length: int
    """Length of the rebuilt context."""
    position: int | None
    """First differing token position, when it can be located; None otherwise."""
    expected_token: int | None
    """The recorded token at `position` (None when the recorded context ends there or it is unknown)."""
    got_token: int | None
    """The rebuilt token at `position` (None when the rebuilt context ends there or it is unknown)."""
    verified_prefix: int
    """Number of leading tokens known to equal the recorded context."""
    suspect_events: tuple[str, ...]
    """Ids of the events rendered from `verified_prefix` on: where the difference must lie."""

    def describe(self) -> str:
        """One line for humans."""
        lens = f"recorded {self.expected_length} tokens, rebuilt {self.got_length}"
        if self.position is not None:
            return (f"first differing token at position {self.position}: expected {self.expected_token}, "
                    f"got {self.got_token} ({lens})")
        where = f"; the first {self.verified_prefix} tokens match" if self.verified_prefix else ""
        sus = f"; the difference lies in events {', '.join(self.suspect_events[:8])}" if self.suspect_events else ""
        return f"first differing token not locatable from the log ({lens}{where}{sus})"


@dataclass(frozen=True)
class ReplayResult:
    """One step replayed."""

    step: Step
    """The recorded step."""
    index: int
    """0-based index of the step among the episode's steps."""
    ok: bool
    """True when the rebuilt context's hash equals the recorded `context_hash`."""
    expected_hash: str
    """The recorded `context_hash`."""
    got_hash: str | None
    """Hash of the rebuilt context (None when the rebuild failed)."""
    context: "BuiltContext | None"
    """The rebuilt context (None when the rebuild failed)."""
    mismatch: Mismatch | None
    """Where it differs, when `ok` is False and the rebuild succeeded."""
    error: str | None
    """Why the rebuild failed (an edit naming a missing event, an orphaned tool result, ...)."""
    tokenizer_id: str
    """Id of the tokenizer replayed with."""
    template_id: str
    """Id of the template replayed with."""
    warnings: tuple[str, ...] = ()
    """Id mismatches that were allowed, missing recorded ids."""

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The rebuilt context ids (empty when the rebuild failed)."""
        return self.context.token_ids if self.context is not None else ()

    def describe(self) -> str:
        """One line for humans."""
        head = f"step {self.index} (seq {self.step.seq})"
        if self.ok:
            return f"{head}: ok, {len(self.token_ids)} tokens, hash {self.expected_hash[:16]}"
        if self.error is not None:
            return f"{head}: rebuild failed: {self.error}"
        assert self.mismatch is not None
        return (f"{head}: context hash mismatch (recorded {self.expected_hash[:16]}, rebuilt {str(self.got_hash)[:16]}); "
                + self.mismatch.describe())


@dataclass(frozen=True)
class VerifyResult:
    """Every step of a log replayed."""

    ok: bool
    """True only when every step verifies (and there is at least one step)."""
    n_steps: int
    """Steps in the log."""
    n_ok: int
    """Steps whose rebuilt context matches."""
    results: tuple[ReplayResult, ...]
    """Per step, in order."""

    @property
    def first_failure(self) -> ReplayResult | None:
        """The first step that does not verify."""
        return next((r for r in self.results if not r.ok), None)


def _suspects(ctx: "BuiltContext", start: int) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for _, prov in ctx.provenance[start:]:
        if prov is not None:
            for eid in prov.event_ids:
                seen.setdefault(eid, None)
    return tuple(seen)


def _mismatch(step: Step, ctx: "BuiltContext", trusted: tuple[int, ...] | None, compactions: tuple[str, ...]) -> Mismatch:
    got = ctx.token_ids
    base = dict(expected_length=int(step.context_length), got_length=len(got))
    locatable = not compactions and bool(getattr(ctx.rendered, "prefix_preserving", False))
    if trusted is None or not locatable:
        return Mismatch(**base, position=None, expected_token=None, got_token=None, verified_prefix=0,
                        suspect_events=compactions + tuple(e for e in _suspects(ctx, 0) if e not in compactions))
    n = min(len(trusted), len(got))
    i = next((k for k in range(n) if trusted[k] != got[k]), n)
    if i == len(trusted):  # the rebuilt context extends the trusted prefix: the difference lies after it
        return Mismatch(**base, position=None, expected_token=None, got_token=None, verified_prefix=i,
                        suspect_events=_suspects(ctx, i))
    return Mismatch(**base, position=i, expected_token=trusted[i], got_token=got[i] if i < len(got) else None,
                    verified_prefix=i, suspect_events=_suspects(ctx, i))


class StepContexts:
    """The rebuilt context before each event position of `events`, from one walk over the log: a `ViewState`
    fed each event once, every view rendered by one kept `RenderCache` (a view extending the previous one
    renders only its new text; a compaction's view is spliced), pins checked with one `PinCheckCache`.
    `at(pos)` equals `rebuild(events[:pos], tokenizer=tok, template=tpl)` (ids, mask, hash, view, errors);
    positions must not decrease from one call to the next. Replaying an episode costs about what building
    it live did, not one full rebuild per step."""

    def __init__(self, events: Sequence[Event], tok: Any, tpl: Any) -> None:
        self.events, self.tok, self.tpl = events, tok, tpl
        self._state = ViewState()
        self._fed = 0
        self._failed: Exception | None = None  # what feeding raised: every later rebuild raises it too
        self._start_at = next((i for i, e in enumerate(events) if isinstance(e, EpisodeStart)), len(events))
        self._policy: tuple[Any, RenderCache] | None = None  # (special-token policy, its render cache)
        self._pins = PinCheckCache()

    def at(self, pos: int) -> "BuiltContext":
        """The context of the view after `events[:pos]`, rendered as `rebuild` renders it; raises what
        `rebuild` would (a `CtxkitError` for an edit naming a missing event, an orphaned result, ...)."""
        if pos < self._fed:
            raise ConfigError(f"StepContexts.at({pos}): already walked to {self._fed}; positions must not decrease")
        if self._failed is None:
            try:
                self._state.feed(self.events[self._fed:pos])
            except Exception as exc:  # re-raised at every later position: a rebuild would feed that event too
                self._failed = exc
        self._fed = pos
        if self._failed is not None:
            raise self._failed
        start = self.events[self._start_at] if self._start_at < pos else None
        special, budget = recorded_render_policy(start)
        if self._policy is None or self._policy[0] != special:
            self._policy = (special, RenderCache(self.tok, self.tpl, size=RENDERS_KEPT, special_tokens=special,
                                                 history=recorded_history(start)))
        view = self._state.view()
        problems = self._state.pairing_problems()
        try:
            return render_view(view, self._policy[1], self.tok, budget, problems=problems, pin_cache=self._pins)
        except Exception:
            self._policy = None  # a render that failed part way may leave its renderer behind: start afresh
            raise


def replay_steps(log_or_events: Any, *, tokenizer: Any = None, template: Any = None,
                 allow_hash_mismatch: bool = False, reference: bool = False) -> Iterator[ReplayResult]:
    """Replay every step in log order, yielding one `ReplayResult` each (a failed rebuild is reported in
    the result, never raised). Setup errors (no recorded tokenizer, id mismatch) raise `ReplayError`.

    The contexts come from one incremental walk over the log (`StepContexts`: linear in the episode's
    length). `reference=True` rebuilds each step from scratch with `rebuild` instead (quadratic; the
    results are identical: kept as the reference the walk is tested and benchmarked against)."""
    events, _ = load_events(log_or_events)
    tok, tpl, warnings = resolve_setup(events, tokenizer=tokenizer, template=template, allow_hash_mismatch=allow_hash_mismatch)
    if reference:
        def context_at(pos: int) -> "BuiltContext":
            return rebuild(events[:pos], tokenizer=tok, template=tpl)
    else:
        context_at = StepContexts(events, tok, tpl).at
    trusted: tuple[int, ...] | None = None
    compactions: list[str] = []  # compaction events since the previous step
    index = 0
    for pos, event in enumerate(events):
        if isinstance(event, Compaction):
            compactions.append(event.id or f"seq {event.seq}")
            continue
        if not isinstance(event, Step):
            continue
        common = dict(step=event, index=index, expected_hash=event.context_hash, tokenizer_id=tok.id,
                      template_id=tpl.id, warnings=warnings)
        index += 1
        try:
            ctx = context_at(pos)
        except CtxkitError as exc:
            yield ReplayResult(**common, ok=False, got_hash=None, context=None, mismatch=None,
                               error=f"{type(exc).__name__}: {exc}")
            trusted, compactions = None, []
            continue
        if ctx.hash == event.context_hash:
            yield ReplayResult(**common, ok=True, got_hash=ctx.hash, context=ctx, mismatch=None, error=None)
            trusted = tuple(ctx.token_ids) + tuple(event.token_ids)
        else:
            yield ReplayResult(**common, ok=False, got_hash=ctx.hash, context=ctx,
                               mismatch=_mismatch(event, ctx, trusted, tuple(compactions)), error=None)
            trusted = None
        compactions = []


def replay(log_or_events: Any, step: int, *, tokenizer: Any = None, template: Any = None,
           allow_hash_mismatch: bool = False) -> ReplayResult:
    """Rebuild the context of step `step` (0-based index among the steps; negative counts from the end)
    from the saved log and verify it against the recorded hash. Earlier steps are replayed too, so a
    mismatch can name its first differing token (see the module docstring)."""
    events, _ = load_events(log_or_events)
    n = sum(1 for e in events if isinstance(e, Step))
    if isinstance(step, bool) or not isinstance(step, int) or not -n <= step < n:
        raise ConfigError(f"step={step!r}: the log has {n} step(s); expected an index in [{-n}, {n})" if n else
                          f"step={step!r}: the log has no steps")
    k = step % n
    for result in replay_steps(events, tokenizer=tokenizer, template=template, allow_hash_mismatch=allow_hash_mismatch):
        if result.index == k:
            return result
    raise AssertionError("unreachable")  # pragma: no cover


def verify_log(log_or_events: Any, *, tokenizer: Any = None, template: Any = None,
               allow_hash_mismatch: bool = False) -> VerifyResult:
    """Replay every step; `ok` only when all of them verify."""
    results = tuple(replay_steps(log_or_events, tokenizer=tokenizer, template=template, allow_hash_mismatch=allow_hash_mismatch))
    n_ok = sum(r.ok for r in results)
    return VerifyResult(ok=bool(results) and n_ok == len(results), n_steps=len(results), n_ok=n_ok, results=results)


@dataclass(frozen=True)
class ResumeState:
    """Everything needed to continue an interrupted episode from its log."""

    log_path: str
    """The log (repaired if its tail was torn); open it with `EventLog.open` to append."""
    repaired: Any
    """The `log.RepairReport` when a torn tail was repaired, else None."""
    episode_id: str
    """The episode id."""
    next_step: int
    """Index of the next step (the number of steps recorded)."""
    next_seq: int
    """Seq the next appended event will get."""
    pending_tool_calls: tuple[ToolCall, ...]
    """Tool calls made by the policy with no result recorded yet, in call order: run them next."""
    unsnapshotted_results: tuple[ToolResult, ...]
    """Successful tool results recorded after the latest snapshot of some restored state: their effects
    are not in the restored state (a crash between the result and its snapshot); re-apply those calls."""
    pins: tuple[Pin, ...]
    """The pins in force."""
    sampler: Mapping[str, Any]
    """Sampling config: `EpisodeStart.sampler` overlaid with the last step's `sampling`."""
    seed: Any
    """The sampler seed (`sampler["seed"]`), None when none was recorded."""
    restored: Mapping[str, Any]
    """State name -> what `state.restore_snapshot` returned (a `RestoreReport`, or the JSON value)."""
    builder: Any
    """A `ContextBuilder` from `EpisodeStart.context`, ready to build the next context."""
    ended: EpisodeEnd | None
    """The EpisodeEnd when the episode already ended (nothing to resume)."""


def resume(log_path: Any, *, targets: Mapping[str, Any] | None = None, tokenizer: Any = None) -> ResumeState:
    """Prepare to continue the episode in `log_path`: repair a torn tail, restore the latest snapshot of
    each recorded state (directories into `targets[name]`, required for each directory state; JSON values
    are returned), find pending tool calls, pins in force and the sampler, and rebuild the builder."""
    if not isinstance(log_path, (str, os.PathLike)):
        raise ConfigError(f"resume: expected a log path, got {type(log_path).__name__}")
    report = verify(log_path)
    repaired = repair(log_path) if report.torn_tail else None
    events = read_events(log_path)
    start = next((e for e in events if isinstance(e, EpisodeStart)), None)
    if start is None or not start.context:
        raise ReplayError(f"{log_path}: no EpisodeStart with a builder description; cannot rebuild the builder")
    builder = ContextBuilder.from_description(start.context, tokenizer=tokenizer)
    answered = {e.tool_call_id for e in events if isinstance(e, ToolResult)}
    answered |= {e.tool_call_id for e in events if isinstance(e, Message) and e.role == "tool" and e.tool_call_id}
    pending = tuple(tc for e in events if isinstance(e, (Step, Message)) for tc in e.tool_calls if tc.id not in answered)
    steps = [e for e in events if isinstance(e, Step)]
    sampler = {**dict(start.sampler), **(dict(steps[-1].sampling) if steps else {})}
    targets = dict(targets or {})
    snaps = latest_snapshots(events)
    missing = sorted(n for n, s in snaps.items() if s.adapter == "directory" and n not in targets)
    if missing:
        raise ConfigError(f"resume: pass targets= for the directory state(s) {missing} (name -> folder to restore into)")
    store = BlobStore.for_log(log_path)
    restored = {name: restore_snapshot(snap, store, targets.get(name)) for name, snap in snaps.items()}
    oldest = min((s.seq for s in snaps.values()), default=None)
    stale = tuple(e for e in events if isinstance(e, ToolResult) and e.status == "ok" and oldest is not None and e.seq > oldest)
    ends = [e for e in events if isinstance(e, EpisodeEnd)]
    return ResumeState(
        log_path=str(log_path), repaired=repaired, episode_id=start.episode_id or str(read_header(log_path).get("episode_id", "")),
        next_step=len(steps), next_seq=len(events), pending_tool_calls=pending, unsnapshotted_results=stale,
        pins=active_pins(events), sampler=sampler, seed=sampler.get("seed"), restored=restored, builder=builder,
        ended=ends[-1] if ends else None,
    )
