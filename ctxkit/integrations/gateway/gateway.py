"""The recording gateway without HTTP: requests in, recorded steps and OpenAI answers out.

`Gateway.chat(request)` finds the request's episode, records its messages (`GatewayEpisode.ingest`), builds
the context with ctxkit, asks the engine for the next turn through `OpenAIAgent` (token ids to a vLLM-style
`/v1/completions`, or the llama.cpp dialect: the context's text with its tokenization checked), records the
`Step` and returns the `chat.completion` answer. Every failure is a `GatewayError` carrying the HTTP status
to answer with; a refused request appends nothing.

Finding the episode: the `X-Ctxkit-Episode` header or `metadata.ctxkit_episode` names it (a new name starts
a new episode). Without a name, among the idle open episodes: the one whose whole recorded history is the
longest prefix of the request continues; else (the harness rewrote its history) the one that sampled the
most of the request's assistant messages, or, when none did, the one sharing the longest prefix with the
request, if that prefix holds the task (the first message after the system ones) and the request adds
something after it (mini-swe-agent drops a turn it rejects for its format, then adds its complaint); else
a new episode starts (so does a request that repeats only the start of an episode: a new attempt). Ties go
to the most recently active episode. Identical episodes run side by side without names can be told apart
only by that order: name them when it matters.

Bounds: at most `max_episodes` open episodes (HTTP 429 beyond); one request at a time per episode (409
for a second); `reap_idle` ends episodes idle for `idle_timeout_s` as `truncated`/`idle_timeout`, and
`close` ends the rest as `truncated`/`gateway_shutdown`, so no log is left without its typed end.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ctxkit.context.builder import ContextBuilder
from ctxkit.errors import (BudgetError, CtxkitError, EventFormatError, GatewayError, LogLockedError,
                           MessageFormatError)
from ctxkit.events import EpisodeEnd
from ctxkit.experiment.agents.base import to_step
from ctxkit.experiment.agents.openai_http import OpenAIAgent
from ctxkit.experiment.agents.openai_wire import OpenAIHTTPError, OpenAITimeoutError
from ctxkit.integrations.gateway.episode import GatewayEpisode, checked_events
from ctxkit.integrations.gateway.history import chain, fingerprint, request_events, view_messages
from ctxkit.integrations.gateway.wire import ChatRequest, chat_response
from ctxkit.text.tokenizer.loader import load_tokenizer

__all__ = ["Gateway", "GatewayConfig", "EngineSpec"]


def _shared(a: list[str], b: list[str]) -> int:
    """How many leading messages two histories share, from their `chain` digests."""
    n = 0
    while n + 1 < len(a) and n + 1 < len(b) and a[n + 1] == b[n + 1]:
        n += 1
    return n


@dataclass(frozen=True)
class EngineSpec:
    """The engine behind the gateway: any OpenAI-compatible server."""

    base_url: str
    """Server root, e.g. `http://127.0.0.1:8000`."""
    model: str
    """Served model name."""
    dialect: str = "vllm"
    """`vllm` (token ids to `/v1/completions`; SGLang too) or `llama-cpp` (text prompts, tokenization checked)."""
    timeout_s: float = 120.0
    """Seconds to wait for one engine answer (then HTTP 504)."""
    policy_version: str | int | None = None
    """Recorded on every step (default: the model name)."""
    api_key_env: str | None = None
    """Environment variable holding the engine's bearer token."""


@dataclass(frozen=True)
class GatewayConfig:
    """How episodes are recorded and contexts built."""

    out_dir: Path
    """Folder of the episode logs (`<out_dir>/<episode id>.jsonl`)."""
    tokenizer: str
    """Tokenizer spec of the policy (must be the engine model's)."""
    template: str | None = None
    """Chat template spec (None: the tokenizer's own)."""
    record_only: bool = False
    """Pass the harness's history through untouched: keep-all, no pins (compressor settings ignored)."""
    compressor: str = "keep-all"
    """Registered compressor building the policy's contexts."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Compressor parameters."""
    budget: int = 32_768
    """Token budget of a built context."""
    reserve_tokens: int = 0
    """Tokens of the budget kept for the response."""
    detect_pins: bool = True
    """Run the constraint detector (pins), unless `record_only`."""
    temperature: float = 1.0
    """Sampling temperature when a request gives none."""
    top_p: float = 1.0
    """Nucleus mass when a request gives none."""
    max_tokens: int = 256
    """Tokens sampled at most when a request gives none."""
    idle_timeout_s: float = 600.0
    """An episode without a request for this long ends `truncated`/`idle_timeout`."""
    max_episodes: int = 64
    """Open episodes at most (HTTP 429 beyond)."""


class Gateway:
    """Records harness requests as episodes (see the module docstring); thread-safe."""

    def __init__(self, config: GatewayConfig, engine: EngineSpec):
        self.config = config
        self.engine = engine
        self.tokenizer = load_tokenizer(config.tokenizer)
        """The policy's tokenizer, loaded once."""
        Path(config.out_dir).mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._open: dict[str, GatewayEpisode] = {}
        self._ended: dict[str, str] = {}  # episode id -> its log path
        self._counter = 0
        self._started = time.strftime("%Y%m%dT%H%M%S")
        self._builder()  # a bad tokenizer, template or compressor fails here, before any request

    # ------------------------------------------------------------------------------------ episodes

    def _builder(self) -> ContextBuilder:
        c = self.config
        if c.record_only:
            return ContextBuilder(self.tokenizer, c.template, "keep-all", c.budget, detect_pins=False,
                                  reserve_tokens=c.reserve_tokens)
        return ContextBuilder(self.tokenizer, c.template, c.compressor, c.budget, dict(c.params),
                              detect_pins=c.detect_pins, reserve_tokens=c.reserve_tokens)

    def _new_episode(self, episode_id: str | None, request: ChatRequest) -> GatewayEpisode:
        if len(self._open) >= self.config.max_episodes:
            raise GatewayError(f"{len(self._open)} episodes are open, the most this gateway keeps (--max-episodes "
                               f"{self.config.max_episodes}); end some first", status=429, code="too_many_episodes")
        if episode_id is None:
            self._counter += 1
            episode_id = f"gw-{self._started}-{self._counter:05d}"
        path = Path(self.config.out_dir) / f"{episode_id}.jsonl"
        if path.exists():
            raise GatewayError(f"episode {episode_id}: its log {path} already exists", status=409,
                               code="episode_exists")
        sampler = {"engine": self.engine.base_url, "model": self.engine.model, "dialect": self.engine.dialect,
                   "step_seed": "int(sha256('<episode>:<step>')[:8], 16) unless the request gives a seed"}
        meta = {"gateway": {"record_only": self.config.record_only, "request_model": request.model}}
        try:
            episode = GatewayEpisode(episode_id, path, self._builder(), tools=request.tools, sampler=sampler,
                                     metadata=meta)
        except (LogLockedError, FileExistsError) as exc:
            raise GatewayError(f"episode {episode_id}: {exc}", status=409, code="episode_exists") from None
        self._open[episode_id] = episode
        return episode

    def _claim(self, request: ChatRequest) -> GatewayEpisode:
        """The request's episode, marked busy (created when new)."""
        with self._lock:
            if request.episode_id is not None:
                if request.episode_id in self._ended:
                    raise GatewayError(f"episode {request.episode_id} has ended", status=409, code="episode_ended")
                episode = self._open.get(request.episode_id) or self._new_episode(request.episode_id, request)
            else:
                episode = self._find(request) or self._new_episode(None, request)
            if episode.busy:
                raise GatewayError(f"episode {episode.episode_id}: a request is already running on it", status=409,
                                   code="episode_busy")
            episode.busy = True
            return episode

    def _find(self, request: ChatRequest) -> GatewayEpisode | None:
        """The idle episode a request without a name continues (see the module docstring), or None."""
        messages = view_messages(request_events(request.messages))
        fps = [fingerprint(m) for m in messages]
        digests = chain(fps)
        idle = [e for e in self._open.values() if not e.busy]
        extended = [e for e in idle if len(e.history) < len(digests) and digests[len(e.history)] == e.digest]
        if extended:
            return max(extended, key=lambda e: (len(e.history), e.last_active))
        sampled = {fp for fp, m in zip(fps, messages) if m.role == "assistant"}
        task_at = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
        best, best_key = None, None
        for e in idle:
            shared = _shared(digests, e.prefix_digests)
            matched = len(e.step_fingerprints & sampled)
            if not matched and not task_at < shared < len(fps):
                continue  # neither its sampled turns nor its task with something new after it
            key = (matched, shared, e.last_active)
            if best_key is None or key > best_key:
                best, best_key = e, key
        return best

    def _release(self, episode: GatewayEpisode) -> None:
        with self._lock:
            episode.busy = False
            episode.last_active = time.monotonic()

    # ------------------------------------------------------------------------------------ requests

    def chat(self, request: ChatRequest) -> dict[str, Any]:
        """Record the request, sample the next turn, record it; the `chat.completion` answer."""
        checked_events(request.messages)  # a malformed request creates no episode
        episode = self._claim(request)
        try:
            return self._chat(episode, request)
        finally:
            self._release(episode)

    def _chat(self, episode: GatewayEpisode, request: ChatRequest) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            episode.ingest(request.messages, request.tools)
            t1 = time.perf_counter()
            ctx = episode.context()
        except BudgetError as exc:
            raise GatewayError(f"episode {episode.episode_id}: {exc}", status=400, param="messages",
                               code="context_length_exceeded") from None
        except MessageFormatError as exc:
            raise GatewayError(f"episode {episode.episode_id}: {exc}", status=400, param="messages") from None
        except GatewayError:
            raise
        except CtxkitError as exc:
            raise GatewayError(f"episode {episode.episode_id}: {type(exc).__name__}: {exc}", status=500) from None
        t2 = time.perf_counter()
        agent = self._agent(request)
        seed = request.seed if request.seed is not None else episode.step_seed()
        try:
            turn = agent.act(ctx, tools=request.tools, seed=seed)
        except OpenAITimeoutError as exc:
            raise GatewayError(f"engine timeout: {exc}", status=504, code="engine_timeout") from None
        except OpenAIHTTPError as exc:
            raise GatewayError(f"engine failed: {exc}", status=502, code="engine_error") from None
        t3 = time.perf_counter()
        timings = {"ingest_s": t1 - t0, "build_s": t2 - t1, "generate_s": float(turn.timings.get("generate_s", t3 - t2))}
        step = episode.record_step(to_step(turn, ctx, timings=timings))
        return chat_response(step, episode_id=episode.episode_id, model=self.engine.model, created=int(time.time()))

    def _agent(self, request: ChatRequest) -> OpenAIAgent:
        c, e = self.config, self.engine
        return OpenAIAgent(base_url=e.base_url, model=e.model, tokenizer=self.tokenizer, dialect=e.dialect,
                           temperature=c.temperature if request.temperature is None else request.temperature,
                           top_p=c.top_p if request.top_p is None else request.top_p,
                           max_tokens=request.max_tokens or c.max_tokens, timeout_s=e.timeout_s, on_timeout="raise",
                           policy_version=e.policy_version, api_key_env=e.api_key_env)

    # ------------------------------------------------------------------------------------ ends

    def end(self, episode_id: str, fields: Mapping[str, Any]) -> dict[str, Any]:
        """End an open episode with `EpisodeEnd(**fields)`; 404 unknown, 409 ended or busy, 400 a bad field."""
        try:
            end = EpisodeEnd(**fields)
        except EventFormatError as exc:
            raise GatewayError(str(exc), status=400, param=exc.field) from None
        with self._lock:
            episode = self._open.get(episode_id)
            if episode is None:
                if episode_id in self._ended:
                    raise GatewayError(f"episode {episode_id} has already ended", status=409, code="episode_ended")
                raise GatewayError(f"no episode {episode_id!r}", status=404, code="episode_not_found")
            if episode.busy:
                raise GatewayError(f"episode {episode_id}: a request is running on it", status=409, code="episode_busy")
            del self._open[episode_id]
            self._ended[episode_id] = str(episode.log.path)
        recorded = episode.end(end)
        return {"episode_id": episode_id, "log": str(episode.log.path), "steps": episode.n_steps,
                "harness_compactions": episode.n_splits, "outcome": recorded.outcome, "cause": recorded.cause}

    def reap_idle(self, now: float | None = None) -> list[str]:
        """End every idle episode past `idle_timeout_s` as `truncated`/`idle_timeout`; their ids."""
        now = time.monotonic() if now is None else now
        with self._lock:
            stale = [e for e in self._open.values() if not e.busy and now - e.last_active >= self.config.idle_timeout_s]
        done = []
        for e in stale:
            try:
                self.end(e.episode_id, {"outcome": "truncated", "cause": "idle_timeout", "reward_kind": "limit_truncation",
                                        "scores": {"idle_timeout_s": self.config.idle_timeout_s}})
                done.append(e.episode_id)
            except GatewayError:
                pass  # a request claimed it meanwhile
        return done

    def close(self) -> list[str]:
        """End every open episode as `truncated`/`gateway_shutdown` (waits for running requests); their ids."""
        done = []
        while True:
            with self._lock:
                idle = [e.episode_id for e in self._open.values() if not e.busy]
                running = len(self._open) - len(idle)
            for episode_id in idle:
                try:
                    self.end(episode_id, {"outcome": "truncated", "cause": "gateway_shutdown",
                                          "reward_kind": "limit_truncation"})
                    done.append(episode_id)
                except GatewayError:
                    pass
            if not running:
                return done
            time.sleep(0.05)

    def episodes(self) -> dict[str, Any]:
        """Open and ended episodes: id -> {open, steps, log}."""
        with self._lock:
            out = {i: {"open": True, "steps": e.n_steps, "harness_compactions": e.n_splits, "log": str(e.log.path)}
                   for i, e in self._open.items()}
            out.update({i: {"open": False, "log": p} for i, p in self._ended.items()})
        return out
