"""The llama.cpp dialect of the OpenAI-compatible protocol (`llama-cpp-python`'s `python -m llama_cpp.server`).

What the installed server does (read in `llama_cpp/server/types.py`, `server/app.py` and `llama.py`,
llama-cpp-python 0.3.x), and what ctxkit does about it:

- `/v1/completions` takes `prompt: str | list[str]` only (`CreateCompletionRequest.prompt`); a list of token
  ids is refused with a validation error, so ctxkit cannot send its ids. It sends the context *text*
  (`Tokenizer.decode` of the built ids, special tokens kept), which the server tokenizes with
  `Llama.tokenize(..., add_bos=False, special=True)` (`Llama._create_completion`). Before each request the
  agent asks `POST /extras/tokenize` (the same `special=True` tokenizer) for the ids the server will see
  and compares them with the context: `prompt_match`, `prompt_drift_at`, `prompt_drift_tokens`.
- The answer carries no token ids: `choices[0].text` and, with `logprobs: 0`, `logprobs.tokens` (one
  decoded piece per sampled token) and `logprobs.token_logprobs`. The agent re-tokenizes the text with the
  context tokenizer and checks the ids piece by piece against the server's pieces: `completion_drift_tokens`
  (0 when every id is confirmed); on any drift the log-probs are dropped (they would not align).
- Log-probs are **raw**: `Llama.logits_to_logprobs(self._scores)`, a log-softmax of the model's logits as
  `Llama.eval` stored them, before the sampler chain (penalties, top-k, typical, top-p, min-p, temperature)
  that `Llama._init_sampler` builds in C. Note the chain order: top-k -> typical -> top-p -> min-p ->
  temperature -> draw, so top-p is applied to the untempered distribution.
- An end-of-generation token (`llama_vocab_is_eog`) ends the loop *before* it is added to the completion:
  its id and log-prob are never returned. The turn's ids stop before it (`finish_reason="stop"`) and
  `end_token_unreported=True` says so; the chat template closes the turn in the next context.
- Server defaults differ from OpenAI's (`top_k=40`, `min_p=0.05`, `repeat_penalty=1.1`): the agent always
  sends `top_k`, `min_p` and `repeat_penalty` (0, 0.0, 1.0 unless configured) so the sampled distribution
  is the one recorded in `Step.sampling`.

Pure functions, no I/O.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping, Sequence

__all__ = ["LLAMA_NEUTRAL_SAMPLING", "completion_body", "token_drift", "check_pieces"]

LLAMA_NEUTRAL_SAMPLING: dict[str, Any] = {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0,
                                          "presence_penalty": 0.0, "frequency_penalty": 0.0}
"""Sampling fields sent when not configured, switching off llama.cpp's non-OpenAI defaults."""


def completion_body(model: str, prompt: str, *, max_tokens: int, sampling: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """The `/v1/completions` request for a text prompt: sampled tokens' log-probs, one choice, no streaming."""
    body = {"model": model, "prompt": prompt, "max_tokens": int(max_tokens), **LLAMA_NEUTRAL_SAMPLING}
    body.update(sampling)
    body.update({"seed": int(seed), "n": 1, "stream": False, "logprobs": 0, "echo": False})
    return body


def token_drift(expected: Sequence[int], got: Sequence[int]) -> tuple[int, int | None]:
    """(tokens of `got` not matched in order by `expected`, first differing position or None when equal).

    The count is the number of `got` tokens outside the longest in-order matching blocks (difflib), so one
    re-merged pair of tokens counts as the ids that changed, not as the whole rest of the sequence."""
    a, b = [int(t) for t in expected], [int(t) for t in got]
    if a == b:
        return 0, None
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    matched = sum(block.size for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())
    return max(len(a), len(b)) - matched, first


def check_pieces(tokenizer: Any, ids: Sequence[int], pieces: Sequence[Any]) -> int:
    """How many of `ids` disagree with the server's decoded `pieces` (plus any length difference).

    The server decodes each sampled token alone with invalid UTF-8 dropped (`errors="ignore"`), the context
    tokenizer replaces it with U+FFFD: those characters are removed before comparing."""
    bad = abs(len(ids) - len(pieces))
    for token, piece in zip(ids, pieces):
        ours = tokenizer.decode([int(token)]).replace("\ufffd", "")
        if not isinstance(piece, str) or ours != piece:
            bad += 1
    return bad
