"""An agent that asks an OpenAI-compatible server (vLLM, SGLang) for each turn, over plain HTTP (`urllib`).

Token-in (default, `use_token_ids=True`): `POST /v1/completions` with `prompt` = the context's token ids,
so the server sees exactly what the builder produced. It asks for the sampled tokens' log-probs
(`logprobs: 0`), the sampled ids (`return_token_ids`, vLLM >= 0.10.2; `return_tokens_as_token_ids` as a
second source) and keeps special tokens in the text. The ids come back verbatim (token-out).

Messages (`use_token_ids=False`): `POST /v1/chat/completions` with the view's messages; the server renders
them with its own template, so what it saw may differ from `context.token_ids`. That is measured, not
hidden: `sampling["engine"]` records whether the server's `prompt_token_ids` equal the context
(`prompt_match`, `prompt_drift_at`), and where the server returns no sampled ids the turn's ids are the
local re-tokenization of its text (`ids_source="retokenized"`), with log-probs dropped (they would not
align).

Log-prob meaning: vLLM returns raw log-probs unless started with `--logprobs-mode processed_logprobs`;
say which with `server_logprobs_mode` (`raw` default, or `processed`), recorded as `logprob_kind`.

Kept set: not recorded (`Step.kept_set` stays None). Neither vLLM's nor llama-cpp-python's completions API
says which tokens the sampler kept at a position (their `logprobs: n` are the n most likely candidates of the
raw distribution, whatever top-k / top-p cut), so `ctxkit mismatch` can tell support from numerics on these
steps only through the trainer-side recompute.

Failures: an HTTP error status or a malformed response raises `OpenAIHTTPError` naming the URL and status;
a timeout either returns a turn with `finish_reason="abort"` and the time spent (`on_timeout="abort"`,
default, so the runner can count it and end the episode truncated) or raises `OpenAITimeoutError`.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ctxkit.errors import ConfigError
from ctxkit.experiment.agents.base import AgentTurn
from ctxkit.experiment.agents.llama_wire import check_pieces, completion_body, token_drift
from ctxkit.experiment.agents.openai_wire import (
    ENGINE_FINISH_REASONS,
    OpenAIHTTPError,
    OpenAITimeoutError,
    completion_choice,
    completion_ids,
    engine_finish_reason,
    engine_record,
    first_choice,
    float_list,
    int_list,
    server_call,
    wire_message,
)
from ctxkit.experiment.agents.parsing import END_OF_TURN_TOKENS, end_of_turn_ids, parse_text, turn_call_seed
from ctxkit.experiment.engine_server import server_spec
from ctxkit.text.tokenizer.loader import Tokenizer, load_tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from ctxkit.context.builder import BuiltContext

__all__ = ["OpenAIAgent", "OpenAIHTTPError", "OpenAITimeoutError", "LOGPROBS_MODES", "DIALECTS", "ENGINE_FINISH_REASONS",
           "engine_finish_reason"]

LOGPROBS_MODES: dict[str, str] = {
    "raw": "raw",
    "raw_logprobs": "raw",
    "processed": "processed",
    "processed_logprobs": "processed",
}
"""`server_logprobs_mode` values (ours and vLLM's `--logprobs-mode` names) -> the recorded `logprob_kind`."""

DIALECTS: tuple[str, ...] = ("vllm", "llama-cpp")
"""Server dialects: `vllm` (also SGLang: token-id prompts, `return_token_ids`) and `llama-cpp`
(`llama-cpp-python`'s server: text prompts checked against the context, see `llama_wire`)."""

ON_TIMEOUT = ("abort", "raise")
"""What a timed-out request does: return an `abort` turn, or raise `OpenAITimeoutError`."""

_BODY_EXCERPT = 500


class OpenAIAgent:
    """A policy served by an OpenAI-compatible HTTP server (vLLM / SGLang style)."""

    def __init__(
        self,
        *,
        base_url: str | None = None,
        model: str | None = None,
        tokenizer: Any = None,
        template: Any = None,
        task: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        min_p: float | None = None,
        max_tokens: int = 256,
        timeout_s: float = 60.0,
        use_token_ids: bool = True,
        server_logprobs_mode: str = "raw",
        stop_token_ids: Sequence[int] | None = None,
        on_timeout: str = "abort",
        policy_version: str | int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        dialect: str = "vllm",
        **unknown: Any,
    ):
        """`base_url` is the server root (`http://host:8000`, a trailing `/v1` is accepted); `model` the served
        model name. `tokenizer` (a `ctxkit.text.tokenizer.loader.Tokenizer` or spec) is the one contexts are built with:
        it gives the default `stop_token_ids` (its end-of-turn ids) and re-tokenizes text when a server
        returns no ids. `api_key` or `api_key_env` (the name of an environment variable holding it) set the
        bearer token. `extra_body` is merged into every request. `dialect` is `vllm` (default; SGLang too) or
        `llama-cpp` (text prompts, see `llama_wire`; needs `tokenizer`). `template`/`task` are accepted per the
        agent construction contract and unused.
        """
        if unknown:
            raise ConfigError(
                f"openai agent: unknown parameter(s) {sorted(unknown)}; allowed: base_url, model, api_key, api_key_env, "
                "temperature, top_p, top_k, min_p, max_tokens, timeout_s, use_token_ids, server_logprobs_mode, "
                "stop_token_ids, on_timeout, policy_version, extra_body, dialect (and, in an experiment config, server, "
                "server_model, n_ctx, server_threads, server_start_timeout_s)"
            )
        if base_url is None or model is None:
            raise ConfigError(f"openai agent: {'base_url' if base_url is None else 'model'} is required")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"openai agent: base_url={base_url!r} must be an http(s) URL like http://127.0.0.1:8000")
        root = base_url.rstrip("/")
        if root.endswith("/v1"):
            root = root[: -len("/v1")]
        self.base_url = root
        """Server root without a trailing slash or `/v1`."""
        if not isinstance(model, str) or not model:
            raise ConfigError(f"openai agent: model={model!r} must be the served model name")
        self.model = model
        if dialect not in DIALECTS:
            raise ConfigError(f"openai agent: dialect={dialect!r}; allowed {list(DIALECTS)}")
        self.dialect = dialect
        """`vllm` or `llama-cpp`: how requests are shaped and answers read."""
        if dialect == "llama-cpp" and server_logprobs_mode not in ("raw", "raw_logprobs"):
            raise ConfigError(f"openai agent: server_logprobs_mode={server_logprobs_mode!r} with dialect='llama-cpp': "
                              "llama-cpp-python returns raw log-probs only (a log-softmax of the logits before sampling)")
        if server_logprobs_mode not in LOGPROBS_MODES:
            raise ConfigError(
                f"openai agent: server_logprobs_mode={server_logprobs_mode!r}; allowed {sorted(LOGPROBS_MODES)} "
                "(raw_logits/processed_logits are logits, not log-probs)"
            )
        self.logprob_kind = LOGPROBS_MODES[server_logprobs_mode]
        """`raw` or `processed`: what the server's log-probs are (recorded on every turn)."""
        if on_timeout not in ON_TIMEOUT:
            raise ConfigError(f"openai agent: on_timeout={on_timeout!r}; allowed {list(ON_TIMEOUT)}")
        self.on_timeout = on_timeout
        if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ConfigError(f"openai agent: timeout_s={timeout_s!r} must be a number > 0")
        self.timeout_s = float(timeout_s)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ConfigError(f"openai agent: max_tokens={max_tokens!r} must be an integer >= 1")
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise ConfigError(f"openai agent: temperature={temperature!r} must be a number >= 0")
        if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise ConfigError(f"openai agent: top_p={top_p!r} must be in (0, 1]")
        if not isinstance(use_token_ids, bool):
            raise ConfigError(f"openai agent: use_token_ids={use_token_ids!r} must be true or false")
        self.use_token_ids = use_token_ids
        self.sampling_params: dict[str, Any] = {"temperature": float(temperature), "top_p": float(top_p)}
        """Sampling params sent with every request (top_k/min_p only when set)."""
        if top_k is not None:
            self.sampling_params["top_k"] = int(top_k)
        if min_p is not None:
            self.sampling_params["min_p"] = float(min_p)
        self.max_tokens = max_tokens
        if api_key is None and api_key_env is not None:
            api_key = os.environ.get(api_key_env)
            if not api_key:
                raise ConfigError(f"openai agent: api_key_env={api_key_env!r} names an unset environment variable")
        self._api_key = api_key
        self.tokenizer = None
        """The context tokenizer, when given."""
        if tokenizer is not None:
            self.tokenizer = tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer)
        if stop_token_ids is not None:
            self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        else:
            self.stop_token_ids = end_of_turn_ids(self.tokenizer) if self.tokenizer is not None else ()
        if dialect == "llama-cpp" and self.tokenizer is None:
            raise ConfigError("openai agent: dialect='llama-cpp' needs the context tokenizer (the server takes text)")
        self.extra_body = dict(extra_body or {})
        self.policy_version = policy_version if policy_version is not None else model
        self.name = f"openai:{model}"

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        """Validate an agent table without contacting the server (the runner calls this before any episode).

        A table with `server = "llama-cpp"` is checked with a placeholder URL: the runner starts the server."""
        spec, rest = server_spec(params, where="openai agent")
        if spec is not None:
            if rest.pop("dialect", "llama-cpp") != "llama-cpp":
                raise ConfigError("openai agent: server = \"llama-cpp\" speaks dialect 'llama-cpp'; drop the dialect key")
            if rest.get("server_logprobs_mode", "raw") not in ("raw", "raw_logprobs"):
                raise ConfigError("openai agent: llama-cpp-python returns raw log-probs only; drop server_logprobs_mode")
            rest = {**rest, "base_url": "http://127.0.0.1:1", "model": spec.alias}  # the tokenizer comes at build time
        cls(**rest)

    # ------------------------------------------------------------------------------------------ acting

    def act(self, context: "BuiltContext", *, tools: Sequence[Mapping[str, Any]] = (), seed: int) -> AgentTurn:
        """Ask the server for the next turn: token ids to `/v1/completions` (llama-cpp: the ids' text, checked), or
        messages to `/v1/chat/completions`."""
        if self.dialect == "llama-cpp":
            return self.complete_text(context.token_ids, seed=seed, call_id_seed=turn_call_seed(context.hash, seed))
        if self.use_token_ids:
            return self.complete_ids(context.token_ids, seed=seed, call_id_seed=turn_call_seed(context.hash, seed))
        messages = [wire_message(m.to_chat()) for m in context.view.messages]
        return self.chat(messages, tools=tools, seed=seed, context_ids=context.token_ids, call_id_seed=turn_call_seed(context.hash, seed))

    def complete_ids(self, token_ids: Sequence[int], *, seed: int, call_id_seed: str = "") -> AgentTurn:
        """Sample after the prompt `token_ids` through `/v1/completions` (token-in, token-out)."""
        prompt = [int(t) for t in token_ids]
        if not prompt:
            raise ConfigError("openai agent: the context is empty (0 token ids)")
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": self.max_tokens,
            **self.sampling_params,
            "seed": int(seed),
            "n": 1,
            "stream": False,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if self.stop_token_ids:
            body["stop_token_ids"] = list(self.stop_token_ids)
        body.update(self.extra_body)
        url = self._url("completions")
        payload, elapsed = self._post(url, body)
        if payload is None:
            return self._aborted(seed, elapsed, "completions")
        choice, text = completion_choice(payload, url)
        lp_block = choice.get("logprobs") or {}
        ids, source = completion_ids(choice, lp_block, url)
        logprobs = float_list(lp_block.get("token_logprobs"), "choices[0].logprobs.token_logprobs", url)
        if ids is None:
            ids, source, logprobs = self._retokenize(text, choice, url), "retokenized", None
        if logprobs is not None and len(logprobs) != len(ids):
            raise OpenAIHTTPError(
                f"malformed response: {len(logprobs)} log-probs for {len(ids)} token ids", url=url, status=200
            )
        server_prompt = choice.get("prompt_token_ids", payload.get("prompt_token_ids"))
        engine = engine_record("completions", source, prompt, server_prompt, self.logprob_kind)
        parsed = parse_text(self._text_of(ids, text), call_id_seed=call_id_seed)
        return self._turn(ids, logprobs, parsed.content, parsed.tool_calls, parsed.reasoning_content, choice, seed, elapsed, engine)

    def complete_text(self, token_ids: Sequence[int], *, seed: int, call_id_seed: str = "") -> AgentTurn:
        """llama-cpp dialect: send the text of `token_ids` to `/v1/completions`; check the server's prompt ids
        (`/extras/tokenize`) and the sampled ids (re-tokenized, checked piece by piece); drift is recorded in
        `sampling["engine"]`, never hidden (see `llama_wire`)."""
        prompt_ids = [int(t) for t in token_ids]
        if not prompt_ids:
            raise ConfigError("openai agent: the context is empty (0 token ids)")
        prompt = self.tokenizer.decode(prompt_ids)
        tok_url = f"{self.base_url}/extras/tokenize"
        answer, _ = self._post(tok_url, {"model": self.model, "input": prompt})
        if answer is None:
            return self._aborted(seed, self.timeout_s, "completions")
        if not isinstance(answer, Mapping):
            raise OpenAIHTTPError("malformed response: not a JSON object", url=tok_url, status=200)
        server_prompt = int_list(answer.get("tokens"), "tokens", tok_url)
        url = self._url("completions")
        extra = {**self.extra_body, **self.sampling_params}
        payload, elapsed = self._post(url, completion_body(self.model, prompt, max_tokens=self.max_tokens,
                                                           sampling=extra, seed=seed))
        if payload is None:
            return self._aborted(seed, elapsed, "completions")
        choice, text = completion_choice(payload, url)
        lp_block = choice.get("logprobs") or {}
        logprobs = float_list(lp_block.get("token_logprobs"), "choices[0].logprobs.token_logprobs", url)
        pieces = lp_block.get("tokens")
        if not isinstance(pieces, list) or logprobs is None or len(pieces) != len(logprobs):
            raise OpenAIHTTPError("malformed response: choices[0].logprobs.tokens/token_logprobs missing or unaligned",
                                  url=url, status=200)
        ids = list(self.tokenizer.encode(text))
        completion_drift = check_pieces(self.tokenizer, ids, pieces)
        engine = engine_record("completions", "retokenized-verified" if completion_drift == 0 else "retokenized-drift",
                               prompt_ids, server_prompt, self.logprob_kind)
        drift, _ = token_drift(prompt_ids, server_prompt)
        usage = payload.get("usage") if isinstance(payload.get("usage"), Mapping) else {}
        engine.update({"dialect": "llama-cpp", "prompt_drift_tokens": drift, "completion_drift_tokens": completion_drift,
                       "server_completion_tokens": len(pieces), "usage_prompt_tokens": usage.get("prompt_tokens"),
                       "end_token_unreported": choice.get("finish_reason") == "stop"})
        if completion_drift:
            logprobs = None  # they belong to the server's tokens, which are not these ids
        parsed = parse_text(self._text_of(ids, text), call_id_seed=call_id_seed)
        return self._turn(ids, logprobs, parsed.content, parsed.tool_calls, parsed.reasoning_content, choice, seed, elapsed, engine)

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        seed: int,
        context_ids: Sequence[int] | None = None,
        call_id_seed: str = "",
    ) -> AgentTurn:
        """Sample the next turn for OpenAI-shaped `messages` through `/v1/chat/completions`.

        `context_ids`, when given, are compared with the server's `prompt_token_ids` (drift is recorded).
        """
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            "max_tokens": self.max_tokens,
            **self.sampling_params,
            "seed": int(seed),
            "n": 1,
            "stream": False,
            "logprobs": True,
            "top_logprobs": 0,
            "return_token_ids": True,
        }
        if tools:
            body["tools"] = [dict(t) for t in tools]
        if self.stop_token_ids:
            body["stop_token_ids"] = list(self.stop_token_ids)
        body.update(self.extra_body)
        url = self._url("chat")
        payload, elapsed = self._post(url, body)
        if payload is None:
            return self._aborted(seed, elapsed, "chat")
        choice = first_choice(payload, url)
        message = choice.get("message")
        if not isinstance(message, Mapping):
            raise OpenAIHTTPError("malformed response: choices[0].message is missing", url=url, status=200)
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise OpenAIHTTPError("malformed response: choices[0].message.content is not a string", url=url, status=200)
        raw_ids = choice.get("token_ids")
        entries = (choice.get("logprobs") or {}).get("content")
        logprobs = None
        if entries is not None:
            if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
                raise OpenAIHTTPError("malformed response: choices[0].logprobs.content is not a list of objects", url=url, status=200)
            logprobs = float_list([e.get("logprob") for e in entries], "choices[0].logprobs.content[].logprob", url)
        if raw_ids is not None:
            ids = int_list(raw_ids, "choices[0].token_ids", url)
            source = "server"
            if logprobs is not None and len(logprobs) != len(ids):
                raise OpenAIHTTPError(f"malformed response: {len(logprobs)} log-probs for {len(ids)} token ids", url=url, status=200)
        else:
            ids, source, logprobs = self._retokenize(content or "", choice, url), "retokenized", None
        engine = engine_record("chat", source, context_ids, payload.get("prompt_token_ids", choice.get("prompt_token_ids")), self.logprob_kind)
        server_calls = message.get("tool_calls") or []
        if server_calls:
            calls = tuple(server_call(c, i, call_id_seed, url) for i, c in enumerate(server_calls))
            reasoning = message.get("reasoning_content")
            text_content = content.strip() if content and content.strip() else None
        else:
            parsed = parse_text(content or "", call_id_seed=call_id_seed)
            calls, reasoning, text_content = parsed.tool_calls, parsed.reasoning_content, parsed.content
        return self._turn(ids, logprobs, text_content, calls, reasoning, choice, seed, elapsed, engine)

    def close(self) -> None:
        """Nothing to release: each request opens its own connection."""

    # ------------------------------------------------------------------------------------------ internals

    def _post(self, url: str, body: Mapping[str, Any]) -> tuple[Any, float]:
        """POST JSON; (decoded answer, seconds), or (None, seconds) after a timeout with `on_timeout="abort"`."""
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            excerpt = exc.read(_BODY_EXCERPT).decode("utf-8", "replace")
            raise OpenAIHTTPError(f"server error: {excerpt}", url=url, status=exc.code) from exc
        except (TimeoutError, socket.timeout) as exc:
            return self._timed_out(url, time.perf_counter() - t0, exc)
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (TimeoutError, socket.timeout)):
                return self._timed_out(url, time.perf_counter() - t0, exc)
            raise OpenAIHTTPError(f"cannot reach the server: {exc.reason}", url=url) from exc
        except (ConnectionError, OSError) as exc:
            raise OpenAIHTTPError(f"connection failed: {exc}", url=url) from exc
        elapsed = time.perf_counter() - t0
        try:
            return json.loads(raw), elapsed
        except ValueError as exc:
            raise OpenAIHTTPError(f"malformed response: not JSON ({raw[:_BODY_EXCERPT]!r})", url=url, status=200) from exc

    def _timed_out(self, url: str, elapsed: float, exc: BaseException) -> tuple[None, float]:
        if self.on_timeout == "raise":
            raise OpenAITimeoutError(url=url, timeout_s=self.timeout_s, elapsed_s=elapsed) from exc
        return None, elapsed

    def _sampling(self, seed: int, endpoint: str) -> dict[str, Any]:
        out = dict(self.sampling_params)
        if self.dialect == "llama-cpp":
            out = {**completion_body(self.model, "", max_tokens=self.max_tokens, sampling=out, seed=seed)}
            for key in ("model", "prompt", "n", "stream", "logprobs", "echo"):
                out.pop(key)
            out["engine_sampler_order"] = "top_k,typical,top_p,min_p,temperature"
        out.update({"max_tokens": self.max_tokens, "seed": int(seed), "endpoint": endpoint})
        if self.stop_token_ids and self.dialect != "llama-cpp":  # llama.cpp stops on its own end-of-generation set
            out["stop_token_ids"] = list(self.stop_token_ids)
        return out

    def _aborted(self, seed: int, elapsed: float, endpoint: str) -> AgentTurn:
        sampling = self._sampling(seed, endpoint)
        sampling["engine"] = {"endpoint": endpoint, "timeout_s": self.timeout_s}
        return AgentTurn(
            token_ids=(),
            content=None,
            finish_reason="abort",
            sampling=sampling,
            policy_version=self.policy_version,
            timings={"prefill_s": 0.0, "decode_s": 0.0, "generate_s": elapsed},
        )

    def _url(self, endpoint: str) -> str:
        """The URL of an endpoint kind (`completions` or `chat`)."""
        return f"{self.base_url}/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}"

    def _turn(self, ids, logprobs, content, calls, reasoning, choice, seed, elapsed, engine) -> AgentTurn:
        finish = engine_finish_reason(choice.get("finish_reason"), url=self._url(engine["endpoint"]))
        sampling = self._sampling(seed, engine["endpoint"])
        sampling["engine"] = engine
        return AgentTurn(
            token_ids=tuple(ids),
            content=content,
            tool_calls=tuple(calls),
            finish_reason=finish,
            logprobs=None if logprobs is None else tuple(logprobs),
            logprob_kind=None if logprobs is None else self.logprob_kind,
            raw_logprobs=None,
            sampling=sampling,
            policy_version=self.policy_version,
            timings={"prefill_s": 0.0, "decode_s": 0.0, "generate_s": elapsed},
            reasoning_content=reasoning,
        )

    def _text_of(self, ids: Sequence[int], fallback: str) -> str:
        """Text to parse: the local decode of the ids before the first end-of-turn id; without a tokenizer,
        the server's text up to the first end-of-turn token string."""
        if self.tokenizer is None:
            cut = min((i for i in (fallback.find(t) for t in END_OF_TURN_TOKENS) if i >= 0), default=len(fallback))
            return fallback[:cut]
        ends = set(self.stop_token_ids)
        body = list(ids)
        for i, t in enumerate(body):
            if t in ends:
                body = body[:i]
                break
        return self.tokenizer.decode(body)

    def _retokenize(self, text: str, choice: Mapping[str, Any], url: str) -> list[int]:
        if self.tokenizer is None:
            raise OpenAIHTTPError(
                "the server returned no token ids (no return_token_ids support?) and the agent has no tokenizer "
                "to re-tokenize the text with",
                url=url,
                status=200,
            )
        ids = list(self.tokenizer.encode(text))
        stop = choice.get("stop_reason")
        if choice.get("finish_reason") == "stop" and isinstance(stop, int) and not isinstance(stop, bool):
            ids.append(stop)
        return ids


