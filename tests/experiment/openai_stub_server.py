"""A small, real OpenAI-compatible HTTP server for the agent tests (std-lib `http.server` in a thread).

It listens on 127.0.0.1 with an ephemeral port and answers the vLLM-style endpoints the HTTP agent uses:

- `POST /v1/completions` with `prompt` as a list of token ids (or a string), `return_token_ids`,
  `logprobs` (an int: the sampled token's log-prob is always returned, vLLM's `logprobs=0`),
  `return_tokens_as_token_ids`, `stop_token_ids`, `max_tokens`, `seed`, sampling params;
- `POST /v1/chat/completions` with `messages` (rendered server-side with the tokenizer's chat template),
  `logprobs: true`, `return_token_ids`;
- `GET /v1/models`.

Responses carry `token_ids` and `prompt_token_ids` the way vLLM >= 0.10.2 does. Every request received is
recorded (`server.requests`) so tests can assert exact request shapes. Fault injection: `fail_status`
(answer every POST with that HTTP status), `delay_s` (sleep before answering), `omit_token_ids` (behave
like a server without `return_token_ids`), `mutate` (edit each JSON answer before it is sent). As in
vLLM, the text of a turn ended by a stop id does not include that id's text (the ids do).

What is generated comes from a `generate(prompt_ids, params) -> (ids, logprobs, finish_reason)` callable:
`RuleGenerator` (deterministic, from a seeded rule) or `ModelGenerator` (a real model through a
`TransformersAgent`).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Sequence

GenerateFn = Callable[[list[int], dict[str, Any]], "tuple[list[int], list[float], str]"]


@dataclass
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


class RuleGenerator:
    """Deterministic generation: a tool call naming the prompt length and seed, then the stop id.

    The reply text is `<tool_call>\\n{"name": "echo", "arguments": {"n": <len(prompt)>, "seed": <seed>}}
    \\n</tool_call>` tokenized with `tokenizer`, followed by `eos_id`. The log-prob of the i-th token is
    `-(i + 1) / 16 - (seed % 7) / 100`. `max_tokens` truncates (finish `length`); the first id in
    `stop_token_ids` (or `eos_id`) ends the turn, kept in the output (finish `stop`).
    """

    def __init__(self, tokenizer: Any, eos_id: int):
        self.tokenizer = tokenizer
        self.eos_id = eos_id

    def reply_ids(self, prompt_ids: Sequence[int], seed: int) -> list[int]:
        """The full reply (before max_tokens) for a prompt and seed."""
        text = '<tool_call>\n{"name": "echo", "arguments": {"n": %d, "seed": %d}}\n</tool_call>' % (len(prompt_ids), seed)
        return list(self.tokenizer.encode(text)) + [self.eos_id]

    @staticmethod
    def logprob(i: int, seed: int) -> float:
        """The log-prob reported for the i-th generated token."""
        return -(i + 1) / 16 - (seed % 7) / 100

    def __call__(self, prompt_ids: list[int], params: dict[str, Any]) -> tuple[list[int], list[float], str]:
        seed = int(params.get("seed") or 0)
        ids = self.reply_ids(prompt_ids, seed)
        stops = set(params.get("stop_token_ids") or []) | {self.eos_id}
        out: list[int] = []
        finish = "length"
        for tok in ids[: int(params.get("max_tokens") or 16)]:
            out.append(tok)
            if tok in stops:
                finish = "stop"
                break
        return out, [self.logprob(i, seed) for i in range(len(out))], finish


class ModelGenerator:
    """Generation by a real model: a `TransformersAgent`'s `generate` with the request's sampling params."""

    def __init__(self, agent: Any):
        self.agent = agent

    def __call__(self, prompt_ids: list[int], params: dict[str, Any]) -> tuple[list[int], list[float], str]:
        from ctxkit.experiment.agents.sampling import SamplingConfig

        config = SamplingConfig(
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p") or 1.0),
            top_k=max(0, int(params.get("top_k") or 0)),
            min_p=float(params.get("min_p") or 0.0),
            max_new_tokens=int(params.get("max_tokens") or 16),
        )
        turn = self.agent.generate(prompt_ids, seed=int(params.get("seed") or 0), config=config)
        # a vLLM server in its default mode reports raw log-probs
        return list(turn.token_ids), list(turn.raw_logprobs), turn.finish_reason


@dataclass
class StubOpenAIServer:
    """The server; use as a context manager (`with StubOpenAIServer(...) as server: server.base_url`)."""

    generate: GenerateFn
    tokenizer: Any
    """Decodes generated ids to text and renders chat messages (`apply_chat_template` on `.hf` or itself)."""
    model: str = "stub-model"
    fail_status: int | None = None
    delay_s: float = 0.0
    omit_token_ids: bool = False
    mutate: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    requests: list[RecordedRequest] = field(default_factory=list)
    _httpd: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>` (no trailing slash, no `/v1`)."""
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "StubOpenAIServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                server.requests.append(RecordedRequest("GET", self.path, dict(self.headers), None))
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}", "type": "NotFound"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                server.requests.append(RecordedRequest("POST", self.path, dict(self.headers), body))
                if server.delay_s:
                    time.sleep(server.delay_s)
                if server.fail_status is not None:
                    self._send(server.fail_status, {"error": {"message": "injected failure", "type": "InternalServerError"}})
                    return
                if not isinstance(body, dict):
                    self._send(400, {"error": {"message": "body is not a JSON object", "type": "BadRequestError"}})
                    return
                if body.get("model") != server.model:
                    self._send(404, {"error": {"message": f"model {body.get('model')!r} does not exist", "type": "NotFoundError"}})
                    return
                try:
                    if self.path == "/v1/completions":
                        self._send(200, server._mutated(server._completion(body)))
                    elif self.path == "/v1/chat/completions":
                        self._send(200, server._mutated(server._chat(body)))
                    else:
                        self._send(404, {"error": {"message": f"no route {self.path}", "type": "NotFound"}})
                except (KeyError, TypeError, ValueError) as exc:
                    self._send(400, {"error": {"message": f"bad request: {exc}", "type": "BadRequestError"}})

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
                    pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="stub-openai", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ------------------------------------------------------------------ endpoints

    def _mutated(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self.mutate(payload) if self.mutate is not None else payload

    @staticmethod
    def _text_ids(ids: Sequence[int], finish: str) -> Sequence[int]:
        """The ids whose text is returned: without the stop id that ended the turn."""
        return ids[:-1] if finish == "stop" and ids else ids

    def _decode(self, ids: Sequence[int], skip_special: bool) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["prompt"]
        if isinstance(prompt, str):
            prompt_ids = self._encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            prompt_ids = list(prompt)
        else:
            raise ValueError("prompt must be a string or a non-empty list of token ids")
        ids, lps, finish = self.generate(prompt_ids, body)
        skip = bool(body.get("skip_special_tokens", True))
        choice: dict[str, Any] = {
            "index": 0,
            "text": self._decode(self._text_ids(ids, finish), skip),
            "finish_reason": finish,
            "stop_reason": ids[-1] if finish == "stop" and ids else None,
            "logprobs": None,
        }
        if body.get("logprobs") is not None:
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            tokens = [f"token_id:{t}" if as_ids else self._decode([t], False) for t in ids]
            offsets, pos = [], 0
            for t in ids:
                offsets.append(pos)
                pos += len(self._decode([t], skip))
            choice["logprobs"] = {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": None}
        if body.get("return_token_ids") and not self.omit_token_ids:
            choice["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = ids
        return {
            "id": f"cmpl-{len(self.requests)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids), "total_tokens": len(prompt_ids) + len(ids)},
        }

    def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        hf = getattr(self.tokenizer, "hf", None) or self.tokenizer
        text = hf.apply_chat_template(messages, tools=body.get("tools"), add_generation_prompt=True, tokenize=False)
        prompt_ids = self._encode(text)
        params = dict(body)
        params.setdefault("max_tokens", body.get("max_completion_tokens"))
        ids, lps, finish = self.generate(prompt_ids, params)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": self._decode(self._text_ids(ids, finish), True), "tool_calls": []},
            "finish_reason": finish,
            "stop_reason": ids[-1] if finish == "stop" and ids else None,
            "logprobs": None,
        }
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {"token": self._decode([t], False), "logprob": lp, "bytes": list(self._decode([t], False).encode()), "top_logprobs": []}
                    for t, lp in zip(ids, lps)
                ]
            }
        response: dict[str, Any] = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids), "total_tokens": len(prompt_ids) + len(ids)},
        }
        if body.get("return_token_ids") and not self.omit_token_ids:
            choice["token_ids"] = ids
            response["prompt_token_ids"] = prompt_ids
        return response
