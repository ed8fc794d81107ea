"""Pre-flight audit of episode logs: the checks an RL engineer runs before a larger training run.

`audit(paths)` reads logs (files, or folders searched recursively for `*.jsonl` files whose first line is
a ctxkit log header) and runs five checks, each with counts and failing examples:

1. `record`: one raw record reconstructs tokens, roles, the policy mask and next-token alignment of the
   log-probs: the log reads and chains; every step has sampled ids and one log-prob per sampled id (each
   <= 0: a log-prob of the token at that position given the tokens before it); every step's context
   rebuilds from the log to its recorded hash; the samples' loss mask agrees with the renderer's roles
   (1 exactly on tokens rendered as the policy's own sampled assistant turns).
2. `rewards`: unscored, tool failure, task failure and truncation are not one silent zero: an EpisodeEnd
   exists and states `reward_kind` explicitly (raw line), `scored` comes with a number, `unscored` has
   none, a `scored` reward on a truncated episode and a `*_truncation` kind on a terminated one are flagged.
3. `distributions`: every log-prob names its distribution (`logprob_kind`), raw log-probs kept beside
   processed ones are labelled so, each step records its sampling config and its policy version.
   (Raw log-probs under a non-trivial sampler are a warning: ratios against them are biased.)
4. `ends`: ends are typed: `terminated`/`truncated` with a cause; a limit cause (max_steps, context
   budget, wall time, ...) recorded as `terminated`, or a last step cut by `length` recorded as a
   terminated answer, is flagged.
5. `resume`: enough is recorded to resume: the builder description, a sampler seed, unique tool-call ids
   and results that answer a known call, unpins of known pins, and, in episodes with external state
   (any `StateSnapshot`, or `stateful: true` in the task/metadata), a snapshot after every successful tool
   result whose manifest blob exists beside the log.

Offline logs. A step made from a saved trajectory (`logprob_kind == "none"`, see `ctxkit.training.offline_steps`)
records no behaviour log-probs, sampling config, policy version or sampler seed by construction: those
requirements do not apply to it (a `none` step that does carry log-probs fails `record`). A log whose steps
are all offline is listed in `AuditReport.offline`: usable for supervised training, not for
importance-weighted RL. A live step without log-probs still fails `record`.

Figures: generated and loss-bearing tokens (per second of generation where `Step.timings` exist, and
per wall second), policy-version lag per step when `trained_at` is given, tool timeout rate, episode
timeout rate, abort rate and discard rate (episodes a trainer drops, `is_discarded`: no sampled step, no
end, an unscored end, a length truncation, or a step that does not replay). The experiment report's
"discarded" column uses the same function. With the rebuild: samples, the samples that start anew and why
(`sample_splits_by_reason`), and the drifts of sampled turns by reason (`drifts_by_reason`; reasons from
`ctxkit.text.rendering.drift_reasons.DRIFT_REASONS`, non-zero ones listed).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ctxkit.errors import ConfigError, CtxkitError
from ctxkit.text.special_tokens import count_in_log
from ctxkit.events import Compaction, EpisodeEnd, EpisodeStart, Event, Step, ToolResult
from ctxkit.training.preflight_resume import resume_problems
from ctxkit.training.offline_steps import is_offline_step
from ctxkit.training.context_replay import load_events, replay_steps, resolve_setup
from ctxkit.training.episode_samples import assemble_samples, compacted_steps, episode_meta
from ctxkit.text.rendering.drift_reasons import count_reasons, template_default_system

__all__ = ["CHECKS", "Finding", "CheckResult", "AuditReport", "audit", "find_logs", "is_discarded",
           "DISCARDED_REWARD_KINDS"]

CHECKS: dict[str, str] = {
    "record": "one raw record reconstructs tokens, roles, policy mask and log-prob alignment",
    "rewards": "unscored / tool failure / task failure / truncation are not the same silent zero",
    "distributions": "log-prob distributions are named and the sampling config is recorded",
    "ends": "episode ends are typed (terminated vs truncated, with cause)",
    "resume": "enough is recorded to resume (state snapshots, pending calls, pins, sampler seed)",
}
"""The five checks, in report order: name -> what it asserts."""

LIMIT_CAUSES = frozenset({"max_steps", "max_turns", "context_budget", "context_length", "wall_time", "timeout",
                          "max_tokens", "time_limit", "step_limit"})
"""Causes that name an external limit (a truncation, not the task ending)."""

TIMEOUT_CAUSES = frozenset({"wall_time", "timeout", "time_limit"})

DISCARDED_REWARD_KINDS: frozenset[str] = frozenset({"unscored", "length_truncation"})
"""Reward kinds whose episode a trainer drops: `unscored` (no reward at all, e.g. a harness error) and
`length_truncation` (cut by the context budget, the policy's window or the generation limit: overlong
filtering; its loss tokens would teach the policy that running long costs nothing)."""


def is_discarded(steps: Sequence[Step], end: EpisodeEnd | None, *, replays: bool = True) -> bool:
    """Whether a trainer drops this episode (the one definition of "discarded", used by `ctxkit audit`'s
    `discard_rate` and by the experiment report's "discarded" column).

    Dropped: no sampled step (nothing to train on), no `EpisodeEnd` (the outcome is unknown), a reward kind
    in `DISCARDED_REWARD_KINDS` (unscored, or a length truncation), or (`replays=False`) a record that does
    not reconstruct. Kept: scored ends, task and tool failures, constraint violations, and limit truncations
    (`max_steps`, `wall_time`: the steps train with a bootstrapped value)."""
    return not steps or end is None or end.reward_kind in DISCARDED_REWARD_KINDS or not replays


@dataclass(frozen=True)
class Finding:
    """One failing (or warned) item."""

    check: str
    """Check name (a key of `CHECKS`)."""
    path: str
    """Log file (or `<events>`)."""
    where: str
    """Where in it: `seq 12`, `line 7`, `episode`."""
    message: str
    """What is wrong."""

    def __str__(self) -> str:
        return f"{self.path}: {self.where}: {self.message}"


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check over every log."""

    name: str
    """Check name."""
    title: str
    """What it asserts."""
    checked: int
    """Items checked (steps or episodes)."""
    failed: int
    """Failing items."""
    examples: tuple[Finding, ...]
    """Up to `max_examples` failing items."""
    warnings: tuple[Finding, ...] = ()
    """Things worth a look that do not fail the check (first `max_examples`)."""

    @property
    def ok(self) -> bool:
        """True when nothing failed."""
        return self.failed == 0


@dataclass(frozen=True)
class AuditReport:
    """The audit of a set of logs."""

    paths: tuple[str, ...]
    """Logs audited."""
    checks: tuple[CheckResult, ...]
    """The five checks, in `CHECKS` order."""
    figures: Mapping[str, Any]
    """Token, time, lag and rate figures."""
    skipped: tuple[str, ...] = ()
    """Files under the given folders that are not ctxkit logs."""
    offline: tuple[str, ...] = ()
    """Logs whose steps are all offline (no behaviour log-probs): usable for supervised training, not for
    importance-weighted RL."""

    @property
    def ok(self) -> bool:
        """True when every check passes (and at least one log was audited)."""
        return bool(self.paths) and all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (`ctxkit audit --json`)."""
        return {
            "ok": self.ok,
            "paths": list(self.paths),
            "skipped": list(self.skipped),
            "offline": list(self.offline),
            "checks": [
                {"name": c.name, "title": c.title, "ok": c.ok, "checked": c.checked, "failed": c.failed,
                 "examples": [vars(f) for f in c.examples], "warnings": [vars(f) for f in c.warnings]}
                for c in self.checks
            ],
            "figures": dict(self.figures),
        }


def find_logs(paths: Iterable[Any]) -> tuple[list[Path], list[Path]]:
    """`(logs, skipped)`: explicit files are logs; folders are searched for `*.jsonl` ctxkit logs."""
    logs: list[Path] = []
    skipped: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            for f in sorted(p.rglob("*.jsonl")):
                (logs if _looks_like_log(f) else skipped).append(f)
        elif p.exists():
            logs.append(p)
        else:
            raise ConfigError(f"{p} does not exist (expected an episode log or a run folder)")
    return logs, skipped


def _looks_like_log(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(1 << 16)
        return b'"ctxkit_log"' in first
    except OSError:
        return False


class _Acc:
    """Findings and counters accumulated over logs (private, mutable)."""

    def __init__(self, max_examples: int):
        self.max_examples = max_examples
        self.checked: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.examples: dict[str, list[Finding]] = {k: [] for k in CHECKS}
        self.warnings: dict[str, list[Finding]] = {k: [] for k in CHECKS}
        self.n: Counter[str] = Counter()
        self.specials: dict[str, int] = {}  # log -> special-token occurrences in message content
        self.floats: Counter[str] = Counter()
        self.lags: list[int] = []
        self.lag_unknown = 0
        self.offline: list[str] = []
        self.splits: Counter[str] = Counter()  # split reason -> samples that start anew for it
        self.drifts: Counter[str] = Counter()  # drift reason -> drifts (each once per log)

    def fail(self, check: str, path: str, where: str, message: str) -> None:
        self.failed[check] += 1
        if len(self.examples[check]) < self.max_examples:
            self.examples[check].append(Finding(check, path, where, message))

    def warn(self, check: str, path: str, where: str, message: str) -> None:
        if len(self.warnings[check]) < self.max_examples:
            self.warnings[check].append(Finding(check, path, where, message))


def audit(paths: Iterable[Any], *, trained_at: int | None = None, rebuild: bool = True, max_examples: int = 5) -> AuditReport:
    """Audit logs (files or run folders). `rebuild=False` skips the context replay in check 1 (no
    tokenizer needed). `trained_at`: the policy version being trained now, for the lag figures."""
    logs, skipped = find_logs(paths)
    acc = _Acc(max_examples)
    for path in logs:
        _audit_log(path, acc, trained_at=trained_at, rebuild=rebuild)
    checks = tuple(
        CheckResult(name=k, title=t, checked=acc.checked[k], failed=acc.failed[k],
                    examples=tuple(acc.examples[k]), warnings=tuple(acc.warnings[k]))
        for k, t in CHECKS.items()
    )
    return AuditReport(paths=tuple(str(p) for p in logs), checks=checks, figures=_figures(acc, trained_at),
                       skipped=tuple(str(p) for p in skipped), offline=tuple(acc.offline))


def _raw_end_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    out = []
    with open(path, "rb") as fh:
        for i, line in enumerate(fh, 1):
            if b'"episode_end"' in line:
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if obj.get("kind") == "episode_end":
                    out.append((i, obj))
    return out


def _audit_log(path: Path, acc: _Acc, *, trained_at: int | None, rebuild: bool) -> None:
    p = str(path)
    acc.n["logs"] += 1
    try:
        events, _ = load_events(path)
    except CtxkitError as exc:
        acc.checked["record"] += 1
        acc.fail("record", p, "file", f"the log cannot be read: {exc}")
        acc.n["discarded"] += is_discarded((), None, replays=False)
        return
    steps = [e for e in events if isinstance(e, Step)]
    ends = [e for e in events if isinstance(e, EpisodeEnd)]
    start = next((e for e in events if isinstance(e, EpisodeStart)), None)
    end = ends[-1] if ends else None
    if steps and all(is_offline_step(s) for s in steps):
        acc.offline.append(p)
    replays = _check_record(p, events, steps, acc, rebuild)
    _check_rewards(p, path, end, acc)
    _check_distributions(p, start, steps, acc)
    _check_ends(p, end, steps, acc)
    _check_resume(p, path, events, start, steps, acc)
    _count_figures(events, steps, end, acc, trained_at)
    specials = count_in_log(events)  # special-token text in message content, per log (ctxkit.text.special_tokens)
    if specials:
        acc.n["special_tokens_in_content"] += specials
        acc.specials[p] = specials
    if is_discarded(steps, end, replays=replays):
        acc.n["discarded"] += 1


def _check_record(p: str, events: Sequence[Event], steps: Sequence[Step], acc: _Acc, rebuild: bool) -> bool:
    ok = True
    if not steps:
        acc.checked["record"] += 1
        acc.fail("record", p, "episode", "no Step events: nothing the policy sampled is recorded")
        return False
    for s in steps:
        acc.checked["record"] += 1
        where = f"seq {s.seq}"
        if not s.token_ids:
            acc.fail("record", p, where, "step has no sampled token ids")
            ok = False
        elif is_offline_step(s):
            if s.logprobs is not None or s.raw_logprobs is not None:
                acc.fail("record", p, where, "logprob_kind 'none' (an offline step) but log-probs are recorded")
                ok = False
        elif s.logprobs is None:
            acc.fail("record", p, where, f"no log-probs for {len(s.token_ids)} sampled ids (behaviour log-probs cannot be reconstructed)")
            ok = False
        elif len(s.logprobs) != len(s.token_ids):
            acc.fail("record", p, where, f"{len(s.logprobs)} log-probs for {len(s.token_ids)} sampled ids: not aligned token for token")
            ok = False
        elif any(x > 1e-6 for x in s.logprobs):
            i = next(i for i, x in enumerate(s.logprobs) if x > 1e-6)
            acc.fail("record", p, where, f"log-prob {s.logprobs[i]} > 0 at sampled token {i}: not a log-probability (logits? shifted?)")
            ok = False
        if not s.context_hash:
            acc.fail("record", p, where, "no context_hash: the context the policy saw cannot be verified")
            ok = False
    if not rebuild or not ok:
        return ok

    try:
        tok, tpl, _ = resolve_setup(events)
        results = list(replay_steps(events, tokenizer=tok, template=tpl))
    except CtxkitError as exc:
        acc.fail("record", p, "episode", f"contexts cannot be rebuilt: {exc}")
        return False
    for r in results:
        if not r.ok:
            acc.fail("record", p, f"seq {r.step.seq}", r.describe())
            ok = False
    if not ok:
        return False
    samples = assemble_samples([(r.step, r.token_ids, r.got_hash) for r in results], episode_meta(events),
                               tokenizer=tok, compacted=compacted_steps(events),
                               default_system=template_default_system(tpl))
    acc.n["loss_tokens"] += sum(s.n_sampled for s in samples)
    acc.n["samples"] += len(samples)
    acc.splits.update(s.split_reason for s in samples if s.split_reason)
    # a drift is counted once, at the first step whose context holds it (later contexts hold it again)
    seen: set[tuple[int, int]] = set()
    for r in results:
        for d in r.context.rendered.drifts:
            if (d.message_index, d.position) not in seen:
                seen.add((d.message_index, d.position))
                acc.drifts[getattr(d, "reason", "unexplained")] += 1
    acc.n["rebuilt"] += 1
    by_hash = {r.got_hash: r.context for r in results}
    for s in samples:
        for h in s.context_hashes[1:]:
            ctx = by_hash[h]
            lo, hi = s.prompt_len, ctx.n_tokens
            if tuple(s.loss_mask[lo:hi]) != tuple(ctx.loss_mask[lo:hi]):
                i = next(i for i in range(lo, hi) if s.loss_mask[i] != ctx.loss_mask[i])
                role = ctx.rendered.roles[i] if i < len(ctx.rendered.roles) else "?"
                acc.fail("record", p, f"sample {s.sample_index}",
                         f"loss mask {s.loss_mask[i]} at token {i} but the renderer marks it {ctx.loss_mask[i]} (role {role})")
                ok = False
                break
    return ok


def _check_rewards(p: str, path: Path, end: EpisodeEnd | None, acc: _Acc) -> None:
    acc.checked["rewards"] += 1
    if end is None:
        acc.fail("rewards", p, "episode", "no EpisodeEnd: reward and its provenance are unknown (would read as a silent 0)")
        return
    where = f"seq {end.seq}"
    raw = [obj for _, obj in _raw_end_lines(path)]
    if raw and "reward_kind" not in raw[-1]:
        acc.fail("rewards", p, where, "EpisodeEnd does not state reward_kind (a reader would default it)")
        return
    if end.reward_kind == "scored" and end.reward is None:
        acc.fail("rewards", p, where, "reward_kind 'scored' but no reward value")
    elif end.reward_kind == "unscored" and end.reward is not None:
        acc.fail("rewards", p, where, f"reward {end.reward} recorded with reward_kind 'unscored'")
    elif end.reward_kind == "scored" and end.outcome == "truncated":
        acc.fail("rewards", p, where, f"a 'scored' reward {end.reward} on a truncated episode (cause {end.cause!r}): "
                 "use length_truncation / limit_truncation so the cut is not read as the task's score")
    elif end.reward_kind.endswith("_truncation") and end.outcome != "truncated":
        acc.fail("rewards", p, where, f"reward_kind {end.reward_kind!r} but outcome {end.outcome!r}")


_NON_TRIVIAL = (("temperature", 1.0), ("top_p", 1.0), ("top_k", 0), ("min_p", 0.0))


def _check_distributions(p: str, start: EpisodeStart | None, steps: Sequence[Step], acc: _Acc) -> None:
    default_sampling = dict(start.sampler) if start is not None else {}
    for s in steps:
        if is_offline_step(s):  # no sampler, no policy version: nothing was sampled (checked in `record`)
            continue
        acc.checked["distributions"] += 1
        where = f"seq {s.seq}"
        problems = []
        if s.logprobs is not None and not s.logprob_kind:
            problems.append("log-probs without logprob_kind (raw / processed / recomputed?)")
        if s.raw_logprobs is not None and s.logprob_kind != "processed":
            problems.append(f"raw_logprobs kept beside logprob_kind {s.logprob_kind!r} (expected 'processed')")
        sampling = {**default_sampling, **dict(s.sampling)}
        if "temperature" not in sampling:
            problems.append("no sampling config (temperature, top_p, ...) on the step or in EpisodeStart.sampler")
        if s.policy_version is None:
            problems.append("no policy_version: old vs current policy cannot be told apart")
        if problems:
            acc.fail("distributions", p, where, "; ".join(problems))
        elif s.logprob_kind == "raw":
            active = [k for k, neutral in _NON_TRIVIAL if sampling.get(k) not in (None, neutral, -1)]
            if active:
                acc.warn("distributions", p, where, f"raw log-probs but sampling used {', '.join(active)}: "
                         "importance ratios against them are biased (see rl_math.behaviour_logprobs)")


def _check_ends(p: str, end: EpisodeEnd | None, steps: Sequence[Step], acc: _Acc) -> None:
    acc.checked["ends"] += 1
    if end is None:
        acc.fail("ends", p, "episode", "no EpisodeEnd: terminated vs truncated is unknown")
        return
    where = f"seq {end.seq}"
    if not end.cause:  # the outcome itself is a closed vocabulary, checked when the event is read
        acc.fail("ends", p, where, f"{end.outcome} without a cause")
    elif end.outcome == "terminated" and end.cause in LIMIT_CAUSES:
        acc.fail("ends", p, where, f"cause {end.cause!r} is an external limit but the outcome is 'terminated' (should be 'truncated', and bootstrap)")
    elif end.outcome == "terminated" and steps and steps[-1].finish_reason == "length" and end.reward_kind == "scored":
        acc.fail("ends", p, where, f"last step (seq {steps[-1].seq}) was cut by max tokens (finish_reason 'length') "
                 f"but the episode is recorded as terminated ({end.cause!r}) with a scored reward")


def _check_resume(p: str, path: Path, events: Sequence[Event], start: EpisodeStart | None, steps: Sequence[Step], acc: _Acc) -> None:
    offline_only = bool(steps) and all(is_offline_step(s) for s in steps)  # a saved trajectory: nothing to resume
    acc.checked["resume"] += 0 if offline_only else 1
    problems = resume_problems(path, events, start, steps)
    for msg in problems[:1]:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        if offline_only:
            acc.warn("resume", p, "episode", f"offline log (not resumable): {msg}{more}")
        else:
            acc.fail("resume", p, "episode", msg + more)


def _timing_seconds(step: Step) -> float | None:
    t = step.timings
    if not t:
        return None
    for key in ("generate_s", "generate"):
        if key in t:
            return float(t[key])
    parts = [float(t[k]) for k in ("prefill_s", "decode_s", "prefill", "decode") if k in t]
    return sum(parts) if parts else None


def _count_figures(events: Sequence[Event], steps: Sequence[Step], end: EpisodeEnd | None, acc: _Acc, trained_at: int | None) -> None:
    acc.n["episodes"] += 1
    acc.n["steps"] += len(steps)
    acc.n["generated_tokens"] += sum(len(s.token_ids) for s in steps)
    timed = [(s, _timing_seconds(s)) for s in steps]
    for s, secs in timed:
        if secs is not None:
            acc.floats["generation_s"] += secs
            acc.n["timed_tokens"] += len(s.token_ids)
    stamps = [e.ts for e in events if e.ts is not None]
    if len(stamps) >= 2:
        acc.floats["wall_s"] += max(stamps) - min(stamps)
    acc.n["aborted_steps"] += sum(1 for s in steps if s.finish_reason == "abort")
    results = [e for e in events if isinstance(e, ToolResult)]
    acc.n["tool_results"] += len(results)
    acc.n["tool_timeouts"] += sum(1 for r in results if r.status == "timeout")
    if end is not None and end.cause in TIMEOUT_CAUSES:
        acc.n["episode_timeouts"] += 1
    acc.n["compactions"] += sum(1 for e in events if isinstance(e, Compaction))
    if trained_at is not None:
        for s in steps:
            v = s.policy_version
            if isinstance(v, int) and not isinstance(v, bool):
                acc.lags.append(trained_at - v)
            elif isinstance(v, str) and v.lstrip("-").isdigit():
                acc.lags.append(trained_at - int(v))
            else:
                acc.lag_unknown += 1


def _by_reason(counts: Counter) -> dict[str, int]:
    """The reasons counted (non-zero only), in `DRIFT_REASONS` order."""
    return {r: n for r, n in count_reasons(counts).items() if n}


def _rate(a: float, b: float) -> float | None:
    return round(a / b, 6) if b else None


def _figures(acc: _Acc, trained_at: int | None) -> dict[str, Any]:
    n, f = acc.n, acc.floats
    rebuilt = acc.n["rebuilt"] > 0  # loss-bearing tokens are known only from rebuilt samples
    out: dict[str, Any] = {
        "logs": n["logs"],
        "steps": n["steps"],
        "compactions": n["compactions"],
        "generated_tokens": n["generated_tokens"],
        "loss_tokens": n["loss_tokens"] if rebuilt else None,
        "generation_s": round(f["generation_s"], 6),
        "generated_tokens_per_s": _rate(n["timed_tokens"], f["generation_s"]),
        "wall_s": round(f["wall_s"], 6),
        "generated_tokens_per_wall_s": _rate(n["generated_tokens"], f["wall_s"]),
        "loss_tokens_per_wall_s": _rate(n["loss_tokens"], f["wall_s"]) if rebuilt else None,
        "tool_timeout_rate": _rate(n["tool_timeouts"], n["tool_results"]),
        "episode_timeout_rate": _rate(n["episode_timeouts"], n["episodes"]),
        "abort_rate": _rate(n["aborted_steps"], n["steps"]),
        "discard_rate": _rate(n["discarded"], n["logs"]),
        "offline_logs": len(acc.offline),
        "special_tokens_in_content": n["special_tokens_in_content"],
        "special_tokens_in_content_by_log": dict(acc.specials),
        "samples": n["samples"] if rebuilt else None,
        "sample_splits": sum(acc.splits.values()) if rebuilt else None,
        "sample_splits_by_reason": _by_reason(acc.splits) if rebuilt else None,
        "drifts": sum(acc.drifts.values()) if rebuilt else None,
        "drifts_by_reason": _by_reason(acc.drifts) if rebuilt else None,
    }
    if trained_at is not None:
        lags = acc.lags
        out["policy_lag"] = {
            "trained_at": trained_at,
            "steps_known": len(lags),
            "steps_unknown": acc.lag_unknown,
            "mean": round(sum(lags) / len(lags), 6) if lags else None,
            "max": max(lags) if lags else None,
            "by_lag": {str(k): v for k, v in sorted(Counter(lags).items())},
        }
    return out
