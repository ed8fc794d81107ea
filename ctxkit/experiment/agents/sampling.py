"""Sampling for the local agents: a recorded, validated config, and drawing one token from logits.

The logits -> distribution transform is `ctxkit.training.rl_math.behaviour_logprobs` (order `hf`: temperature,
then top-k, then top-p, then min-p, each renormalized over the kept set); this module does not
re-implement it. "Processed" log-probs are the log of the distribution actually sampled from; "raw"
ones the temperature-1 softmax of the unmodified logits. Temperature 0 means greedy: a point mass on the
first arg-max (log-prob 0 for the chosen token).

torch and numpy are imported inside functions only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ctxkit.errors import ConfigError


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are drawn; recorded with every step (`Step.sampling`)."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (arg-max)."""
    top_k: int = 0
    """Keep the k most likely tokens (ties at the k-th value are kept); 0 turns it off."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability reaches top_p; 1 turns it off."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the top probability; 0 turns it off."""
    max_new_tokens: int = 256
    """Most tokens one turn may sample."""

    def __post_init__(self) -> None:
        def bad(name: str, value: Any, allowed: str) -> ConfigError:
            return ConfigError(f"sampling parameter {name}={value!r} is invalid: allowed {allowed}")

        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise bad("temperature", self.temperature, "a finite number >= 0")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise bad("top_k", self.top_k, "an integer >= 0 (0 = off)")
        if not isinstance(self.top_p, (int, float)) or not (0 < self.top_p <= 1):
            raise bad("top_p", self.top_p, "a number in (0, 1]")
        if not isinstance(self.min_p, (int, float)) or not (0 <= self.min_p <= 1):
            raise bad("min_p", self.min_p, "a number in [0, 1]")
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 1:
            raise bad("max_new_tokens", self.max_new_tokens, "an integer >= 1")

    @property
    def greedy(self) -> bool:
        """True when temperature is 0 (arg-max decoding)."""
        return self.temperature == 0

    @property
    def filters(self) -> bool:
        """True when any of top-k, top-p, min-p removes tokens."""
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0

    def to_dict(self, *, seed: int | None = None) -> dict[str, Any]:
        """The JSON-able record kept in `Step.sampling` (with the per-call seed)."""
        out: dict[str, Any] = asdict(self)
        out["seed"] = seed
        return out


def processed_logprobs(logits, config: SamplingConfig, *, order: str = "hf"):
    """Log-probs (float64 numpy, vocabulary last) of the distribution sampling draws from; filtered tokens -inf.

    This is `ctxkit.training.rl_math.behaviour_logprobs` of the logits under `config` (the one implementation of
    the transforms), so what an agent records is what a trainer recomputes from the same logits and
    `Step.sampling`.
    """
    from ctxkit.training.rl_math import behaviour_logprobs  # lazy: pulls numpy

    return behaviour_logprobs(logits, config.to_dict(), order=order)


def raw_logprobs(logits):
    """Temperature-1 log-softmax of the raw logits (float64 numpy, vocabulary last)."""
    import numpy as np  # lazy: numpy loads on first use

    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def token_distributions(logits, config: SamplingConfig):
    """(processed, raw) log-prob vectors for one position's logits (float64 numpy).

    Equal to (`processed_logprobs`, `raw_logprobs`); without filters or greedy decoding, the processed
    one is computed as the temperature-scaled log-softmax directly (no sort over the vocabulary), which
    keeps the per-token cost small.
    """
    raw = raw_logprobs(logits)
    if config.greedy or config.filters:
        return processed_logprobs(logits, config), raw
    if config.temperature == 1:
        return raw, raw
    return raw_logprobs(raw / config.temperature), raw


def sample(logprobs, generator) -> int:
    """Draw one token id from a 1-D processed log-prob vector with a seeded CPU `torch.Generator`."""
    import numpy as np  # lazy: numpy loads on first use
    import torch  # lazy: torch loads on first use

    probs = torch.from_numpy(np.exp(np.asarray(logprobs, dtype=np.float64)))
    return int(torch.multinomial(probs, 1, generator=generator).item())


def make_generator(seed: int):
    """A CPU `torch.Generator` seeded with `seed`: one per call, so each call is reproducible.

    Draws happen on the CPU from float64 probabilities, so the same seed and logits give the same tokens
    whatever device ran the model.
    """
    import torch  # lazy: torch loads on first use

    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    return gen
