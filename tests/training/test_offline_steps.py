"""Offline steps from real saved trajectories (tau-bench, SWE-agent): each assistant turn becomes a Step
with the template's ids and no behaviour log-probs; replay verifies n/n, samples carry exactly the
assistant ids as loss-bearing tokens, and audit calls the log offline (a live log without log-probs still fails)."""

from __future__ import annotations

import dataclasses

import pytest

from trajectory_logs import qwen, sweagent_conversation, tau_conversation, tau_episodes, write_offline_log
from ctxkit.training.preflight import audit
from ctxkit.context.builder import ContextBuilder
from ctxkit.log.conversation import import_conversation
from ctxkit.errors import ConfigError
from ctxkit.events import LOGPROB_KINDS, EpisodeStart, Message, Step, message_to_openai
from ctxkit.log.event_log import EventLog, read_events
from ctxkit.training.context_replay import verify_log
from ctxkit.training.offline_steps import OFFLINE_BUDGET, add_offline_steps
from ctxkit.text.rendering.renderer import encode_assistant_turn, render
from ctxkit.text.tokenizer.loader import load_tokenizer
from ctxkit.training.episode_samples import samples


def assistant_ids_in_order(steps):
    return [t for s in steps for t in s.token_ids]


def loss_ids(rows):
    return [t for s in rows for t, m in zip(s.token_ids, s.loss_mask) if m]


@pytest.fixture(scope="module")
def tau_events():
    return add_offline_steps(import_conversation(tau_conversation(0), episode_id="tau-0"), qwen())


def test_none_is_a_logprob_kind():
    assert LOGPROB_KINDS == ("raw", "processed", "recomputed", "none")


def test_each_assistant_message_becomes_an_offline_step(tau_events):
    source = import_conversation(tau_conversation(0), episode_id="tau-0")
    tok = load_tokenizer(qwen())
    tools = tau_conversation(0)["tools"]
    assert len(tau_events) == len(source) == 33
    steps = [e for e in tau_events if isinstance(e, Step)]
    assistants = [e for e in source if isinstance(e, Message) and e.role == "assistant"]
    assert len(steps) == len(assistants) == 15
    for step, msg in zip(steps, assistants):
        assert step.logprobs is None and step.logprob_kind == "none" and step.policy_version is None
        assert step.content == msg.content and step.tool_calls == msg.tool_calls
        assert step.finish_reason == ("tool_calls" if msg.tool_calls else "stop")
        chat = {k: v for k, v in message_to_openai(msg).items() if k != "name"}
        assert step.token_ids == encode_assistant_turn(chat, tok, None, tools)
    # every other event is kept as it was, in place
    assert [type(e).__name__ for e in tau_events] == [
        "Step" if isinstance(e, Message) and e.role == "assistant" else type(e).__name__ for e in source]


def test_step_contexts_are_the_keep_all_render_of_what_came_before(tau_events):
    tok = load_tokenizer(qwen())
    conv = tau_conversation(0)
    start = tau_events[0]
    assert isinstance(start, EpisodeStart)
    assert start.context == ContextBuilder(qwen(), compressor="keep-all", budget=OFFLINE_BUDGET, detect_pins=False).describe()
    k = 0
    for i, event in enumerate(tau_events[1:]):
        if isinstance(event, Step):
            expected = render(conv["messages"][:i], tok, tools=conv["tools"], add_generation_prompt=True)
            assert (event.context_hash, event.context_length) == (expected.hash, len(expected.token_ids))
            k += 1
    assert k == 15


def test_source_finish_reason_is_kept_when_known():
    conv = {"messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello, how can", "finish_reason": "length"},
                         {"role": "user", "content": "Go on"},
                         {"role": "assistant", "content": "I help?", "finish_reason": "not-a-reason"}]}
    steps = [e for e in add_offline_steps(import_conversation(conv), qwen()) if isinstance(e, Step)]
    assert [s.finish_reason for s in steps] == ["length", "stop"]


def test_an_episode_with_steps_is_refused(tmp_path, tau_events):
    log = EventLog.create(tmp_path / "ep.jsonl", episode_id="tau-0")
    log.extend(tau_events)
    recorded = log.events()
    with pytest.raises(ConfigError, match=r"already holds steps \(first at seq 3, event e3-09af44b1\)"):
        add_offline_steps(recorded, qwen())


def test_tau_bench_replays_gives_samples_and_audits_as_offline(tmp_path, capsys):
    ep = tau_episodes()[0]
    path = tmp_path / "tau.jsonl"
    write_offline_log(path, tau_conversation(0), episode_id="tau-0", reward=float(ep["reward"])).close()
    result = verify_log(path)
    assert (result.ok, result.n_ok, result.n_steps) == (True, 15, 15)
    steps = [e for e in read_events(path) if isinstance(e, Step)]
    rows = samples(str(path))
    assert rows and loss_ids(rows) == assistant_ids_in_order(steps)
    assert sum(s.n_sampled for s in rows) == 1599
    assert all(s.logprob_kind == "none" and s.reward == 0.0 and s.reward_kind == "scored" for s in rows)
    report = audit([path])
    assert report.ok and report.offline == (str(path),) and report.figures["offline_logs"] == 1
    assert [(c.name, c.checked, c.failed) for c in report.checks] == [
        ("record", 15, 0), ("rewards", 1, 0), ("distributions", 0, 0), ("ends", 1, 0), ("resume", 0, 0)]
    assert "offline log (not resumable): seq 13: tool call id 'call_HGn16KZh9oNCruxsMJ4gYXan' reused" in str(report.checks[4].warnings[0])
    from ctxkit.cli.parser import main

    assert main(["audit", str(path)]) == 0
    assert ("offline: 1 of 1 log(s) hold only offline steps (logprob_kind 'none', no behaviour log-probs): usable for "
            "supervised training, not for importance-weighted RL") in capsys.readouterr().out
    assert main(["replay", str(path), "--verify"]) == 0
    assert capsys.readouterr().out.strip().endswith("15/15 steps verify: ok")


def test_a_live_log_without_logprobs_still_fails_audit(tmp_path):
    path = tmp_path / "live.jsonl"
    events = [dataclasses.replace(e, seq=None, id=None, ts=None) for e in
              write_offline_log(tmp_path / "src.jsonl", tau_conversation(0), episode_id="tau-0", reward=0.0).events()]
    events = [dataclasses.replace(e, logprob_kind=None, policy_version=3, sampling={"temperature": 1.0, "seed": 1})
              if isinstance(e, Step) else e for e in events]
    EventLog.create(path, episode_id="tau-0").extend(events)
    report = audit([path])
    record = report.checks[0]
    assert not report.ok and report.offline == () and (record.checked, record.failed) == (15, 15)
    assert record.examples[0].message == "no log-probs for 22 sampled ids (behaviour log-probs cannot be reconstructed)"


def test_an_offline_step_with_logprobs_fails_audit(tmp_path):
    path = tmp_path / "bad.jsonl"
    events = [dataclasses.replace(e, seq=None, id=None, ts=None) for e in
              write_offline_log(tmp_path / "src.jsonl", tau_conversation(0), episode_id="tau-0", reward=0.0).events()]
    first = next(i for i, e in enumerate(events) if isinstance(e, Step))
    events[first] = dataclasses.replace(events[first], logprobs=(-0.5,) * len(events[first].token_ids))
    EventLog.create(path, episode_id="tau-0").extend(events)
    record = audit([path]).checks[0]
    assert record.failed == 1 and record.examples[0].message == "logprob_kind 'none' (an offline step) but log-probs are recorded"


def test_sweagent_episode(tmp_path):
    path = tmp_path / "swe.jsonl"
    write_offline_log(path, sweagent_conversation(), episode_id="marshmallow-1867").close()
    result = verify_log(path)
    assert (result.ok, result.n_ok, result.n_steps) == (True, 13, 13)
    steps = [e for e in read_events(path) if isinstance(e, Step)]
    assert steps[-1].tool_calls[0].name == "submit"
    rows = samples(str(path))
    assert rows and loss_ids(rows) == assistant_ids_in_order(steps) and sum(s.n_sampled for s in rows) == 1016


def test_a_trailing_unanswered_call_still_gets_its_step(tmp_path):
    """Each step's context is built before it, so an episode ending in a pending call needs no build of
    the final view."""
    messages = tau_conversation(0)["messages"]
    last = next(i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("tool_calls"))
    conv = {"messages": messages[: last + 1], "tools": tau_conversation(0)["tools"]}
    path = tmp_path / "pending.jsonl"
    write_offline_log(path, conv, episode_id="tau-0-pending").close()
    steps = [e for e in read_events(path) if isinstance(e, Step)]
    assert steps[-1].tool_calls and steps[-1].finish_reason == "tool_calls"
    result = verify_log(path)
    assert result.ok and result.n_ok == result.n_steps == len(steps)
    assert loss_ids(samples(str(path))) == assistant_ids_in_order(steps)
