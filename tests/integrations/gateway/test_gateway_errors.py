"""Bad input and failures get OpenAI-style JSON errors with exact statuses, and never a damaged log: malformed
bodies (400), oversized ones (413), unknown episodes (404), ended ones (409), an engine that is down or answers
badly (502, the stub engine injecting the fault). Idle episodes and a shutdown end episodes `truncated`."""

from __future__ import annotations

import json
import time

import pytest

from gateway_fixtures import TOOLS, gateway_config, get, post, served, stub_module
from ctxkit.events import EpisodeEnd, EpisodeStart, Message, Step
from ctxkit.experiment.engine_server import free_port
from ctxkit.integrations.gateway.gateway import EngineSpec
from ctxkit.log.event_log import read_events, verify

ASK = [{"role": "system", "content": "You list folders."}, {"role": "user", "content": "List /tmp."}]


def _error(message, kind="invalid_request_error", param=None, code=None):
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@pytest.fixture()
def dead(tmp_path):
    """A gateway whose engine is down (nothing listens on its port); yields (gateway, url, engine port)."""
    port = free_port()
    with served(gateway_config(tmp_path / "logs"), EngineSpec(f"http://127.0.0.1:{port}", "m", timeout_s=5.0),
                max_body_bytes=4096) as (gateway, url):
        yield gateway, url, port


def test_malformed_bodies_are_400_and_record_nothing(dead, tmp_path):
    gateway, url, _ = dead
    chat = f"{url}/v1/chat/completions"
    assert post(chat, b"{not json")[:2] == (400, _error(
        "the request body is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"))
    assert post(chat, [1, 2])[:2] == (400, _error("the request body is a JSON list; expected an object"))
    assert post(chat, {"model": "m"})[:2] == (400, _error("messages must be a non-empty list of message objects",
                                                         param="messages"))
    assert post(chat, {"messages": ASK, "n": 2})[:2] == (400, _error(
        "n=2: the gateway samples one choice per request", param="n"))
    assert post(chat, {"messages": ASK, "temperature": 3})[:2] == (400, _error(
        "temperature=3 must be a number in [0.0, 2.0]", param="temperature"))
    assert post(chat, {"messages": ASK, "stop": ["\n"]})[:2] == (400, _error(
        "stop=['\\n'] is not supported: the gateway records the sampling it does, and would not do this", param="stop"))
    assert post(chat, {"messages": [{"role": "robot", "content": "hi"}]})[:2] == (400, _error(
        "messages[0]: unknown role 'robot'; expected one of ['system', 'user', 'assistant', 'tool']", param="messages"))
    orphan = ASK + [{"role": "tool", "tool_call_id": "c9", "content": "x"}]
    status, body, _ = post(chat, {"messages": orphan})
    assert status == 400 and body["error"]["param"] == "messages"
    assert body["error"]["message"].startswith("messages: ") and "'c9'" in body["error"]["message"]
    assert post(chat, {"messages": ASK}, headers={"X-Ctxkit-Episode": "../etc"})[:2] == (400, _error(
        "X-Ctxkit-Episode: episode id '../etc' must be 1-128 characters of A-Za-z0-9._- starting with a letter or "
        "digit", param="X-Ctxkit-Episode"))
    assert gateway.episodes() == {} and not list((tmp_path / "logs").glob("*.jsonl"))


def test_an_oversized_body_is_413(dead):
    _, url, _ = dead
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    status, body, _ = post(f"{url}/v1/chat/completions", big)
    assert status == 413
    size = len(json.dumps(big).encode())
    assert size == 5047 and body == _error(f"request body of {size} bytes is over the limit of 4096",
                                           code="request_too_large")


def test_unknown_routes_and_episodes_are_404(dead):
    _, url, _ = dead
    assert get(f"{url}/v2/nothing") == (404, _error("GET /v2/nothing: Not Found", kind="not_found_error"))
    assert post(f"{url}/ctxkit/episodes/nope/end", {})[:2] == (404, _error(
        "no episode 'nope'", kind="not_found_error", code="episode_not_found"))
    assert get(f"{url}/v1/models") == (200, {"object": "list", "data": [
        {"id": "m", "object": "model", "created": 0, "owned_by": "ctxkit-gateway"}]})


def test_engine_down_is_502_and_the_log_keeps_the_messages_once(dead, tmp_path):
    gateway, url, port = dead
    head = {"X-Ctxkit-Episode": "ep-down"}
    expected = _error(f"engine failed: POST http://127.0.0.1:{port}/v1/completions: cannot reach the server: "
                      "[Errno 111] Connection refused", kind="server_error", code="engine_error")
    for _ in range(2):  # the retry appends nothing new
        status, body, _ = post(f"{url}/v1/chat/completions", {"messages": ASK, "tools": TOOLS}, headers=head)
        assert (status, body) == (502, expected)
    path = tmp_path / "logs" / "ep-down.jsonl"
    assert verify(path).ok
    events = read_events(path)
    assert [type(e) for e in events] == [EpisodeStart, Message, Message]
    assert post(f"{url}/v1/chat/completions", {"messages": ASK, "tools": []}, headers=head)[:2] == (400, _error(
        "episode ep-down: the request offers other tools than its first request; an episode's tools are fixed "
        "(start a new episode)", param="tools"))
    # ending it: a bad field is 400, then the end is recorded once; a second end and a new request are 409
    assert post(f"{url}/ctxkit/episodes/ep-down/end", {"outcome": "done"})[:2] == (400, _error(
        "episode_end event: outcome='done' is not one of ['terminated', 'truncated']", param="outcome"))
    assert post(f"{url}/ctxkit/episodes/ep-down/end", {"reward": 0.5})[:2] == (200, {
        "episode_id": "ep-down", "log": str(path), "steps": 0, "harness_compactions": 0, "outcome": "terminated",
        "cause": "harness_end"})
    assert post(f"{url}/ctxkit/episodes/ep-down/end", {})[:2] == (409, _error(
        "episode ep-down has already ended", kind="conflict_error", code="episode_ended"))
    assert post(f"{url}/v1/chat/completions", {"messages": ASK, "tools": TOOLS}, headers=head)[:2] == (409, _error(
        "episode ep-down has ended", kind="conflict_error", code="episode_ended"))
    end = read_events(path)[-1]
    assert isinstance(end, EpisodeEnd) and (end.outcome, end.reward, end.reward_kind) == ("terminated", 0.5, "scored")
    assert verify(path).ok


@pytest.mark.parametrize("fault", ["status", "no_choices", "finish"])
def test_an_engine_answering_badly_is_502_and_records_no_step(tmp_path, smollm_tok, fault):
    stub = stub_module()
    eos = smollm_tok.special_tokens["<|im_end|>"]
    mutate = {"no_choices": lambda p: {**p, "choices": []},
              "finish": lambda p: {**p, "choices": [{**p["choices"][0], "finish_reason": "exploded"}]}}.get(fault)
    with stub.StubOpenAIServer(stub.RuleGenerator(smollm_tok, eos), smollm_tok, fail_status=500 if fault == "status"
                               else None, mutate=mutate) as engine:
        with served(gateway_config(tmp_path), EngineSpec(engine.base_url, "stub-model")) as (_, url):
            status, body, _ = post(f"{url}/v1/chat/completions", {"messages": ASK}, headers={"X-Ctxkit-Episode": "e"})
    url = f"{engine.base_url}/v1/completions"
    message = {"status": f"POST {url} -> HTTP 500: server error: "
                         '{"error": {"message": "injected failure", "type": "InternalServerError"}}',
               "no_choices": f"POST {url} -> HTTP 200: malformed response: no choices[0]",
               "finish": f"POST {url} -> HTTP 200: malformed response: finish_reason 'exploded' is neither one of "
                         "['stop', 'length', 'tool_calls', 'content_filter', 'function_call', 'abort', 'error'] nor "
                         "a known dialect (['end_turn', 'eos_token', 'max_tokens', 'stop_sequence', 'tool_use'])"}[fault]
    assert (status, body) == (502, _error("engine failed: " + message, kind="server_error", code="engine_error"))
    events = read_events(tmp_path / "e.jsonl")  # ended by the shutdown, no step
    assert not any(isinstance(e, Step) for e in events)
    assert (events[-1].outcome, events[-1].cause, events[-1].reward_kind) == ("truncated", "gateway_shutdown",
                                                                             "limit_truncation")


def test_idle_episodes_end_truncated(dead, tmp_path):
    gateway, url, _ = dead
    post(f"{url}/v1/chat/completions", {"messages": ASK}, headers={"X-Ctxkit-Episode": "idle"})
    assert gateway.reap_idle(time.monotonic() + 1.0) == []  # not idle long enough (600 s)
    assert gateway.reap_idle(time.monotonic() + 601.0) == ["idle"]
    end = read_events(tmp_path / "logs" / "idle.jsonl")[-1]
    assert (end.outcome, end.cause, end.reward, end.reward_kind, dict(end.scores)) == (
        "truncated", "idle_timeout", None, "limit_truncation", {"idle_timeout_s": 600.0})
