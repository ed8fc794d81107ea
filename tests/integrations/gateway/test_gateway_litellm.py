"""A second client through the gateway: LiteLLM (the client most agent harnesses call models through; it comes
with mini-swe-agent), against the real engine. Its tool call is recorded token-exact, the episode replays,
becomes one sample, passes `ctxkit audit` and shows in `ctxkit view`."""

from __future__ import annotations

import json

import pytest

from conftest import require_module
from gateway_fixtures import SHOTS, TOOLS, engine, gateway_config, post, served  # noqa: F401 (engine: a fixture)
from ctxkit.cli.parser import main
from ctxkit.events import Step
from ctxkit.log.event_log import read_events
from ctxkit.training.context_replay import verify_log
from ctxkit.training.episode_samples import samples

pytestmark = pytest.mark.slow


def test_litellm_tool_episode_is_recorded_and_shows_in_the_viewer(engine, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm would fetch its price list
    litellm = require_module("litellm")
    head = {"X-Ctxkit-Episode": "litellm-ep"}
    with served(gateway_config(tmp_path / "logs"), engine) as (_, url):
        def ask(messages):
            return litellm.completion(model="openai/any", api_base=f"{url}/v1", api_key="unused", messages=messages,
                                      tools=TOOLS, temperature=0.0, max_tokens=40, extra_headers=head)

        messages = SHOTS + [{"role": "user", "content": "List the files in /home."}]
        first = ask(messages)
        (call,) = first.choices[0].message.tool_calls
        assert first.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, json.loads(call.function.arguments)) == ("ls", {"path": "/home"})
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "notes.md"}]
        second = ask(messages)
        assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content
        assert post(f"{url}/ctxkit/episodes/litellm-ep/end", {"reward": 1.0})[0] == 200
    path = tmp_path / "logs" / "litellm-ep.jsonl"
    events = read_events(path)
    steps = [e for e in events if isinstance(e, Step)]
    assert [s.tool_calls[0].id if s.tool_calls else None for s in steps] == [call.id, None]
    result = verify_log(events)
    assert (result.n_ok, result.n_steps) == (2, 2)
    assert len(samples(events)) == 1  # the answer's context extends the tool-call turn's
    assert main(["audit", str(path)]) == 0
    page = tmp_path / "view.html"
    assert main(["view", str(path), "-o", str(page)]) == 0
    html = page.read_text()
    assert "litellm-ep" in html and call.id in html
    capsys.readouterr()
