"""mini-swe-agent, unmodified (its `DefaultAgent`, text-based litellm model and local environment, configured by
its own `default.yaml`), run on a tiny task in a temporary git repository against the gateway in front of the
real engine: one episode found by its history alone (no header), every model call one recorded step. A reply
mini-swe-agent rejects for its format is dropped from the history it sends next: each such drop is one harness
compaction, and the samples split there and nowhere else (no false split); the log replays n/n."""

from __future__ import annotations

import subprocess

import pytest

from conftest import require_module
from gateway_fixtures import gateway_config, served
from ctxkit.edits import DropEdit
from ctxkit.events import Compaction, Step
from ctxkit.experiment.engine_server import LlamaServer, LlamaServerSpec
from ctxkit.integrations.gateway.gateway import EngineSpec
from ctxkit.log.event_log import read_events
from ctxkit.training.context_replay import verify_log
from ctxkit.training.episode_samples import samples

pytestmark = pytest.mark.slow


@pytest.fixture()
def repo(tmp_path):
    """A one-file git repository holding a tiny bug."""
    path = tmp_path / "repo"
    path.mkdir()
    (path / "hello.py").write_text('print("helo")\n')
    for cmd in (["git", "init", "-q"], ["git", "add", "hello.py"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=path, check=True)
    return path


def test_mini_swe_agent_runs_unmodified_through_the_gateway(tmp_path, repo, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm would fetch its price list
    monkeypatch.setenv("MSWEA_COST_TRACKING", "ignore_errors")  # a local model has no price
    require_module("minisweagent")
    import yaml
    from minisweagent import package_dir
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    config = yaml.safe_load((package_dir / "config" / "default.yaml").read_text())
    logs = tmp_path / "logs"

    with LlamaServer(LlamaServerSpec(n_ctx=8192, n_threads=1)) as server, \
            served(gateway_config(logs, budget=8192, max_tokens=48, record_only=True),
                   EngineSpec(server.base_url, server.model, "llama-cpp")) as (gateway, url):
        model = LitellmTextbasedModel(model_name="openai/smollm2", **{
            **config["model"], "model_kwargs": {**config["model"]["model_kwargs"], "api_base": f"{url}/v1",
                                                "api_key": "unused", "temperature": 0.0, "max_tokens": 48}})
        agent = DefaultAgent(model, LocalEnvironment(**{**config["environment"], "cwd": str(repo), "timeout": 10}),
                             **{**config["agent"], "step_limit": 3})
        result = agent.run("hello.py prints 'helo'; make it print 'hello'.")
        (episode,) = gateway.episodes()
    assert agent.n_calls >= 1, result
    events = read_events(logs / f"{episode}.jsonl")
    steps = [e for e in events if isinstance(e, Step)]
    assert len(steps) == agent.n_calls
    kept = [m["content"] for m in agent.messages if m.get("role") == "assistant"]
    dropped = [s for s in steps[:-1] if s.content not in kept]  # replies it rejected, then called again without
    compactions = [e for e in events if isinstance(e, Compaction)]
    assert len(compactions) == len(dropped)
    for compaction in compactions:  # each drops exactly the reply just before it, nothing else
        before = [s for s in steps if s.seq < compaction.seq][-1]
        assert compaction.edits == (DropEdit((before.id,)),)
    assert verify_log(events).n_ok == len(steps)
    assert len(samples(events)) == 1 + len(compactions)  # split at its own rewrites, and nowhere else
