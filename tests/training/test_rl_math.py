"""Seed checks of issue 4 (exact values) and properties of the RL arithmetic in `ctxkit.training.rl_math`."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from ctxkit.errors import ConfigError
from ctxkit.training.rl_math import (
    behaviour_logprobs,
    gae,
    gather_logprobs,
    importance_ratio,
    masked_mean,
    td_target,
    truncated_importance_weights,
)

# --- masked mean over actions ---------------------------------------------------------------------

SEED_MASK = [0] * 6 + [1] * 4 + [0] * 3 + [1] * 5 + [0] * 2


def seed_values() -> list[float]:
    values = [99.0] * 20
    actions = [i for i, m in enumerate(SEED_MASK) if m]
    for i in actions[:4]:
        values[i] = 2.0
    for i in actions[4:]:
        values[i] = 4.0
    return values


def test_masked_mean_seed_is_28_over_9():
    values = seed_values()
    assert len(values) == 20 and sum(SEED_MASK) == 9
    assert masked_mean(values, SEED_MASK) == 28 / 9
    wrong = sum(v * m for v, m in zip(values, SEED_MASK)) / 20  # dividing by the padded length
    assert wrong == 28 / 20
    assert masked_mean(values, SEED_MASK) != wrong


def test_masked_mean_ignores_nan_outside_mask():
    values = [math.nan if not m else v for v, m in zip(seed_values(), SEED_MASK)]
    assert masked_mean(values, SEED_MASK) == 28 / 9


@pytest.mark.parametrize(
    "values, mask, match",
    [
        ([1.0, 2.0], [0, 0], "no actions"),
        ([1.0, 2.0], [1, 2], "not binary: value 2.0 at flat position 1"),
        ([1.0, 2.0], [0.5, 1], "not binary"),
        ([1.0, 2.0, 3.0], [1, 0], r"shape \(2,\) does not match"),
        ([], [], "no actions"),
    ],
)
def test_masked_mean_errors(values, mask, match):
    with pytest.raises(ConfigError, match=match):
        masked_mean(values, mask)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.booleans()), min_size=1, max_size=50).filter(lambda xs: any(m for _, m in xs)))
def test_masked_mean_property_equals_mean_of_selected(pairs):
    values = [v for v, _ in pairs]
    mask = [int(m) for _, m in pairs]
    selected = [v for v, m in pairs if m]
    assert masked_mean(values, mask) == pytest.approx(math.fsum(selected) / len(selected), rel=1e-9, abs=1e-9)


# --- behaviour log-probs ----------------------------------------------------------------------------


def test_temperature_two_turns_08_02_into_two_thirds_one_third():
    logits = np.log([0.8, 0.2])
    probs = np.exp(behaviour_logprobs(logits, {"temperature": 2.0}))
    assert probs == pytest.approx([2 / 3, 1 / 3], rel=1e-12)


def test_ratio_against_behaviour_not_raw():
    behaviour = behaviour_logprobs(np.log([0.8, 0.2]), {"temperature": 2.0})
    new_lp = np.log([0.25])
    action = gather_logprobs(behaviour[None, :], [1])
    assert action.n_outside == 0
    ratio = importance_ratio(new_lp, action.logprobs, [1])
    assert ratio[0] == pytest.approx(0.75, rel=1e-12)
    raw = importance_ratio(new_lp, np.log([0.2]), [1])
    assert raw[0] == pytest.approx(1.25, rel=1e-12)  # the wrong direction: raw says "more likely now"


FOUR = np.log([0.5, 0.3, 0.15, 0.05])


def test_top_p_changes_support_and_reports_actions_outside():
    lp = behaviour_logprobs(FOUR, {"top_p": 0.75})
    assert np.exp(lp) == pytest.approx([0.625, 0.375, 0.0, 0.0], abs=1e-12)
    assert np.isneginf(lp[2]) and np.isneginf(lp[3])
    picked = gather_logprobs(np.stack([lp, lp, lp]), [0, 2, 3])
    assert picked.outside_support.tolist() == [False, True, True]
    assert picked.n_outside == 2
    with pytest.raises(ConfigError, match="behaviour_logprobs: non-finite log-prob -inf on an action at flat position 1"):
        importance_ratio(np.log([0.5, 0.1]), picked.logprobs[:2], [1, 1])


def test_top_k_and_min_p():
    assert np.exp(behaviour_logprobs(FOUR, {"top_k": 2})) == pytest.approx([0.625, 0.375, 0, 0], abs=1e-12)
    assert np.exp(behaviour_logprobs(FOUR, {"top_k": -1})) == pytest.approx([0.5, 0.3, 0.15, 0.05], abs=1e-12)
    assert np.exp(behaviour_logprobs(FOUR, {"min_p": 0.2})) == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0], abs=1e-12)


def test_order_hf_vs_vllm_differs_when_min_p_and_top_p_both_active():
    cfg = {"top_p": 0.82, "min_p": 0.2}
    hf = np.exp(behaviour_logprobs(FOUR, cfg, order="hf"))
    vllm = np.exp(behaviour_logprobs(FOUR, cfg, order="vllm"))
    assert hf == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0], abs=1e-12)
    assert vllm == pytest.approx([0.625, 0.375, 0, 0], abs=1e-12)


def test_greedy_and_torch_input():
    torch = pytest.importorskip("torch")
    lp = behaviour_logprobs(torch.tensor([[0.1, 2.0, 0.5]]), {"temperature": 0})
    assert isinstance(lp, np.ndarray)
    assert lp[0, 1] == 0.0 and np.isneginf(lp[0, 0]) and np.isneginf(lp[0, 2])


@pytest.mark.parametrize(
    "sampling, match",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"top_k": -3}, "top_k"),
        ({"repetition_penalty": 1.1}, "repetition_penalty"),
        ([("temperature", 1.0)], "expected a mapping"),
    ],
)
def test_bad_sampling_config(sampling, match):
    with pytest.raises(ConfigError, match=match):
        behaviour_logprobs(FOUR, sampling)


def test_bad_order_and_logits():
    with pytest.raises(ConfigError, match="unknown; expected one of"):
        behaviour_logprobs(FOUR, {}, order="sglang")
    with pytest.raises(ConfigError, match="NaN"):
        behaviour_logprobs([0.0, math.nan], {})
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        gather_logprobs(FOUR, 7)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(
    logits=arrays(np.float64, st.integers(2, 12), elements=st.floats(-8, 8)),
    temperature=st.sampled_from([0.5, 1.0, 1.7]),
    top_k=st.integers(0, 6),
    top_p=st.sampled_from([0.3, 0.6, 0.9, 1.0]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
)
def test_matches_transformers_logits_warpers(logits, temperature, top_k, top_p, min_p):
    """The `hf` order reproduces transformers' own warper chain (temperature, top-k, top-p, min-p)."""
    torch = pytest.importorskip("torch")
    lp_mod = pytest.importorskip("transformers.generation.logits_process")
    # keep clear of exact ties at a threshold, where either side is a valid choice
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    if len(np.unique(np.round(logits, 6))) != len(logits):
        return
    warpers = [lp_mod.TemperatureLogitsWarper(temperature)]
    if top_k > 0:
        warpers.append(lp_mod.TopKLogitsWarper(top_k))
    warpers.append(lp_mod.TopPLogitsWarper(top_p))
    if min_p > 0:
        warpers.append(lp_mod.MinPLogitsWarper(min_p))
    scores = torch.tensor(logits[None, :], dtype=torch.float64)
    ids = torch.zeros((1, 1), dtype=torch.long)
    for w in warpers:
        scores = w(ids, scores)
    expected = torch.log_softmax(scores, dim=-1)[0].numpy()
    got = behaviour_logprobs(logits, {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p})
    assert np.array_equal(np.isneginf(got), np.isneginf(expected))
    finite = np.isfinite(expected)
    assert got[finite] == pytest.approx(expected[finite], abs=1e-9)


# --- truncated IS -----------------------------------------------------------------------------------


def test_truncated_importance_weights_token_and_sequence():
    new = np.log([0.9, 0.5, 0.2, 0.5])
    old = np.log([0.3, 0.5, 0.4, 0.1])
    mask = [1, 1, 1, 0]
    tok = truncated_importance_weights(new, old, mask, clip=2.0)
    assert tok[:3] == pytest.approx([2.0, 1.0, 0.5], rel=1e-12)  # 3.0 clipped to 2.0
    assert math.isnan(tok[3])
    seq = truncated_importance_weights(new, old, mask, clip=2.0, level="sequence")
    assert seq[:3] == pytest.approx([1.5, 1.5, 1.5], rel=1e-12)  # 3 * 1 * 0.5
    assert math.isnan(seq[3])
    with pytest.raises(ConfigError, match="level"):
        truncated_importance_weights(new, old, mask, level="episode")


# --- episode ends -----------------------------------------------------------------------------------


def test_td_target_termination_vs_truncation():
    assert td_target(0.2, 0.8, 0.9, terminated=True) == 0.2
    assert td_target(0.2, 0.8, 0.9, terminated=False) == pytest.approx(0.92, rel=1e-12)
    with pytest.raises(ConfigError, match="must be a bool"):
        td_target(0.2, 0.8, 0.9, terminated="yes")
    with pytest.raises(ConfigError, match="bootstrap value"):
        td_target(0.2, math.nan, 0.9, terminated=False)


def test_gae_hand_computed_two_segments():
    # segment A = steps 0-1, truncated at 1 (bootstrap 1.0); segment B = steps 2-3, terminated at 3.
    res = gae(
        rewards=[1.0, 0.0, 2.0, 1.0],
        values=[0.5, 0.4, 0.3, 0.2],
        bootstrap_values=[math.nan, 1.0, math.nan, math.nan],
        terminated=[0, 0, 0, 1],
        boundary=[0, 1, 0, 1],
        gamma=0.5,
        lam=0.5,
    )
    # t3: 1 - 0.2 = 0.8; t2: 2 + 0.5*0.2 - 0.3 = 1.8, + 0.25*0.8 = 2.0
    # t1: 0 + 0.5*1.0 - 0.4 = 0.1 (bootstrapped, recursion stops); t0: 1 + 0.5*0.4 - 0.5 = 0.7, + 0.25*0.1
    assert res.advantages == pytest.approx([0.725, 0.1, 2.0, 0.8], rel=1e-12)
    assert res.returns == pytest.approx([1.225, 0.5, 2.3, 1.0], rel=1e-12)


def test_gae_terminated_vs_truncated_single_step_matches_td_target():
    for terminated, expected in ((1, 0.2), (0, 0.92)):
        res = gae([0.2], [0.0], [0.8], [terminated], [1], gamma=0.9, lam=0.95)
        assert res.advantages[0] == pytest.approx(expected, rel=1e-12)
        assert res.advantages[0] == pytest.approx(td_target(0.2, 0.8, 0.9, terminated=bool(terminated)), rel=1e-12)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"terminated": [1, 0], "boundary": [0, 1]}, "step 0 is terminated but not marked as a boundary"),
        ({"terminated": [0, 0], "boundary": [0, 0]}, "last step"),
        ({"terminated": [0, 0], "boundary": [0, 1], "bootstrap_values": [0.0, math.nan]}, "step 1 is truncated"),
        ({"values": [1.0]}, "values: shape"),
    ],
)
def test_gae_errors(kwargs, match):
    base = {"rewards": [1.0, 1.0], "values": [0.0, 0.0], "bootstrap_values": [0.0, 0.0], "terminated": [0, 1], "boundary": [0, 1]}
    base.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        gae(**base, gamma=0.9, lam=0.9)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-5, 5), st.floats(-5, 5), st.booleans()), min_size=1, max_size=20),
    st.booleans(),
    st.floats(-5, 5),
)
def test_gae_lambda_one_gamma_one_is_return_to_go_minus_value(steps, terminated, boot):
    """With gamma = lam = 1 the advantage is the (bootstrapped) return to the boundary minus the value."""
    rewards = [r for r, _, _ in steps]
    values = [v for _, v, _ in steps]
    boundary = [int(b) for _, _, b in steps]
    boundary[-1] = 1
    term = [0] * len(steps)
    term[-1] = int(terminated)
    boots = [boot] * len(steps)
    res = gae(rewards, values, boots, term, boundary, gamma=1.0, lam=1.0)
    for t in range(len(steps)):
        end = next(i for i in range(t, len(steps)) if boundary[i])
        tail = 0.0 if term[end] else boot
        expected = math.fsum(rewards[t : end + 1]) + tail - values[t]
        assert res.advantages[t] == pytest.approx(expected, abs=1e-9)
