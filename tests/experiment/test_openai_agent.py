"""The OpenAI-compatible HTTP agent against a real local HTTP server (`openai_stub_server.py`)."""

from __future__ import annotations

import copy

import pytest

from ctxkit.errors import ConfigError, CtxkitError
from ctxkit.events import EpisodeStart, Message
from ctxkit.experiment.agents.base import make_agent, to_step
from ctxkit.experiment.agents.openai_http import OpenAIAgent, OpenAIHTTPError, OpenAITimeoutError
from ctxkit.experiment.agents.parsing import make_call_id, turn_call_seed
from openai_stub_server import ModelGenerator, RuleGenerator, StubOpenAIServer

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Echo a number.",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        },
    },
)


@pytest.fixture(scope="module")
def tok(smollm_tok):
    """SmolLM2's tokenizer: the model these agents run."""
    return smollm_tok


@pytest.fixture(scope="module")
def eot(tok) -> int:
    return tok.special_tokens["<|im_end|>"]


@pytest.fixture
def episode(tok):
    """A real log and builder (SmolLM2 tokenizer, chatml-tools-v1) and the first context."""
    from ctxkit.context.builder import ContextBuilder, MemoryLog

    log = MemoryLog()
    log.extend(
        [
            EpisodeStart(episode_id="t-0", tools=TOOLS),
            Message(role="system", content="You are terse."),
            Message(role="user", content="Call echo with n=3."),
        ]
    )
    builder = ContextBuilder(tok, template="chatml-tools-v1", budget=4096, detect_pins=False)
    return log, builder, builder.build(log)


def _server(tok, eot, **kw) -> StubOpenAIServer:
    return StubOpenAIServer(generate=RuleGenerator(tok, eot), tokenizer=tok, **kw)


def test_token_ids_round_trip_and_exact_request(tok, eot, episode):
    log, builder, ctx = episode
    rule = RuleGenerator(tok, eot)
    with _server(tok, eot) as server:
        agent = make_agent(
            "openai", tokenizer=tok, template=builder.template, task="needle",
            base_url=server.base_url + "/v1/", model="stub-model", api_key="k-123",
            temperature=0.7, top_p=0.9, max_tokens=64, timeout_s=10,
        )
        turn = agent.act(ctx, tools=TOOLS, seed=5)
    assert len(server.requests) == 1
    req = server.requests[0]
    assert (req.method, req.path) == ("POST", "/v1/completions")
    assert req.headers["Authorization"] == "Bearer k-123"
    assert req.headers["Content-Type"] == "application/json"
    assert req.body == {
        "model": "stub-model",
        "prompt": list(ctx.token_ids),
        "max_tokens": 64,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 5,
        "n": 1,
        "stream": False,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "stop_token_ids": [0, 2],
    }
    expected_ids = rule.reply_ids(ctx.token_ids, 5)
    assert turn.token_ids == tuple(expected_ids) and turn.token_ids[-1] == eot
    assert turn.logprobs == tuple(RuleGenerator.logprob(i, 5) for i in range(len(expected_ids)))
    assert turn.logprob_kind == "raw" and turn.raw_logprobs is None
    assert turn.finish_reason == "stop"
    assert turn.content is None
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        (make_call_id(turn_call_seed(ctx.hash, 5), 0), "echo", '{"n": %d, "seed": 5}' % ctx.n_tokens)
    ]
    assert turn.sampling["engine"] == {
        "endpoint": "completions", "ids_source": "server", "logprobs_mode": "raw",
        "prompt_match": True, "server_prompt_tokens": ctx.n_tokens,
    }
    assert turn.sampling["seed"] == 5 and turn.sampling["temperature"] == 0.7
    assert turn.policy_version == "stub-model"
    assert turn.timings["generate_s"] > 0
    # token-out: the sampled ids are recorded and reused verbatim in the next context
    step = log.append(to_step(turn, ctx))
    log.append(Message(role="tool", tool_call_id=turn.tool_calls[0].id, name="echo", content="3"))
    nxt = builder.build(log)
    assert step.token_ids == turn.token_ids
    n = len(ctx.token_ids)
    assert nxt.token_ids[:n] == ctx.token_ids
    assert nxt.token_ids[n : n + len(turn.token_ids)] == turn.token_ids
    assert nxt.loss_mask[n : n + len(turn.token_ids)] == (1,) * len(turn.token_ids)


def test_max_tokens_truncates_with_length(tok, eot, episode):
    _, _, ctx = episode
    with _server(tok, eot) as server:
        turn = OpenAIAgent(base_url=server.base_url, model="stub-model", tokenizer=tok, max_tokens=4).act(ctx, tools=(), seed=1)
    assert turn.finish_reason == "length"
    assert turn.token_ids == tuple(RuleGenerator(tok, eot).reply_ids(ctx.token_ids, 1)[:4])
    assert len(turn.logprobs) == 4
    assert turn.tool_calls == () and turn.content == "<tool_call"


def test_ids_from_logprob_tokens_when_server_lacks_return_token_ids(tok, eot, episode):
    _, _, ctx = episode
    with _server(tok, eot, omit_token_ids=True) as server:
        turn = OpenAIAgent(base_url=server.base_url, model="stub-model", tokenizer=tok).act(ctx, tools=(), seed=2)
    assert turn.token_ids == tuple(RuleGenerator(tok, eot).reply_ids(ctx.token_ids, 2))
    assert turn.sampling["engine"]["ids_source"] == "logprob_tokens"
    assert turn.sampling["engine"]["prompt_match"] is None
    assert turn.logprobs is not None and len(turn.logprobs) == len(turn.token_ids)


def test_processed_mode_is_recorded(tok, eot, episode):
    _, _, ctx = episode
    with _server(tok, eot) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="stub-model", tokenizer=tok, server_logprobs_mode="processed_logprobs")
        turn = agent.act(ctx, tools=(), seed=0)
    assert turn.logprob_kind == "processed"
    assert turn.sampling["engine"]["logprobs_mode"] == "processed"


def test_chat_fallback_records_prompt_drift(tok, eot, episode):
    _, _, ctx = episode
    with _server(tok, eot) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="stub-model", tokenizer=tok, use_token_ids=False, max_tokens=64)
        turn = agent.act(ctx, tools=TOOLS, seed=4)
    req = server.requests[0]
    assert req.path == "/v1/chat/completions"
    assert req.body == {
        "model": "stub-model",
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Call echo with n=3."}],
        "max_tokens": 64,
        "temperature": 1.0,
        "top_p": 1.0,
        "seed": 4,
        "n": 1,
        "stream": False,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        "tools": [dict(t) for t in TOOLS],
        "stop_token_ids": [0, 2],
    }
    # the server rendered with SmolLM2's own template (no tools section): what it saw is not the context
    server_prompt = tok.encode(tok.hf.apply_chat_template(req.body["messages"], add_generation_prompt=True, tokenize=False))
    drift_at = next(i for i, (a, b) in enumerate(zip(ctx.token_ids, server_prompt)) if a != b)
    assert turn.sampling["engine"] == {
        "endpoint": "chat", "ids_source": "server", "logprobs_mode": "raw", "prompt_match": False,
        "server_prompt_tokens": len(server_prompt), "prompt_drift_at": drift_at,
    }
    assert turn.token_ids == tuple(RuleGenerator(tok, eot).reply_ids(server_prompt, 4))
    assert turn.logprobs == tuple(RuleGenerator.logprob(i, 4) for i in range(len(turn.token_ids)))
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("echo", '{"n": %d, "seed": 4}' % len(server_prompt))]


def test_chat_without_server_ids_retokenizes_and_drops_logprobs(tok, eot, episode):
    _, _, ctx = episode
    with _server(tok, eot, omit_token_ids=True) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="stub-model", tokenizer=tok, use_token_ids=False)
        turn = agent.act(ctx, tools=TOOLS, seed=4)
    server_prompt = tok.encode(tok.hf.apply_chat_template(server.requests[0].body["messages"], add_generation_prompt=True, tokenize=False))
    assert turn.token_ids == tuple(RuleGenerator(tok, eot).reply_ids(server_prompt, 4))  # BPE round-trips here
    assert turn.logprobs is None and turn.logprob_kind is None
    assert turn.sampling["engine"]["ids_source"] == "retokenized"
    assert turn.sampling["engine"]["prompt_match"] is None


def test_server_error_is_typed_and_names_url_and_status(tok, eot, episode):
    _, _, ctx = episode
    with _server(tok, eot, fail_status=500) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="stub-model", tokenizer=tok)
        with pytest.raises(OpenAIHTTPError) as info:
            agent.act(ctx, tools=(), seed=0)
    err = info.value
    assert isinstance(err, CtxkitError)
    assert err.status == 500 and err.url == f"{server.base_url}/v1/completions"
    assert str(err).startswith(f"POST {server.base_url}/v1/completions -> HTTP 500: server error: ")
    assert "injected failure" in str(err)


def test_unknown_model_is_a_404(tok, eot, episode):
    _, _, ctx = episode
    with _server(tok, eot) as server:
        with pytest.raises(OpenAIHTTPError) as info:
            OpenAIAgent(base_url=server.base_url, model="other", tokenizer=tok).act(ctx, tools=(), seed=0)
    assert info.value.status == 404 and "'other' does not exist" in str(info.value)


def test_timeout_aborts_with_timing_or_raises(tok, eot, episode):
    _, _, ctx = episode
    with _server(tok, eot, delay_s=1.5) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="stub-model", tokenizer=tok, timeout_s=0.3)
        turn = agent.act(ctx, tools=(), seed=0)
        assert turn.finish_reason == "abort" and turn.token_ids == () and turn.logprobs is None
        assert 0.3 <= turn.timings["generate_s"] < 1.5
        assert turn.sampling["engine"] == {"endpoint": "completions", "timeout_s": 0.3}
        strict = OpenAIAgent(base_url=server.base_url, model="stub-model", tokenizer=tok, timeout_s=0.3, on_timeout="raise")
        with pytest.raises(OpenAITimeoutError) as info:
            strict.act(ctx, tools=(), seed=0)
    assert info.value.status is None and info.value.timeout_s == 0.3
    assert "no answer within timeout_s=0.3" in str(info.value)


def test_unreachable_server(tok, eot, episode):
    _, _, ctx = episode
    with _server(tok, eot) as server:
        url = server.base_url
    with pytest.raises(OpenAIHTTPError) as info:  # the port is closed now
        OpenAIAgent(base_url=url, model="stub-model", tokenizer=tok, timeout_s=5).act(ctx, tools=(), seed=0)
    assert info.value.status is None and "cannot reach the server" in str(info.value)


def _drop_last_logprob(payload):
    payload = copy.deepcopy(payload)
    payload["choices"][0]["logprobs"]["token_logprobs"].pop()
    return payload


def _ids_as_strings(payload):
    payload = copy.deepcopy(payload)
    payload["choices"][0]["token_ids"] = [str(t) for t in payload["choices"][0]["token_ids"]]
    return payload


@pytest.mark.parametrize(
    "mutate, message",
    [
        (_drop_last_logprob, "malformed response: {n1} log-probs for {n} token ids"),
        (_ids_as_strings, "malformed response: choices[0].token_ids is not a list of integers"),
        (lambda p: {**p, "choices": []}, "malformed response: no choices[0]"),
    ],
)
def test_malformed_answers_are_typed_errors(tok, eot, episode, mutate, message):
    _, _, ctx = episode
    n = len(RuleGenerator(tok, eot).reply_ids(ctx.token_ids, 0))
    with _server(tok, eot, mutate=mutate) as server:
        with pytest.raises(OpenAIHTTPError) as info:
            OpenAIAgent(base_url=server.base_url, model="stub-model", tokenizer=tok).act(ctx, tools=(), seed=0)
    assert info.value.status == 200
    assert str(info.value).endswith(message.format(n=n, n1=n - 1))


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"temprature": 1.0}, "unknown parameter(s) ['temprature']"),
        ({"server_logprobs_mode": "raw_logits"}, "server_logprobs_mode='raw_logits'"),
        ({"on_timeout": "retry"}, "on_timeout='retry'"),
        ({"base_url": "localhost:8000"}, "base_url='localhost:8000' must be an http(s) URL"),
        ({"timeout_s": 0}, "timeout_s=0 must be a number > 0"),
        ({"max_tokens": 0}, "max_tokens=0 must be an integer >= 1"),
        ({"top_p": 0}, "top_p=0 must be in (0, 1]"),
        ({"api_key_env": "CTXKIT_TEST_SURELY_UNSET_VAR"}, "names an unset environment variable"),
        ({"base_url": None}, "base_url is required"),
        ({"model": None}, "model is required"),
    ],
)
def test_bad_config_is_a_config_error(kwargs, fragment):
    params = {"base_url": "http://127.0.0.1:9", "model": "m", **kwargs}
    params = {k: v for k, v in params.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        OpenAIAgent(**params)
    assert fragment in str(info.value)
    with pytest.raises(ConfigError) as info:
        OpenAIAgent.check_params(params)
    assert fragment in str(info.value)


@pytest.mark.slow
def test_real_model_behind_the_server_matches_the_local_agent(tok, episode):
    """SmolLM2 served over HTTP gives the same ids as the local agent, and the server's raw log-probs."""
    from ctxkit.experiment.agents.hf import TransformersAgent
    from ctxkit.experiment.agents.sampling import SamplingConfig

    _, _, ctx = episode
    local = TransformersAgent(tokenizer=tok, temperature=0.8, top_p=0.95, max_new_tokens=12)
    with StubOpenAIServer(generate=ModelGenerator(local), tokenizer=tok) as server:
        remote = OpenAIAgent(base_url=server.base_url, model="stub-model", tokenizer=tok, temperature=0.8, top_p=0.95, max_tokens=12)
        turn = remote.act(ctx, tools=TOOLS, seed=11)
    direct = local.generate(ctx.token_ids, seed=11, config=SamplingConfig(temperature=0.8, top_p=0.95, max_new_tokens=12))
    assert turn.token_ids == direct.token_ids
    assert turn.logprobs == pytest.approx(direct.raw_logprobs, abs=1e-12)
    assert turn.logprob_kind == "raw"
    assert turn.finish_reason == direct.finish_reason


def test_engine_finish_reasons_map_onto_the_step_vocabulary():
    from ctxkit.experiment.agents.openai_http import OpenAIHTTPError, engine_finish_reason

    url = "http://127.0.0.1:1/v1/completions"
    assert [engine_finish_reason(v, url=url) for v in (None, "", "stop", "length", "tool_calls", "abort")] == [
        "stop", "stop", "stop", "length", "tool_calls", "abort"]
    assert [engine_finish_reason(v, url=url) for v in ("eos_token", "stop_sequence", "max_tokens", "tool_use")] == [
        "stop", "stop", "length", "tool_calls"]
    with pytest.raises(OpenAIHTTPError, match=r"POST http://127.0.0.1:1/v1/completions -> HTTP 200: malformed response: finish_reason 'sleepy'"):
        engine_finish_reason("sleepy", url=url)
