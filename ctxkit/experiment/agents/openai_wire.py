"""Wire helpers of the OpenAI-compatible protocol: errors, finish reasons, response field checks.

Shared by the HTTP agent (`openai_http`) and its dialects; every malformed field is an `OpenAIHTTPError`
naming the field and the URL.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from ctxkit.errors import CtxkitError
from ctxkit.events import FINISH_REASONS, ToolCall
from ctxkit.experiment.agents.parsing import make_call_id

__all__ = ["OpenAIHTTPError", "OpenAITimeoutError", "ENGINE_FINISH_REASONS", "engine_finish_reason", "wire_message",
           "first_choice", "int_list", "float_list", "completion_ids", "engine_record", "server_call"]

ENGINE_FINISH_REASONS: dict[str, str] = {
    "eos_token": "stop", "stop_sequence": "stop", "end_turn": "stop", "max_tokens": "length", "tool_use": "tool_calls",
}
"""Other engines' finish reasons (TGI `eos_token`/`stop_sequence`, Anthropic-style `end_turn`/`max_tokens`/
`tool_use`) mapped onto the OpenAI/vLLM vocabulary that `Step.finish_reason` holds (`events.FINISH_REASONS`)."""


def engine_finish_reason(value: Any, *, url: str) -> str:
    """The server's `finish_reason` in the `Step` vocabulary: missing means `stop`; a known dialect is mapped;
    anything else is an `OpenAIHTTPError` naming the value, so an unknown reason is never silently recorded."""
    if value is None or value == "":
        return "stop"
    reason = ENGINE_FINISH_REASONS.get(str(value), str(value))
    if reason not in FINISH_REASONS:
        raise OpenAIHTTPError(f"malformed response: finish_reason {value!r} is neither one of {list(FINISH_REASONS)} "
                              f"nor a known dialect ({sorted(ENGINE_FINISH_REASONS)})", url=url, status=200)
    return reason


class OpenAIHTTPError(CtxkitError):
    """A request to the inference server failed: HTTP error status, no connection, or a malformed answer."""

    def __init__(self, message: str, *, url: str, status: int | None = None):
        where = f"POST {url}" + (f" -> HTTP {status}" if status is not None else "")
        super().__init__(f"{where}: {message}")
        self.url = url
        """The URL requested."""
        self.status = status
        """The HTTP status (None when there was no HTTP answer)."""


class OpenAITimeoutError(OpenAIHTTPError):
    """The server did not answer within `timeout_s`."""

    def __init__(self, *, url: str, timeout_s: float, elapsed_s: float):
        super().__init__(f"no answer within timeout_s={timeout_s} (gave up after {elapsed_s:.3f}s)", url=url)
        self.timeout_s = timeout_s
        self.elapsed_s = elapsed_s




def wire_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI message without ctxkit's private keys (the sampled `token_ids` of an assistant turn)."""
    return {k: v for k, v in message.items() if k != "token_ids"}


def first_choice(payload: Any, url: str) -> Mapping[str, Any]:
    choices = payload.get("choices") if isinstance(payload, Mapping) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise OpenAIHTTPError("malformed response: no choices[0]", url=url, status=200)
    return choices[0]


def completion_choice(payload: Any, url: str) -> tuple[Mapping[str, Any], str]:
    """`(choices[0], its text)` of a `/v1/completions` reply; a missing or non-string text is an
    `OpenAIHTTPError` naming the field and the url."""
    choice = first_choice(payload, url)
    text = choice.get("text")
    if not isinstance(text, str):
        raise OpenAIHTTPError(f"malformed response: choices[0].text is {type(text).__name__}, not a string", url=url, status=200)
    return choice, text


def int_list(value: Any, where: str, url: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise OpenAIHTTPError(f"malformed response: {where} is not a list of integers", url=url, status=200)
    return list(value)


def float_list(value: Any, where: str, url: str) -> list[float] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        raise OpenAIHTTPError(f"malformed response: {where} is not a list of numbers", url=url, status=200)
    return [float(x) for x in value]


def completion_ids(choice: Mapping[str, Any], lp_block: Mapping[str, Any], url: str) -> tuple[list[int] | None, str]:
    """Sampled ids from `token_ids`, else from `token_id:<n>` log-prob tokens; (None, "") when neither."""
    if choice.get("token_ids") is not None:
        return int_list(choice["token_ids"], "choices[0].token_ids", url), "server"
    tokens = lp_block.get("tokens")
    if isinstance(tokens, list) and tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        try:
            return [int(t[len("token_id:"):]) for t in tokens], "logprob_tokens"
        except ValueError:
            pass
    return None, ""


def engine_record(endpoint: str, source: str, context_ids, server_prompt, kind: str) -> dict[str, Any]:
    """What the server did with the prompt and where the ids came from (kept in `sampling["engine"]`)."""
    record: dict[str, Any] = {"endpoint": endpoint, "ids_source": source, "logprobs_mode": kind}
    if server_prompt is None or context_ids is None:
        record["prompt_match"] = None
        return record
    ctx = [int(t) for t in context_ids]
    srv = [int(t) for t in server_prompt]
    record["prompt_match"] = ctx == srv
    record["server_prompt_tokens"] = len(srv)
    if ctx != srv:
        record["prompt_drift_at"] = next((i for i, (a, b) in enumerate(zip(ctx, srv)) if a != b), min(len(ctx), len(srv)))
    return record


def server_call(call: Any, index: int, seed: str, url: str) -> ToolCall:
    """A tool call the server parsed, in the OpenAI wire shape."""
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise OpenAIHTTPError(f"malformed response: tool_calls[{index}] has no function name", url=url, status=200)
    args = fn.get("arguments", "{}")
    if not isinstance(args, str):
        args = json.dumps(args)
    call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else make_call_id(seed, index)
    return ToolCall(id=call_id, name=fn["name"], arguments=args)
