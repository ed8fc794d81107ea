"""The gateway's side of the OpenAI chat-completions protocol: requests read and checked, answers and errors shaped.

`parse_chat_request` turns a request body into a `ChatRequest` or raises `GatewayError` (HTTP 400) naming
the field. Fields read: `messages` (required, non-empty), `tools`, `temperature`, `top_p`, `max_tokens` or
`max_completion_tokens`, `seed`, `n` (must be 1), `stream`, `tool_choice` (`auto` or absent; `none` and a
forced tool are refused rather than ignored), `metadata.ctxkit_episode` (the episode, when no
`X-Ctxkit-Episode` header names it), `model` (echoed). Fields that would change sampling in a way the gateway
does not do (`UNSUPPORTED`: `stop`, `logit_bias`, penalties, `response_format`) are refused unless neutral,
never silently ignored; other OpenAI fields (`user`, `logprobs`, ...) are accepted and change nothing (the
answer's `logprobs` is null: the recorded step holds them). `chat_response` is the `chat.completion` answer for a recorded `Step`,
`stream_events` the same answer as server-sent events (one content chunk, then the finish), and
`error_body` OpenAI's error object `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from ctxkit.errors import GatewayError
from ctxkit.events import Step

__all__ = ["ChatRequest", "EPISODE_HEADER", "parse_chat_request", "check_episode_id", "chat_response",
           "stream_events", "error_body", "parse_end_request"]

EPISODE_HEADER = "X-Ctxkit-Episode"
"""Request header naming the episode (also set on every answer)."""

UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "stop": (None, [], ""), "logit_bias": (None, {}), "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0), "response_format": (None, {"type": "text"}),
}
"""Request fields that would change sampling, refused (HTTP 400) unless absent or given their neutral value."""

_EPISODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class ChatRequest:
    """A checked `POST /v1/chat/completions` request."""

    messages: tuple[Mapping[str, Any], ...]
    """The harness's whole history, as sent."""
    tools: tuple[Mapping[str, Any], ...]
    """Tool schemas offered (OpenAI shape)."""
    episode_id: str | None
    """The episode named by the header or `metadata.ctxkit_episode`; None to find it by the history."""
    model: str
    """The model name asked for (echoed in the answer)."""
    temperature: float | None
    """Sampling temperature; None: the gateway's default."""
    top_p: float | None
    """Nucleus mass; None: the gateway's default."""
    max_tokens: int | None
    """Tokens to sample at most; None: the gateway's default."""
    seed: int | None
    """Sampling seed; None: derived from the episode id and step index."""
    stream: bool
    """Answer as server-sent events."""


def check_episode_id(value: Any, where: str) -> str:
    """`value` when it is a usable episode id (1-128 of `A-Za-z0-9._-`, not starting with `.`, `_` or `-`)."""
    if not isinstance(value, str) or not _EPISODE_ID.match(value):
        raise GatewayError(f"{where}: episode id {value!r} must be 1-128 characters of A-Za-z0-9._- starting with a "
                           "letter or digit", status=400, param=where)
    return value


def _number(body: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise GatewayError(f"{key}={value!r} must be a number in [{low}, {high}]", status=400, param=key)
    return float(value)


def _integer(body: Mapping[str, Any], key: str, low: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise GatewayError(f"{key}={value!r} must be an integer >= {low}", status=400, param=key)
    return value


def _body_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GatewayError(f"the request body is not JSON: {exc}", status=400) from None
    if not isinstance(body, dict):
        raise GatewayError(f"the request body is a JSON {type(body).__name__}; expected an object", status=400)
    return body


def parse_chat_request(raw: bytes, *, header_episode: str | None = None) -> ChatRequest:
    """Read and check a chat-completions body (see the module docstring); `GatewayError` 400 naming the field."""
    body = _body_object(raw)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise GatewayError("messages must be a non-empty list of message objects", status=400, param="messages")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise GatewayError("tools must be a list of tool objects", status=400, param="tools")
    if body.get("n", 1) != 1:
        raise GatewayError(f"n={body.get('n')!r}: the gateway samples one choice per request", status=400, param="n")
    if body.get("tool_choice", "auto") not in ("auto", None):
        raise GatewayError(f"tool_choice={body.get('tool_choice')!r} is not supported (the policy decides: 'auto')",
                           status=400, param="tool_choice")
    for key, neutral in UNSUPPORTED.items():
        if body.get(key) not in neutral:
            raise GatewayError(f"{key}={body.get(key)!r} is not supported: the gateway records the sampling it does, "
                               "and would not do this", status=400, param=key)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise GatewayError(f"stream={stream!r} must be true or false", status=400, param="stream")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise GatewayError("metadata must be an object", status=400, param="metadata")
    episode = header_episode if header_episode is not None else metadata.get("ctxkit_episode")
    if episode is not None:
        episode = check_episode_id(episode, EPISODE_HEADER if header_episode is not None else "metadata.ctxkit_episode")
    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    seed = _integer(body, "seed", 0)
    model = body.get("model", "")
    return ChatRequest(messages=tuple(messages), tools=tuple(tools), episode_id=episode,
                       model=model if isinstance(model, str) else "", temperature=_number(body, "temperature", 0.0, 2.0),
                       top_p=_number(body, "top_p", 1e-9, 1.0), max_tokens=max_tokens, seed=seed, stream=stream)


def parse_end_request(raw: bytes) -> dict[str, Any]:
    """The `EpisodeEnd` fields of `POST /ctxkit/episodes/{id}/end`: `outcome` (default `terminated`), `cause`
    (default `harness_end`), `reward` (a number or null), `reward_kind` (default `scored` with a reward, else
    `unscored`), `scores` (an object). `GatewayError` 400 naming the field."""
    body = _body_object(raw) if raw.strip() else {}
    unknown = sorted(set(body) - {"outcome", "cause", "reward", "reward_kind", "scores"})
    if unknown:
        raise GatewayError(f"unknown field(s) {unknown}; allowed: outcome, cause, reward, reward_kind, scores",
                           status=400, param=unknown[0])
    reward = body.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        raise GatewayError(f"reward={reward!r} must be a number or null", status=400, param="reward")
    cause = body.get("cause", "harness_end")
    if not isinstance(cause, str) or not cause:
        raise GatewayError(f"cause={cause!r} must be a non-empty string", status=400, param="cause")
    scores = body.get("scores", {})
    if not isinstance(scores, dict):
        raise GatewayError("scores must be an object", status=400, param="scores")
    return {"outcome": body.get("outcome", "terminated"), "cause": cause,
            "reward": None if reward is None else float(reward),
            "reward_kind": body.get("reward_kind", "unscored" if reward is None else "scored"), "scores": scores}


def _wire_message(step: Step) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": step.content if isinstance(step.content, str) else None}
    if step.tool_calls:
        message["tool_calls"] = [{"id": tc.id, "type": "function",
                                  "function": {"name": tc.name, "arguments": tc.arguments_text()}}
                                 for tc in step.tool_calls]
    return message


def _finish(step: Step) -> str:
    # OpenAI says `tool_calls` for a turn that ends in calls; engines that parse nothing say `stop`
    return "tool_calls" if step.tool_calls and step.finish_reason in ("stop", "tool_calls", None) else step.finish_reason or "stop"


def chat_response(step: Step, *, episode_id: str, model: str, created: int) -> dict[str, Any]:
    """The `chat.completion` object for a recorded step, with a `ctxkit` block (episode, step event, context)."""
    return {
        "id": f"chatcmpl-{episode_id}-{step.id}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": _wire_message(step), "finish_reason": _finish(step), "logprobs": None}],
        "usage": {"prompt_tokens": step.context_length, "completion_tokens": len(step.token_ids),
                  "total_tokens": step.context_length + len(step.token_ids)},
        "ctxkit": {"episode_id": episode_id, "step_id": step.id, "context_hash": step.context_hash},
    }


def stream_events(response: Mapping[str, Any]) -> Iterator[str]:
    """A `chat_response` as server-sent `chat.completion.chunk` events: the message, the finish, `[DONE]`."""
    choice = response["choices"][0]
    base = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
            "model": response["model"]}
    delta: dict[str, Any] = {"role": "assistant", "content": choice["message"]["content"]}
    if "tool_calls" in choice["message"]:
        delta["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(choice["message"]["tool_calls"])]
    yield "data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}) + "\n\n"
    last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
            "usage": response["usage"], "ctxkit": response["ctxkit"]}
    yield "data: " + json.dumps(last) + "\n\n"
    yield "data: [DONE]\n\n"


_TYPES = {400: "invalid_request_error", 404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
          429: "rate_limit_error"}


def error_body(message: str, *, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object for an HTTP `status`."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
