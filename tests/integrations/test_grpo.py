"""GRPO under compression (`ctxkit.integrations.grpo`): advantages exact, specs checked, and a real loop on
SmolLM2-135M in both schedules recording which policy version sampled each step."""

from __future__ import annotations

import json

import pytest

from conftest import require_module, tokenizer_dir
from ctxkit.errors import ConfigError
from ctxkit.integrations.grpo import GrpoSpec, group_advantages


def test_group_advantages_are_normalized_within_each_group():
    adv = group_advantages([1.0, 0.0, 0.0, 0.0, 1.0, 1.0], 2)
    assert adv[:2] == pytest.approx([1.0, -1.0], abs=1e-5)
    assert adv[2:4] == [0.0, 0.0] and adv[4:] == [0.0, 0.0]  # a group that agrees teaches nothing


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "async"}, r"GrpoSpec\.mode='async': expected one of \['sync', 'one-step-off'\]"),
    ({"group_size": 1}, r"GrpoSpec\.group_size=1: a group needs >= 2 episodes"),
    ({"steps": 0}, r"GrpoSpec\.steps=0: expected an integer >= 1"),
    ({"seeds": ()}, r"GrpoSpec\.seeds is empty"),
])
def test_bad_specs_are_named(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        GrpoSpec(**{"task": "needle-recall", "seeds": (100,), **kwargs})


@pytest.mark.slow
@pytest.mark.parametrize("mode, lags", [("sync", [0, 0]), ("one-step-off", [0, 1])])
def test_every_step_records_the_policy_version_that_sampled_it(tmp_path, mode, lags):
    for module in ("torch", "transformers", "gguf"):
        require_module(module)
    from ctxkit.events import Step
    from ctxkit.integrations.grpo import run_grpo
    from ctxkit.log.file_format import read_events
    from ctxkit.text.tokenizer.loader import load_tokenizer

    tok = load_tokenizer(tokenizer_dir("smollm2-135m-instruct"))
    newline = tok.encode("\n")[0]  # a stop id the base model reaches quickly: turns end as answers, so they train
    spec = GrpoSpec(task="needle-recall", task_params={"n_files": 3, "lines_per_file": 3}, seeds=(100, 101),
                    compressor="window", compressor_params={"keep_first": 1}, budget=1024, steps=2, prompts=1,
                    group_size=2, max_steps=2, max_new_tokens=12, stop_token_ids=(newline,), mode=mode)
    history = run_grpo(spec, tmp_path, tokenizer=tok, threads=2)
    assert [h.lag for h in history] == lags and [h.behaviour_version for h in history] == [0, 0 if lags[1] else 1]
    logged = [json.loads(line) for line in (tmp_path / "grpo_log.jsonl").read_text().splitlines()]
    assert [r["lag"] for r in logged] == lags and all(r["episodes"] == 2 for r in logged)
    assert history[0].samples >= 1  # batch 0 is the same in both schedules (version 0, same seeds): one turn answered
    for h in history:
        assert len(h.logs) == 2 and h.samples + h.discarded >= 1
        versions = {e.policy_version for p in h.logs for e in read_events(p) if isinstance(e, Step)}
        assert len(versions) == 1 and versions.pop().endswith(f"+v{h.behaviour_version}")
        if h.samples:
            assert h.loss_tokens > 0
            # nothing was rewarded (zero advantages leave the weights as they are), so every batch is on-policy
            # in effect: the trainer's recomputed log-probs reproduce the recorded ones
            assert h.mean_ratio == pytest.approx(1.0, abs=1e-3)
            assert (h.mean_tis_weight is None) == (mode == "sync")
    assert (tmp_path / "checkpoint" / "config.json").is_file() and (tmp_path / "checkpoint" / "tokenizer.json").is_file()
    with pytest.raises(ConfigError, match="checkpoint already exists"):  # refused before any rollout
        run_grpo(spec, tmp_path, tokenizer=tok, threads=2)
    assert len((tmp_path / "grpo_log.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
def test_the_saved_policy_holds_the_trained_weights_and_the_agent_loads_it(tmp_path):
    for module in ("torch", "transformers", "gguf"):
        require_module(module)
    import torch

    from ctxkit.context.models import load_causal_lm
    from ctxkit.experiment.agents.hf import TransformersAgent
    from ctxkit.integrations.grpo import save_policy
    from ctxkit.integrations.trl import trainable_copy
    from ctxkit.text.tokenizer.loader import load_tokenizer

    base = load_causal_lm()
    model = trainable_copy(base.model)
    name, param = next((n, p) for n, p in model.named_parameters() if p.ndim == 1)
    with torch.no_grad():
        param.add_(0.5)  # a stand-in for an update: the base weights plus a known shift
    folder = save_policy(model, base.hf_tokenizer, tmp_path / "checkpoint")
    assert not (tmp_path / "checkpoint.partial").exists()
    loaded = TransformersAgent(tokenizer=load_tokenizer(tokenizer_dir("smollm2-135m-instruct")),
                               model_path=str(folder)).lm
    saved = dict(loaded.model.named_parameters())[name]
    original = dict(base.model.named_parameters())[name]
    assert torch.equal(saved, param) and torch.allclose(saved - original, torch.full_like(original, 0.5))
    assert loaded.hf_tokenizer("hello")["input_ids"] == base.hf_tokenizer("hello")["input_ids"]
    with pytest.raises(ConfigError, match="checkpoint already exists"):
        save_policy(model, base.hf_tokenizer, folder)
