"""The gateway in front of the real engine (llama.cpp's server with SmolLM2-135M), driven by the plain `openai`
client as a harness would: a multi-turn episode with a tool call is recorded token-exact, replays
(`ctxkit replay --verify`), becomes one sample and passes `ctxkit audit`; a harness-side history rewrite gives
exactly one harness compaction and one split; concurrent episodes are recorded whole."""

from __future__ import annotations

import json
import threading

import pytest

from conftest import require_module
from gateway_fixtures import SHOTS, TOOLS, engine, gateway_config, post, served  # noqa: F401 (engine: a fixture)
from ctxkit.cli.parser import main
from ctxkit.edits import DropEdit
from ctxkit.events import Compaction, EpisodeEnd, Step
from ctxkit.integrations.gateway.episode import HARNESS_COMPRESSOR
from ctxkit.log.event_log import read_events
from ctxkit.training.context_replay import verify_log
from ctxkit.training.episode_samples import samples

pytestmark = pytest.mark.slow




@pytest.fixture()
def client_for():
    openai = require_module("openai")
    return lambda url: openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def _ask(client, messages, **kw):
    return client.chat.completions.create(model="any", messages=messages, tools=TOOLS, temperature=0.0,
                                          max_tokens=40, **kw)


def test_a_tool_episode_is_recorded_replays_becomes_one_sample_and_passes_audit(engine, client_for, tmp_path, capsys):
    head = {"X-Ctxkit-Episode": "tool-ep"}
    with served(gateway_config(tmp_path), engine) as (gateway, url):
        client = client_for(url)
        messages = SHOTS + [{"role": "user", "content": "List the files in /home."}]
        first = _ask(client, messages, extra_headers=head)
        (call,) = first.choices[0].message.tool_calls
        assert first.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, json.loads(call.function.arguments)) == ("ls", {"path": "/home"})
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "notes.md"}]
        second = _ask(client, messages, extra_headers=head)
        assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content
        assert post(f"{url}/ctxkit/episodes/tool-ep/end", {"reward": 1.0})[0] == 200
    path = tmp_path / "tool-ep.jsonl"
    events = read_events(path)
    steps = [e for e in events if isinstance(e, Step)]
    assert [s.tool_calls[0].id if s.tool_calls else None for s in steps] == [call.id, None]
    assert steps[0].tool_calls[0].arguments == call.function.arguments
    for step, answer in zip(steps, (first, second)):
        assert step.logprob_kind == "raw" and len(step.logprobs) == len(step.token_ids) == answer.usage.completion_tokens
        assert step.context_length == answer.usage.prompt_tokens and step.sampling["temperature"] == 0.0
        assert step.sampling["engine"]["prompt_match"] is True and step.sampling["engine"]["completion_drift_tokens"] == 0
    assert not any(isinstance(e, Compaction) for e in events)
    assert (events[-1].outcome, events[-1].reward, events[-1].reward_kind) == ("terminated", 1.0, "scored")
    result = verify_log(events)
    assert (result.n_ok, result.n_steps) == (2, 2)
    (sample,) = samples(events)  # the second context extends the first: one sample, loss on the sampled ids only
    assert sample.step_seqs == tuple(s.seq for s in steps)
    assert sum(sample.loss_mask) == sum(len(s.token_ids) for s in steps)
    assert main(["replay", str(path), "--verify"]) == 0
    assert main(["audit", str(path)]) == 0
    assert "audit: ok" in capsys.readouterr().out


def test_a_harness_rewrite_is_one_compaction_and_one_split(engine, client_for, tmp_path):
    """No header: the episode is found by its history, before and after the harness drops its worked examples."""
    with served(gateway_config(tmp_path, record_only=True), engine) as (gateway, url):
        client = client_for(url)
        messages = SHOTS + [{"role": "user", "content": "List the files in /etc."}]
        first = _ask(client, messages)
        episode = first.model_extra["ctxkit"]["episode_id"]
        (call,) = first.choices[0].message.tool_calls
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "hosts"}]
        second = _ask(client, messages)
        # the harness compacts: the worked examples go, the task's own turns stay
        messages = messages[:1] + messages[len(SHOTS):] + [second.choices[0].message.model_dump(exclude_none=True),
                                                           {"role": "user", "content": "List the files in /var."}]
        third = _ask(client, messages)
        assert [a.model_extra["ctxkit"]["episode_id"] for a in (second, third)] == [episode, episode]
        assert gateway.episodes()[episode]["harness_compactions"] == 1
    events = read_events(tmp_path / f"{episode}.jsonl")
    (compaction,) = [e for e in events if isinstance(e, Compaction)]
    shot_ids = tuple(sorted(e.id for e in events[2:2 + len(SHOTS) - 1]))
    assert compaction.compressor == HARNESS_COMPRESSOR and compaction.edits == (DropEdit(shot_ids),)
    steps = [e for e in events if isinstance(e, Step)]
    assert len(steps) == 3 and steps[1].seq < compaction.seq < steps[2].seq
    assert (events[-1].outcome, events[-1].cause) == ("truncated", "gateway_shutdown")
    assert verify_log(events).n_ok == 3
    first_sample, second_sample = samples(events)  # split at the rewrite, and only there
    assert first_sample.step_seqs == (steps[0].seq, steps[1].seq) and second_sample.step_seqs == (steps[2].seq,)


def test_concurrent_episodes_are_each_recorded_whole(engine, tmp_path):
    """4 clients x 5 requests, at most 2 served at once: every answer 200, every log whole, one sample each."""
    errors: list[str] = []

    def client(k: int, url: str) -> None:
        messages = [{"role": "user", "content": f"Say a word about the number {k}."}]
        head = {"X-Ctxkit-Episode": f"load-{k}"}
        for i in range(5):
            status, answer, headers = post(f"{url}/v1/chat/completions", {
                "messages": messages, "max_tokens": 6, "temperature": 0.0}, headers=head)
            if status != 200 or headers.get("x-ctxkit-episode") != f"load-{k}":
                errors.append(f"client {k} request {i}: {status} {answer}")
                return
            messages += [answer["choices"][0]["message"], {"role": "user", "content": "Another."}]
        if post(f"{url}/ctxkit/episodes/load-{k}/end", {"reward": 0.0})[0] != 200:
            errors.append(f"client {k}: end refused")

    with served(gateway_config(tmp_path), engine, max_concurrent=2) as (_, url):
        threads = [threading.Thread(target=client, args=(k, url)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    for k in range(4):
        events = read_events(tmp_path / f"load-{k}.jsonl")
        assert sum(isinstance(e, Step) for e in events) == 5 and isinstance(events[-1], EpisodeEnd)
        assert verify_log(events).n_ok == 5 and len(samples(events)) == 1


def test_a_streamed_answer_is_the_recorded_step(engine, client_for, tmp_path):
    with served(gateway_config(tmp_path), engine) as (_, url):
        chunks = list(client_for(url).chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Name a colour."}], temperature=0.0, max_tokens=6,
            stream=True, extra_headers={"X-Ctxkit-Episode": "streamed"}))
    (step,) = [e for e in read_events(tmp_path / "streamed.jsonl") if isinstance(e, Step)]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == step.content
    assert [c.choices[0].finish_reason for c in chunks] == [None, step.finish_reason]
