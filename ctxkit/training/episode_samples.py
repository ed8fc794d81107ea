"""Training samples faithful to what the policy saw, built from an episode log.

`samples(log)` rebuilds every step's context from the log (`replay.replay_steps`: the recorded tokenizer
and template, recorded compactions; each context checked against the step's recorded hash) and assembles:

- A sample starts with a prompt that is exactly one step's context (loss mask 0), followed by the ids that
  step sampled (loss mask 1, behaviour log-probs aligned to them).
- The next step is **merged** into the same sample when its context extends the sample's tokens so far
  token for token (prompt + sampled + the scaffold/tool tokens rendered since); the tokens in between get
  mask 0. Otherwise (a compaction rewrote the history, or the template rewrites history, e.g. Qwen3
  dropping earlier reasoning) a **new sample** starts whose prompt is exactly that step's context.
- **Shared prefixes are stored once.** A new sample records `prefix_sample` (the earlier sample of the
  same episode it shares its first tokens with) and `prefix_len`. Those prefix tokens are always part of
  the new sample's prompt (mask 0), so the exports (`ctxkit.training.sample_files`) write only `token_ids[prefix_len:]`
  and readers rebuild the rest from the referenced row (`export.read_samples` does). In memory every
  `TrainingSample` is self-contained (full `token_ids`).

Every sample of an episode carries the episode's reward with its provenance (`reward_kind` from
`events.REWARD_KINDS`, so an unscored 0 and a failed-task 0 stay distinguishable), the typed end
(`outcome`: terminated/truncated, and `cause`); `is_final` marks the sample holding the last step.

`compressed_samples(log, compressor=..., budget=...)` answers "what would the policy have been trained on,
had it seen compressed contexts?": it copies the log's events (without its own compactions) into a
`ctxkit.log.event_log.MemoryLog`, rebuilds every step's context there with a `ContextBuilder` under that compressor
and budget (the compressor's decisions are appended to the copy only: the source log is never written),
and assembles samples from those contexts and the steps' recorded ids. Each sample names the compressor and
budget in `compressor` (e.g. `window budget=4096`) and carries the compactions made before its steps in
`compactions`. A message-only log (an imported trajectory) gets offline steps first when a tokenizer is
given (`ctxkit.training.offline_steps.add_offline_steps`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence
import dataclasses
import json

from ctxkit.errors import BudgetError, ConfigError, CtxkitError, ReplayError
from ctxkit.events import Compaction, EpisodeEnd, EpisodeStart, Step, event_to_dict
from ctxkit.context.builder import ContextBuilder
from ctxkit.log.event_log import MemoryLog
from ctxkit.training.context_replay import load_events, replay_steps, resolve_setup
from ctxkit.training.offline_steps import add_offline_steps
from ctxkit.text.rendering.drift_reasons import classify_transition, count_reasons, template_default_system

if TYPE_CHECKING:  # pragma: no cover
    from ctxkit.log.event_log import EventLog

__all__ = ["TrainingSample", "EpisodeMeta", "assemble_samples", "compacted_steps", "compressed_samples", "episode_meta",
           "samples", "split_statistics"]


@dataclass(frozen=True)
class TrainingSample:
    """One training sequence: tokens, which of them the policy sampled, and how they were sampled.

    Its file columns (Parquet/JSONL) are declared once in `ctxkit.training.sample_schema.SAMPLE_COLUMNS`;
    a field added here must be added there (or to its `NOT_COLUMNS`), which its tests check."""

    episode_id: str
    """The episode this sample comes from."""
    sample_index: int
    """0-based position of this sample among its episode's samples."""
    token_ids: tuple[int, ...]
    """Every token of the sequence: the first step's context, then sampled ids and everything rendered since."""
    loss_mask: tuple[int, ...]
    """1 exactly on tokens the policy sampled, 0 on prompt, scaffold, tool output, summaries and pins."""
    logprobs: tuple[float | None, ...]
    """Behaviour log-prob per token, aligned with `token_ids`: the step's recorded value on sampled tokens,
    None where the mask is 0 (and where the engine recorded none)."""
    token_step: tuple[int, ...]
    """Per token: index into `step_seqs` of the step that sampled it; -1 where the mask is 0."""
    prompt_len: int
    """Length of the first step's context (the sample's prompt)."""
    step_seqs: tuple[int, ...]
    """Log `seq` of each step merged into this sample, in order."""
    logprob_kinds: tuple[str | None, ...]
    """Per step: which distribution its log-probs are from (`raw`, `processed`, `recomputed`; None if unknown)."""
    sampling: tuple[Mapping[str, Any], ...]
    """Per step: the sampling config used (temperature, top_p, top_k, min_p, seed, ...)."""
    policy_versions: tuple[str | int | None, ...]
    """Per step: the version of the weights that sampled it."""
    finish_reasons: tuple[str | None, ...]
    """Per step: the engine's finish reason (`stop`, `length`, `tool_calls`, `abort`)."""
    context_hashes: tuple[str, ...]
    """Per step: the verified context hash the policy saw."""
    prefix_sample: int | None
    """`sample_index` of the earlier sample whose first `prefix_len` tokens this one starts with (None: none)."""
    prefix_len: int
    """Length of the prefix shared with `prefix_sample` (0 when None); always inside this sample's prompt."""
    reward: float | None
    """The episode's reward (None when unscored or when the episode has no end)."""
    reward_kind: str
    """Provenance of `reward` (`events.REWARD_KINDS`); `unscored` when the episode has no end event."""
    outcome: str | None
    """`terminated` (the task ended) or `truncated` (a limit stopped collection); None when the log has no end."""
    cause: str
    """Why the episode ended (`answered`, `max_steps`, `context_budget`, ...); empty when it has no end."""
    is_final: bool
    """True for the sample holding the episode's last step (the one a terminal reward attaches to)."""
    template_id: str
    """Id of the chat template the contexts were rendered with."""
    tokenizer_id: str
    """Id of the tokenizer."""
    compressor: str
    """The compressor spec recorded for the episode (e.g. `mask-observations`), as text; for
    `compressed_samples`, the compressor and budget the contexts were rebuilt with (`window budget=4096`)."""
    compactions: tuple[Mapping[str, Any], ...] = ()
    """`compressed_samples` only: the events the rebuild appended before this sample's steps (compactions,
    detected pins), as `events.event_to_dict` records plus `before_step_seq` (the source seq of the step
    whose context they shaped). Empty for samples of the recorded contexts. Not a file column (the
    Parquet export keeps them in its file metadata: `ctxkit.training.sample_schema.NOT_COLUMNS`)."""
    split_reason: str = ""
    """Why this sample starts a new sequence instead of extending the previous one: one of
    `ctxkit.text.rendering.drift_reasons.DRIFT_REASONS` (`compaction`, `thinking_stripped`, `template_rewrite`,
    ...; `unexplained` when no tokenizer was given to decide); empty for an episode's first sample."""

    @property
    def logprob_kind(self) -> str | None:
        """The steps' common log-prob kind; `mixed` when they differ; None when any step has none."""
        kinds = set(self.logprob_kinds)
        if None in kinds or not kinds:
            return None
        return kinds.pop() if len(kinds) == 1 else "mixed"

    @property
    def token_policy_versions(self) -> tuple[str | int | None, ...]:
        """Per token: the policy version that sampled it (None where the mask is 0)."""
        return tuple(self.policy_versions[i] if i >= 0 else None for i in self.token_step)

    @property
    def n_tokens(self) -> int:
        """Length of the full sequence (`len(token_ids)`)."""
        return len(self.token_ids)

    @property
    def n_sampled(self) -> int:
        """Number of loss-bearing (sampled) tokens."""
        return sum(self.loss_mask)


@dataclass(frozen=True)
class EpisodeMeta:
    """What every sample of one episode shares."""

    episode_id: str
    """Episode id (EpisodeStart.episode_id, else the log header's)."""
    reward: float | None
    """Reward from EpisodeEnd (None when absent or unscored)."""
    reward_kind: str
    """Reward provenance from EpisodeEnd (`unscored` when there is no EpisodeEnd)."""
    outcome: str | None
    """EpisodeEnd.outcome, None when the episode has no end."""
    cause: str
    """EpisodeEnd.cause, empty when the episode has no end."""
    template_id: str
    """Recorded template id."""
    tokenizer_id: str
    """Recorded tokenizer id."""
    compressor: str
    """Recorded compressor spec, as text."""


def _compressor_text(context: Mapping[str, Any]) -> str:
    spec = context.get("compressor", context.get("compressor_id", ""))
    if isinstance(spec, Mapping):
        name = spec.get("id") or spec.get("name") or ""
        params = spec.get("params")
        if params:
            return f"{name} {json.dumps(params, sort_keys=True, ensure_ascii=False)}"
        return str(name)
    return "" if spec is None else str(spec)


def episode_meta(events: Sequence[Any], *, episode_id: str = "", template_id: str = "", tokenizer_id: str = "") -> EpisodeMeta:
    """The shared fields of an episode's samples, from its EpisodeStart and (last) EpisodeEnd."""
    start = next((e for e in events if isinstance(e, EpisodeStart)), None)
    end = None
    for e in events:
        if isinstance(e, EpisodeEnd):
            end = e
    ctx = dict(start.context) if start is not None else {}
    return EpisodeMeta(
        episode_id=(start.episode_id if start is not None and start.episode_id else episode_id),
        reward=end.reward if end is not None else None,
        reward_kind=end.reward_kind if end is not None else "unscored",
        outcome=end.outcome if end is not None else None,
        cause=end.cause if end is not None else "",
        template_id=template_id or str(ctx.get("template_id", "")),
        tokenizer_id=tokenizer_id or str(ctx.get("tokenizer_id", "")),
        compressor=_compressor_text(ctx),
    )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _step_logprobs(step: Step) -> tuple[float | None, ...]:
    n = len(step.token_ids)
    if step.logprobs is None:
        return (None,) * n
    if len(step.logprobs) != n:
        raise ConfigError(
            f"step seq {step.seq}: {len(step.logprobs)} log-probs for {n} sampled token ids (they must be aligned)"
        )
    out = tuple(float(x) for x in step.logprobs)
    for i, x in enumerate(out):
        if not math.isfinite(x):
            raise ConfigError(f"step seq {step.seq}: log-prob {x} of sampled token {i} is not finite")
    return out


class _Open:
    """A sample being assembled (mutable, private)."""

    def __init__(self, context: Sequence[int], prefix_sample: int | None, prefix_len: int, split_reason: str = ""):
        self.ids: list[int] = list(context)
        self.mask: list[int] = [0] * len(context)
        self.lps: list[float | None] = [None] * len(context)
        self.tstep: list[int] = [-1] * len(context)
        self.prompt_len = len(context)
        self.steps: list[Step] = []
        self.hashes: list[str] = []
        self.prefix_sample = prefix_sample
        self.prefix_len = prefix_len
        self.split_reason = split_reason

    def add_step(self, step: Step, context_hash: str) -> None:
        if not step.token_ids:
            raise ConfigError(f"step seq {step.seq}: no sampled token ids; a step must record what the policy sampled")
        k = len(self.steps)
        self.steps.append(step)
        self.hashes.append(context_hash)
        self.ids.extend(step.token_ids)
        self.mask.extend([1] * len(step.token_ids))
        self.lps.extend(_step_logprobs(step))
        self.tstep.extend([k] * len(step.token_ids))

    def extend_context(self, context: Sequence[int]) -> None:
        tail = context[len(self.ids):]
        self.ids.extend(tail)
        self.mask.extend([0] * len(tail))
        self.lps.extend([None] * len(tail))
        self.tstep.extend([-1] * len(tail))

    def freeze(self, meta: EpisodeMeta, index: int, is_final: bool) -> TrainingSample:
        return TrainingSample(
            episode_id=meta.episode_id,
            sample_index=index,
            token_ids=tuple(self.ids),
            loss_mask=tuple(self.mask),
            logprobs=tuple(self.lps),
            token_step=tuple(self.tstep),
            prompt_len=self.prompt_len,
            step_seqs=tuple(int(s.seq) if s.seq is not None else -1 for s in self.steps),
            logprob_kinds=tuple(s.logprob_kind for s in self.steps),
            sampling=tuple(dict(s.sampling) for s in self.steps),
            policy_versions=tuple(s.policy_version for s in self.steps),
            finish_reasons=tuple(s.finish_reason for s in self.steps),
            context_hashes=tuple(self.hashes),
            prefix_sample=self.prefix_sample,
            prefix_len=self.prefix_len,
            reward=meta.reward,
            reward_kind=meta.reward_kind,
            outcome=meta.outcome,
            cause=meta.cause,
            is_final=is_final,
            template_id=meta.template_id,
            tokenizer_id=meta.tokenizer_id,
            compressor=meta.compressor,
            split_reason=self.split_reason,
        )


def assemble_samples(steps: Iterable[tuple[Step, Sequence[int], str]], meta: EpisodeMeta, *, tokenizer: Any = None,
                     compacted: Iterable[Any] = (), default_system: str | None = None) -> list[TrainingSample]:
    """Merge verified `(step, context_ids, context_hash)` triples (in log order) into training samples.

    The pure core of `samples`: merging by exact extension, a new sample otherwise, shared prefixes
    referenced (see the module docstring). `context_ids` must be the exact ids the step saw. A new sample's
    `split_reason` is decided by `drift_reasons.classify_transition` from the sample so far and the new
    context (`tokenizer` decodes them; None: `unexplained` unless compacted); `compacted` holds the seqs of
    the steps a compaction was recorded before (since the previous step); `default_system` is the template's
    default system prompt (`drift_reasons.template_default_system`).
    """
    compacted = set(compacted)
    done: list[_Open] = []
    cur: _Open | None = None
    for step, context, chash in steps:
        context = tuple(context)
        if cur is not None and len(context) >= len(cur.ids) and context[: len(cur.ids)] == tuple(cur.ids):
            cur.extend_context(context)
        else:
            prefix_sample, prefix_len = None, 0
            for j, prev in enumerate(done + ([cur] if cur is not None else [])):
                n = _common_prefix(prev.ids, context)
                if n > prefix_len:
                    prefix_sample, prefix_len = j, n
            reason = ""
            if cur is not None:
                reason = classify_transition(cur.ids, cur.mask, context, tokenizer, default_system=default_system,
                                             compacted=step.seq in compacted)
                done.append(cur)
            cur = _Open(context, prefix_sample, prefix_len, reason)
        cur.add_step(step, chash)
    if cur is not None:
        done.append(cur)
    return [s.freeze(meta, i, i == len(done) - 1) for i, s in enumerate(done)]


def samples(log_or_events: "EventLog | Sequence[Any] | str", *, tokenizer: Any = None, template: Any = None) -> list[TrainingSample]:
    """Training samples of one episode (a log, a log path, or its events), from verified replayed contexts.

    Each step's context is rebuilt from the log with the recorded tokenizer and template (or the ones
    given, whose ids must match the recorded ones) and checked against the step's `context_hash`; a
    mismatch raises `ReplayError` naming the step. Returns the samples in order (see the module docstring).
    """
    events, header_episode = load_events(log_or_events)
    tok, tpl, _ = resolve_setup(events, tokenizer=tokenizer, template=template)
    replayed = replay_steps(events, tokenizer=tok, template=tpl)
    triples = []
    tok_id = tpl_id = ""
    for r in replayed:
        if not r.ok:
            raise ReplayError(f"{r.describe()}; refusing to build samples from a context that cannot be verified")
        triples.append((r.step, r.token_ids, r.got_hash))
        tok_id, tpl_id = r.tokenizer_id, r.template_id
    meta = episode_meta(events, episode_id=header_episode, template_id=tpl_id, tokenizer_id=tok_id)
    return assemble_samples(triples, meta, tokenizer=tok, compacted=compacted_steps(events),
                            default_system=template_default_system(tpl))


def compacted_steps(events: Sequence[Any]) -> set[Any]:
    """The seqs of the steps a `Compaction` event was recorded before (since the step before them)."""
    out, pending = set(), False
    for e in events:
        if isinstance(e, Compaction):
            pending = True
        elif isinstance(e, Step):
            if pending:
                out.add(e.seq)
            pending = False
    return out


def split_statistics(samples_: Iterable[TrainingSample]) -> dict[str, Any]:
    """Sample statistics: `samples`, `episodes`, `splits` (samples that start anew within an episode) and
    `splits_by_reason` (every reason of `DRIFT_REASONS`, 0 when absent)."""
    rows = list(samples_)
    reasons = [s.split_reason for s in rows if s.split_reason]
    return {"samples": len(rows), "episodes": len({s.episode_id for s in rows}), "splits": len(reasons),
            "splits_by_reason": count_reasons(reasons)}


OVERFLOW_POLICIES: tuple[str, ...] = ("error", "truncate")
"""What `compressed_samples` does with a step whose context cannot fit: raise, or end the episode there."""


def _rebuild_error(exc: Exception, step: Step, where: str) -> Exception:
    """The same error type, naming the step whose context could not be built."""
    try:
        return type(exc)(f"{where}step seq {step.seq}: {exc}")
    except TypeError:  # an error type with another constructor: keep it as it is
        return exc


def compressed_samples(
    log_or_events: "EventLog | Sequence[Any] | str",
    *,
    compressor: Any,
    budget: int,
    params: Mapping[str, Any] | None = None,
    tokenizer: Any = None,
    template: Any = None,
    reserve_tokens: int = 0,
    detect_pins: bool = False,
    on_overflow: str = "error",
) -> list[TrainingSample]:
    """Training samples of one episode as if its policy had seen contexts built by `compressor` at
    `budget` (see the module docstring). The source log is only read.

    `on_overflow` says what a step whose context cannot fit the budget does: `"error"` raises the builder's
    error; `"truncate"` ends the episode there, as a live run at that budget would have been cut: samples
    cover the steps before it, with `outcome="truncated"`, `cause="context_budget"` and no reward
    (`reward_kind="limit_truncation"`: the source's reward was earned by an episode this policy never
    finished), so a trainer bootstraps instead of crediting the source's outcome.

    `tokenizer`/`template` default to the recorded ones (given ones must have the recorded ids); a log
    without steps needs `tokenizer` and gets offline steps. `detect_pins` runs the constraint detector in
    the rebuild (its pins are recorded in `compactions`). A context the compressor cannot fit raises the
    builder's error (`BudgetError`, ...) naming the step.
    """
    if on_overflow not in OVERFLOW_POLICIES:
        raise ConfigError(f"on_overflow is {on_overflow!r}; expected one of {list(OVERFLOW_POLICIES)}")
    events, header_episode = load_events(log_or_events)
    where = f"{log_or_events}: " if isinstance(log_or_events, str) else ""
    if not any(isinstance(e, Step) for e in events):
        if tokenizer is None:
            raise ConfigError(f"{where}the log holds no steps; pass a tokenizer to make offline steps from its assistant turns")

        events = tuple(add_offline_steps(events, tokenizer, template))
    tok, tpl, _ = resolve_setup(events, tokenizer=tokenizer, template=template)
    builder = ContextBuilder(tok, tpl, compressor=compressor, budget=budget, params=params,
                             detect_pins=detect_pins, reserve_tokens=reserve_tokens)
    mem = MemoryLog()
    triples = []
    made: dict[int, list[dict[str, Any]]] = {}
    cut = False
    for pos, event in enumerate(events):
        if isinstance(event, Compaction):  # the source's own decisions: rebuilt under the new compressor instead
            continue
        if isinstance(event, EpisodeStart):
            event = dataclasses.replace(event, context=builder.describe())
        if isinstance(event, Step):
            n0 = len(mem)
            try:
                ctx = builder.build(mem)
            except BudgetError as exc:
                if on_overflow == "error":
                    raise _rebuild_error(exc, event, where) from None
                cut = True
                break
            except CtxkitError as exc:
                raise _rebuild_error(exc, event, where) from None
            seq = pos if event.seq is None else int(event.seq)
            made[seq] = [dict(event_to_dict(e), before_step_seq=seq) for e in mem.events()[n0:]]
            event = dataclasses.replace(event, context_hash=ctx.hash, context_length=ctx.n_tokens)
            triples.append((dataclasses.replace(event, seq=seq), ctx.token_ids, ctx.hash))
        if event.id is None:
            mem.append(event)
        else:  # keep the source ids: compaction edits name them
            mem.adopt([event])
    meta = episode_meta(events, episode_id=header_episode, template_id=tpl.id, tokenizer_id=tok.id)
    spec = _compressor_text({"compressor": builder.describe()["compressor"]})
    meta = dataclasses.replace(meta, compressor=f"{spec} budget={budget}" + (f" reserve={reserve_tokens}" if reserve_tokens else ""))
    if cut:
        meta = dataclasses.replace(meta, outcome="truncated", cause="context_budget", reward=None,
                                   reward_kind="limit_truncation")
    comp = {q for q, evs in made.items() if any(e.get("kind") == "compaction" for e in evs)}
    return [dataclasses.replace(s, compactions=tuple(c for q in s.step_seqs for c in made.get(q, ())))
            for s in assemble_samples(triples, meta, tokenizer=tok, compacted=comp,
                                      default_system=template_default_system(tpl))]
