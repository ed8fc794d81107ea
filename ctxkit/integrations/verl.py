"""verl glue: an agent loop for verl 0.9 (`verl.experimental.agent_loop`) whose contexts ctxkit builds.

Written against verl 0.9.1 (`verl/experimental/agent_loop/agent_loop.py`: `AgentLoopBase`, `AgentLoopOutput`,
the `_agent_loop_registry` filled from `rollout.agent.agent_loop_config_path`; `verl/workers/rollout/replica.py`:
`TokenOutput`; `verl/workers/rollout/llm_server.py`: `LLMServerClient.generate`). docs/TRAINING.md, "verl",
says how to plug it in and what runs on CPU.

**The loop.** verl's `AgentLoopWorker` builds one agent loop per dataset row (`hydra.utils.instantiate` of the
registered config, with the server manager, verl's tokenizer and the trainer config) and awaits
`run(sampling_params, **row)`. `CtxkitAgentLoop.run` runs one ctxkit tool episode with the same machinery as
the TRL glue (`ctxkit.integrations.trl.run_tool_episode`): every context built by a `ContextBuilder`
(compressor, budget, pins), every event logged in an `EventLog` under `out_dir`. Each turn samples through
verl's server manager (`ServerManagerAgent`): the built context's token ids go in as `prompt_ids`, the sampled
ids and their log-probs come back (`TokenOutput`), and the turn is recorded as a ctxkit `Step`. The finished
log is replayed and hash-checked into training samples (`ctxkit.training.episode_samples.samples`) and the
sample is returned as verl's `AgentLoopOutput` (`sample_fields`): `prompt_ids` = the first step's context,
`response_ids` = everything after it (sampled turns, tool results, scaffold), `response_mask` = ctxkit's loss
mask there (1 exactly on sampled tokens), `response_logprobs` = the behaviour log-probs on sampled tokens and
0.0 elsewhere (verl's own tool loop puts 0.0 on tool tokens; the mask keeps them out of every loss).

**Several samples.** An `AgentLoopOutput` holds one prompt and one response. An episode whose history a
compaction rewrote gives several samples (a later context does not extend the earlier tokens):
`on_split="error"` (default) refuses it naming the step; `"last"` returns the last sample only (its prompt is
the compacted context; the earlier samples' tokens are not trained on, never mislabelled) and says how many
were left out in `extra_fields["ctxkit_samples"]`.

**Registration.** No import side effect: name the class in verl's agent loop config file (the
`rollout.agent.agent_loop_config_path` YAML), its keys being `CtxkitAgentLoop`'s arguments:

    - name: ctxkit
      _target_: ctxkit.integrations.verl.CtxkitAgentLoop
      task: needle-recall
      compressor: mask-observations
      budget: 2048
      out_dir: /data/ctxkit-episodes

`CtxkitAgentLoop` subclasses verl's `AgentLoopBase`, so verl is imported the first time the name is looked up
(module `__getattr__`); the pure mapping (`sample_fields`, `episode_fields`, `turn_from_tokens`) never imports it.
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ctxkit.context.builder import ContextBuilder
from ctxkit.errors import ConfigError
from ctxkit.events import Message, Step, ToolResult
from ctxkit.experiment.agents.base import AgentTurn
from ctxkit.experiment.agents.parsing import end_of_turn_ids, parse_ids, turn_call_seed
from ctxkit.experiment.tasks.base import make_task
from ctxkit.integrations.trl import SPLIT_POLICIES, one_sample_or_last, run_tool_episode
from ctxkit.log.event_log import read_events
from ctxkit.text.tokenizer.loader import load_tokenizer
from ctxkit.training.episode_samples import TrainingSample, samples

__all__ = ["VerlFields", "ServerManagerAgent", "sample_fields", "episode_fields", "turn_from_tokens", "task_seed",
           "to_output", "CtxkitAgentLoop"]

LOGPROB_KINDS_IN: tuple[str, ...] = ("processed", "raw")
"""What the server's log-probs can be: verl's vLLM server returns what `rollout.logprobs_mode` says."""


@dataclass(frozen=True)
class VerlFields:
    """The fields of one verl `AgentLoopOutput`, from one ctxkit training sample (no verl import needed)."""

    prompt_ids: tuple[int, ...]
    """The first step's context: exactly what the policy saw before its first sampled token."""
    response_ids: tuple[int, ...]
    """Every token after the prompt: sampled turns, tool results and template scaffold, in order."""
    response_mask: tuple[int, ...]
    """Per response token: 1 where the policy sampled it (ctxkit's loss mask), 0 on tool output and scaffold."""
    response_logprobs: tuple[float, ...] | None
    """Behaviour log-prob per response token on sampled tokens, 0.0 elsewhere; None when a sampled token has none."""
    reward_score: float | None
    """The episode's reward (None when unscored or cut by a limit: verl's reward loop scores it then)."""
    num_turns: int
    """Messages of the episode, as verl counts turns: opening messages, assistant steps and tool results."""
    extra_fields: Mapping[str, Any]
    """`ctxkit_*` facts verl carries along: log path, episode id, reward kind, samples, log-prob kinds."""
    tool_s: float = 0.0
    """Seconds the episode's tools ran (sum of `ToolResult.duration_s`): verl's `tool_calls` metric."""


def sample_fields(sample: TrainingSample, *, log: str = "", num_turns: int = 0, n_samples: int = 1,
                  tool_s: float = 0.0) -> VerlFields:
    """Split `sample` at its prompt into verl's prompt/response/mask/log-prob fields.

    `ConfigError` naming the episode and sample when the prompt leaves no response or holds a sampled token."""
    k = sample.prompt_len
    where = f"episode {sample.episode_id!r} sample {sample.sample_index}"
    if k < 1 or k >= len(sample.token_ids):
        raise ConfigError(f"{where}: prompt length {k} leaves no response in {len(sample.token_ids)} tokens")
    if any(sample.loss_mask[:k]):
        raise ConfigError(f"{where}: a prompt token is marked sampled")
    mask = tuple(int(m) for m in sample.loss_mask[k:])
    lps = sample.logprobs[k:]
    missing = any(m and lp is None for m, lp in zip(mask, lps))
    logprobs = None if missing else tuple(float(lp) if m else 0.0 for m, lp in zip(mask, lps))
    return VerlFields(
        prompt_ids=tuple(sample.token_ids[:k]),
        response_ids=tuple(sample.token_ids[k:]),
        response_mask=mask,
        response_logprobs=logprobs,
        reward_score=sample.reward,
        num_turns=num_turns,
        extra_fields={"ctxkit_log": log, "ctxkit_episode_id": sample.episode_id, "ctxkit_reward_kind": sample.reward_kind,
                      "ctxkit_samples": n_samples, "ctxkit_sample_index": sample.sample_index,
                      "ctxkit_logprob_kinds": ",".join(sorted({k or "none" for k in sample.logprob_kinds}))},
        tool_s=float(tool_s),
    )


def episode_fields(log_path: str | Path, *, on_split: str = "error") -> VerlFields:
    """verl's output fields of one logged episode (replayed and hash-checked by `samples`)."""
    if on_split not in SPLIT_POLICIES:
        raise ConfigError(f"on_split={on_split!r}: expected one of {list(SPLIT_POLICIES)}")
    events = read_events(log_path)
    got = samples(events)
    last = one_sample_or_last(got, log_path, on_split, "a verl AgentLoopOutput holds one prompt and one response")
    turns = sum(isinstance(e, (Message, Step, ToolResult)) for e in events)
    tool_s = sum(e.duration_s or 0.0 for e in events if isinstance(e, ToolResult))
    return sample_fields(last, log=str(log_path), num_turns=turns, n_samples=len(got), tool_s=tool_s)


def turn_from_tokens(token_ids: Sequence[int], log_probs: Sequence[float] | None, stop_reason: str | None, *,
                     tokenizer: Any, max_tokens: int, sampling: Mapping[str, Any], logprob_kind: str,
                     call_id_seed: str = "", policy_version: str | int | None = None,
                     timings: Mapping[str, float] | None = None) -> AgentTurn:
    """A ctxkit `AgentTurn` from what verl's `generate` returned (`TokenOutput` fields).

    The ids are kept up to and including the first end-of-turn id (vLLM returns the end token; llama.cpp does
    not report it, and the template closes the turn); the log-probs are cut with them. Finish reason: `abort`
    when verl says `aborted`, `stop` at an end-of-turn id, `length` when `max_tokens` ids came back without one,
    else `stop` (the engine stopped on an end token it did not return). `ConfigError` when log-probs and ids
    do not align."""
    if logprob_kind not in LOGPROB_KINDS_IN:
        raise ConfigError(f"logprob_kind={logprob_kind!r}: expected one of {list(LOGPROB_KINDS_IN)}")
    ids = [int(t) for t in token_ids]
    if log_probs is not None and len(log_probs) != len(ids):
        raise ConfigError(f"server manager generate: {len(log_probs)} log-probs for {len(ids)} token ids")
    parsed = parse_ids(ids, lambda xs: tokenizer.decode(list(xs)), end_ids=end_of_turn_ids(tokenizer),
                       call_id_seed=call_id_seed)
    kept = parsed.token_ids
    if stop_reason == "aborted":
        finish = "abort"
    elif parsed.stopped:
        finish = "stop"
    elif len(ids) >= max_tokens:
        finish = "length"
    else:
        finish = "stop"
    if finish == "stop" and parsed.tool_calls:
        finish = "tool_calls"
    lps = None if log_probs is None else tuple(float(x) for x in log_probs[: len(kept)])
    return AgentTurn(token_ids=kept, content=parsed.content, tool_calls=parsed.tool_calls, finish_reason=finish,
                     logprobs=lps, logprob_kind=logprob_kind if lps is not None else None,
                     sampling=dict(sampling), policy_version=policy_version, timings=dict(timings or {}),
                     reasoning_content=parsed.reasoning_content)


def task_seed(row: Mapping[str, Any]) -> int:
    """The task seed of a verl dataset row: `extra_info["seed"]`, else `index` (`ConfigError` naming the keys)."""
    extra = row.get("extra_info")
    for value in ((extra or {}).get("seed") if isinstance(extra, Mapping) else None, row.get("index")):
        if value is not None and not isinstance(value, bool) and int(value) == value:
            return int(value)
    raise ConfigError(f"verl dataset row (keys {sorted(row)}): no task seed; give each row extra_info.seed (an int) "
                      "or an index")


class ServerManagerAgent:
    """A ctxkit agent sampling through verl's server manager (`generate(request_id, *, prompt_ids, sampling_params)`).

    `act` runs in a worker thread (ctxkit's episode loop is synchronous) and awaits `generate` on `loop`, the
    agent loop's event loop. The request's sampling params are verl's plus `max_tokens` and the step's `seed`."""

    def __init__(self, server_manager: Any, loop: asyncio.AbstractEventLoop, *, tokenizer: Any,
                 sampling_params: Mapping[str, Any], max_tokens: int, logprob_kind: str = "processed",
                 request_id: str = "", policy_version: str | int | None = None):
        """Bind the server manager and the event loop it lives on; `sampling_params` as verl passed them."""
        if not (isinstance(max_tokens, int) and max_tokens >= 1):
            raise ConfigError(f"max_tokens={max_tokens!r}: must be an integer >= 1")
        if logprob_kind not in LOGPROB_KINDS_IN:
            raise ConfigError(f"logprob_kind={logprob_kind!r}: expected one of {list(LOGPROB_KINDS_IN)}")
        self.server_manager, self.loop, self.tokenizer = server_manager, loop, tokenizer
        self.sampling_params = {**dict(sampling_params), "max_tokens": max_tokens}
        self.max_tokens, self.logprob_kind = max_tokens, logprob_kind
        self.request_id = request_id or uuid.uuid4().hex
        self.policy_version = policy_version
        self.name = "verl-server-manager"
        self.generate_s = 0.0
        """Seconds spent in `generate`, summed over the episode (verl's `generate_sequences` metric)."""

    def act(self, context: Any, *, tools: Any = (), seed: int) -> AgentTurn:
        """Sample the next turn after `context.token_ids` through the server manager."""
        params = {**self.sampling_params, "seed": int(seed)}
        t0 = time.perf_counter()
        out = asyncio.run_coroutine_threadsafe(self.server_manager.generate(
            request_id=self.request_id, prompt_ids=list(context.token_ids), sampling_params=dict(params)), self.loop).result()
        spent = time.perf_counter() - t0
        self.generate_s += spent
        version = self.policy_version
        if version is None:  # verl's servers stamp each answer with the trainer step of their weights
            version = (getattr(out, "extra_fields", None) or {}).get("global_steps")
        return turn_from_tokens(out.token_ids, out.log_probs, out.stop_reason, tokenizer=self.tokenizer,
                                max_tokens=self.max_tokens, sampling=params, logprob_kind=self.logprob_kind,
                                call_id_seed=turn_call_seed(context.hash, seed), policy_version=version,
                                timings={"generate_s": spent})

    def close(self) -> None:
        """Nothing to release: the server manager belongs to verl."""


# ------------------------------------------------------------------------------ the verl class


def __getattr__(name: str) -> Any:
    """`CtxkitAgentLoop`, built (and verl imported) on first lookup."""
    if name == "CtxkitAgentLoop":
        return _agent_loop_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _agent_loop_class() -> type:
    """Define `CtxkitAgentLoop` on verl's `AgentLoopBase` (once per process)."""
    # lazy: verl (and torch, ray) only when the loop class is looked up
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

    class CtxkitAgentLoop(AgentLoopBase):
        """A verl agent loop running one ctxkit tool episode per dataset row (module docstring).

        Keys of its agent loop config entry: `task` (a ctxkit task name), `out_dir` (where episode logs go),
        and optionally `task_params`, `ctxkit_tokenizer` (a ctxkit tokenizer spec; default verl's tokenizer's
        `name_or_path`; its ids must be the served model's), `template`, `compressor`, `budget`, `params`
        (compressor params), `pins`, `max_steps`, `max_new_tokens` (per turn), `logprob_kind` (what the
        server's log-probs are), `on_split`."""

        def __init__(self, *args: Any, task: str, out_dir: str, task_params: Mapping[str, Any] | None = None,
                     ctxkit_tokenizer: str | None = None, template: str | None = "chatml-tools-v1",
                     compressor: str = "keep-all",
                     budget: int = 4096, params: Mapping[str, Any] | None = None, pins: bool = False,
                     max_steps: int = 4, max_new_tokens: int = 256, logprob_kind: str = "processed",
                     on_split: str = "error", **kwargs: Any):
            """verl's arguments go to `AgentLoopBase`; the ctxkit ones build the task and the context builder."""
            super().__init__(*args, **kwargs)
            if on_split not in SPLIT_POLICIES:
                raise ConfigError(f"CtxkitAgentLoop: on_split={on_split!r}: expected one of {list(SPLIT_POLICIES)}")
            if not (isinstance(max_steps, int) and max_steps >= 1):
                raise ConfigError(f"CtxkitAgentLoop: max_steps={max_steps!r}: must be an integer >= 1")
            spec = ctxkit_tokenizer or getattr(self.tokenizer, "name_or_path", None)
            if not spec:
                raise ConfigError("CtxkitAgentLoop: no tokenizer spec (give `ctxkit_tokenizer:` in the agent loop config)")
            self.ctx_tokenizer = load_tokenizer(str(spec))
            self.task = make_task(task, _plain(task_params), where="CtxkitAgentLoop")
            self.builder = ContextBuilder(self.ctx_tokenizer, template, compressor, budget, _plain(params), detect_pins=pins)
            self.out_dir = Path(out_dir)
            self.max_steps, self.max_new_tokens = max_steps, max_new_tokens
            self.logprob_kind, self.on_split = logprob_kind, on_split

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            """One logged ctxkit episode of the row's task seed, returned as verl's `AgentLoopOutput`."""
            seed = task_seed(kwargs)
            loop = asyncio.get_running_loop()
            agent = ServerManagerAgent(self.server_manager, loop, tokenizer=self.ctx_tokenizer,
                                       sampling_params=sampling_params, max_tokens=self.max_new_tokens,
                                       logprob_kind=self.logprob_kind)
            episode_id = f"{self.task.name}-{seed}-{agent.request_id[:8]}"
            path = self.out_dir / f"{episode_id}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="ctxkit-verl-") as workdir:
                await loop.run_in_executor(None, functools.partial(
                    run_tool_episode, path, task=self.task, seed=seed, builder=self.builder, agent=agent,
                    max_steps=self.max_steps, episode_id=episode_id, workdir=workdir))
            fields = await loop.run_in_executor(None, functools.partial(episode_fields, path, on_split=self.on_split))
            return to_output(AgentLoopOutput, fields, self.rollout_config,
                             metrics={"generate_sequences": agent.generate_s, "tool_calls": fields.tool_s})

    CtxkitAgentLoop.__module__, CtxkitAgentLoop.__qualname__ = __name__, "CtxkitAgentLoop"
    return CtxkitAgentLoop


def to_output(output_cls: type, fields: VerlFields, rollout_config: Any, *, metrics: Mapping[str, float]) -> Any:
    """`output_cls` (verl's `AgentLoopOutput`) from `fields`; `ConfigError` when the prompt or response is longer
    than `rollout.prompt_length` / `rollout.response_length` (verl would cut them; ctxkit refuses to)."""
    for name, got, limit in (("prompt", fields.prompt_ids, rollout_config.prompt_length),
                             ("response", fields.response_ids, rollout_config.response_length)):
        if len(got) > int(limit):
            raise ConfigError(f"{fields.extra_fields.get('ctxkit_log')}: {name} of {len(got)} tokens exceeds "
                              f"rollout.{name}_length={limit}; lower the ctxkit budget/max_steps or raise the limit")
    return output_cls(prompt_ids=list(fields.prompt_ids), response_ids=list(fields.response_ids),
                      response_mask=list(fields.response_mask),
                      response_logprobs=None if fields.response_logprobs is None else list(fields.response_logprobs),
                      reward_score=fields.reward_score, num_turns=fields.num_turns, metrics=dict(metrics),
                      extra_fields=dict(fields.extra_fields))


def _plain(value: Any) -> Any:
    """A hydra `DictConfig`/`ListConfig` (or anything) as plain Python containers."""
    if value is None or isinstance(value, (dict, list, str, int, float, bool)):
        return value
    from omegaconf import OmegaConf  # lazy: comes with verl, only for its config values

    return OmegaConf.to_container(value, resolve=True)
