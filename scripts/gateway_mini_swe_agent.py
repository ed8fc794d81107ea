"""The README's mini-swe-agent figures: mini-swe-agent, unmodified (its `DefaultAgent`, text-based litellm model
and local environment, configured by its own `default.yaml`), on three tiny tasks in temporary git repositories,
through `ctxkit serve` (record-only) in front of llama.cpp's server with SmolLM2-135M; per episode: steps, harness
compactions, samples, false splits (samples - 1 - compactions) and replay.

Run from the repository root, with the test extra installed: `python scripts/gateway_mini_swe_agent.py`
(a few minutes on 2 cores). It reuses the gateway tests' fixtures (`tests/integrations/gateway/gateway_fixtures.py`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integrations" / "gateway")]
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm would fetch its price list
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")  # a local model has no price

import yaml  # noqa: E402
from minisweagent import package_dir  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel  # noqa: E402

from gateway_fixtures import gateway_config, served  # noqa: E402
from ctxkit.events import Compaction, Step  # noqa: E402
from ctxkit.experiment.engine_server import LlamaServer, LlamaServerSpec  # noqa: E402
from ctxkit.integrations.gateway.gateway import EngineSpec  # noqa: E402
from ctxkit.log.event_log import read_events  # noqa: E402
from ctxkit.training.context_replay import verify_log  # noqa: E402
from ctxkit.training.episode_samples import samples  # noqa: E402

TASKS = ("hello.py prints 'helo'; make it print 'hello'.", "Add a file NOTES.md containing the word done.",
         "Rename hello.py to main.py.")
"""One task per episode, each in a fresh one-file repository."""


def make_repo(path: Path) -> Path:
    """A one-file git repository holding a tiny bug."""
    path.mkdir()
    (path / "hello.py").write_text('print("helo")\n')
    for cmd in (["git", "init", "-q"], ["git", "add", "hello.py"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=path, check=True)
    return path


def main() -> int:
    config = yaml.safe_load((package_dir / "config" / "default.yaml").read_text())
    tmp = Path(tempfile.mkdtemp(prefix="ctxkit-msa-"))
    logs = tmp / "logs"
    spec = gateway_config(logs, budget=8192, max_tokens=160, record_only=True)
    with LlamaServer(LlamaServerSpec(n_ctx=8192, n_threads=1)) as server, \
            served(spec, EngineSpec(server.base_url, server.model, "llama-cpp")) as (_, url):
        for k, task in enumerate(TASKS):
            repo = make_repo(tmp / f"repo{k}")
            kwargs = {**config["model"]["model_kwargs"], "api_base": f"{url}/v1", "api_key": "unused",
                      "temperature": 0.7, "max_tokens": 160}
            model = LitellmTextbasedModel(model_name="openai/smollm2", **{**config["model"], "model_kwargs": kwargs})
            env = LocalEnvironment(**{**config["environment"], "cwd": str(repo), "timeout": 10})
            result = DefaultAgent(model, env, **{**config["agent"], "step_limit": 5}).run(task)
            print(f"task {k}: exit {result.get('exit_status')}")
    for path in sorted(logs.glob("*.jsonl")):
        events = read_events(path)
        steps = [e for e in events if isinstance(e, Step)]
        compactions = sum(isinstance(e, Compaction) for e in events)
        n = len(samples(events))
        replay = verify_log(events)
        print(f"{path.name}: {len(steps)} steps, {compactions} harness compactions, {n} samples, "
              f"{n - 1 - compactions} false splits, replay {replay.n_ok}/{replay.n_steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
