"""The `transformers` agent (real SmolLM2 on CPU, slow-marked) and the sampling math it uses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import tokenizer_dir
from ctxkit.errors import ConfigError
from ctxkit.events import EpisodeStart, Message
from ctxkit.experiment.agents.sampling import (
    SamplingConfig,
    make_generator,
    processed_logprobs,
    raw_logprobs,
    sample,
    token_distributions,
)
from ctxkit.training.rl_math import behaviour_logprobs

# ------------------------------------------------------------------------------------ sampling math


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"temperature": -0.1}, "temperature=-0.1 is invalid"),
        ({"temperature": math.inf}, "temperature=inf is invalid"),
        ({"top_k": -1}, "top_k=-1 is invalid"),
        ({"top_k": 2.5}, "top_k=2.5 is invalid"),
        ({"top_p": 0.0}, "top_p=0.0 is invalid"),
        ({"top_p": 1.5}, "top_p=1.5 is invalid"),
        ({"min_p": -0.5}, "min_p=-0.5 is invalid"),
        ({"max_new_tokens": 0}, "max_new_tokens=0 is invalid"),
        ({"max_new_tokens": True}, "max_new_tokens=True is invalid"),
    ],
)
def test_sampling_config_validation(kwargs, fragment):
    with pytest.raises(ConfigError) as info:
        SamplingConfig(**kwargs)
    assert fragment in str(info.value)


def test_sampling_config_record():
    cfg = SamplingConfig(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, max_new_tokens=64)
    assert cfg.to_dict(seed=3) == {"temperature": 0.7, "top_k": 50, "top_p": 0.9, "min_p": 0.05, "max_new_tokens": 64, "seed": 3}
    assert cfg.filters and not cfg.greedy
    assert SamplingConfig(temperature=0).greedy and not SamplingConfig().filters


_logits = st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=2, max_size=40).map(lambda xs: np.array(xs, dtype=np.float32))
_configs = st.builds(
    SamplingConfig,
    temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5]),
    top_k=st.sampled_from([0, 1, 3, 10]),
    top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1]),
    min_p=st.sampled_from([0.0, 0.05, 0.5]),
)


@settings(max_examples=200, deadline=None)
@given(_logits, _configs)
def test_property_distributions_are_rl_math_behaviour_logprobs(logits, cfg):
    proc, raw = token_distributions(logits, cfg)
    np.testing.assert_allclose(proc, behaviour_logprobs(logits, cfg.to_dict()), rtol=0, atol=1e-9)
    np.testing.assert_allclose(proc, processed_logprobs(logits, cfg), rtol=0, atol=1e-9)
    np.testing.assert_allclose(raw, behaviour_logprobs(logits, {"temperature": 1.0}), rtol=0, atol=1e-9)
    finite = np.isfinite(proc)
    assert finite.any()
    assert abs(np.logaddexp.reduce(proc[finite]) - 0.0) < 1e-9  # a normalized distribution
    assert np.isfinite(raw).all()
    if (~finite).any():  # the kept tokens are a top set: none dropped is likelier than one kept
        assert raw[finite].min() >= raw[~finite].max()
    assert int(np.argmax(logits)) in set(np.flatnonzero(finite))  # the arg-max always survives


@settings(max_examples=100, deadline=None)
@given(_logits, _configs, st.integers(0, 2**31 - 1))
def test_property_draws_are_seeded_and_inside_the_support(logits, cfg, seed):
    proc, _ = token_distributions(logits, cfg)
    draws = [sample(proc, make_generator(seed)) for _ in range(2)]
    assert draws[0] == draws[1]
    assert np.isfinite(proc[draws[0]])
    gen = make_generator(seed)
    seq = [sample(proc, gen) for _ in range(5)]
    gen = make_generator(seed)
    assert seq == [sample(proc, gen) for _ in range(5)]


def test_temperature_one_without_filters_is_raw_and_greedy_is_a_point_mass():
    logits = np.array([2.0, -1.0, 0.5, 2.0 - 1e-3, -30.0], dtype=np.float32)
    proc, raw = token_distributions(logits, SamplingConfig())
    assert proc is raw
    np.testing.assert_allclose(raw, logits - np.log(np.exp(logits.astype(np.float64)).sum()), atol=1e-12)
    greedy, _ = token_distributions(logits, SamplingConfig(temperature=0))
    assert greedy.tolist() == [0.0, -math.inf, -math.inf, -math.inf, -math.inf]
    assert sample(greedy, make_generator(0)) == 0
    hot, _ = token_distributions(logits, SamplingConfig(temperature=0.5))
    np.testing.assert_allclose(hot, raw_logprobs(logits.astype(np.float64) / 0.5), atol=1e-12)
    assert not np.allclose(hot, raw)


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"temprature": 0.5}, "unknown parameter(s) ['temprature']"),
        ({"model_path": "a", "model": "b"}, "give model_path or its alias model, not both"),
        ({"device": "tpu"}, "device='tpu'"),
        ({"dtype": "int8"}, "dtype='int8'"),
        ({"stop_token_ids": "2"}, "stop_token_ids='2' must be a list of token ids"),
        ({"top_p": 2.0}, "top_p=2.0 is invalid"),
        ({"max_new_tokens": -1}, "max_new_tokens=-1 is invalid"),
        ({"num_threads": 0}, "num_threads=0 must be an integer >= 1"),
    ],
)
def test_check_params_fails_before_any_model_load(params, fragment):
    from ctxkit.experiment.agents.hf import TransformersAgent

    with pytest.raises(ConfigError) as info:
        TransformersAgent.check_params(params)
    assert fragment in str(info.value)


def test_check_params_returns_the_sampling_config():
    from ctxkit.experiment.agents.hf import TransformersAgent

    cfg = TransformersAgent.check_params({"device": "cuda:1", "dtype": "bfloat16", "temperature": 0.7, "top_p": 0.95, "max_new_tokens": 96})
    assert cfg == SamplingConfig(temperature=0.7, top_p=0.95, max_new_tokens=96)


# ------------------------------------------------------------------------------------ the real model

TOOLS = (
    {"type": "function", "function": {"name": "echo", "description": "Echo a number.",
                                      "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}},
)


@pytest.fixture(scope="module")
def tok(smollm_tok):
    """SmolLM2's tokenizer: the model these agents run."""
    return smollm_tok


@pytest.fixture(scope="module")
def agent(tok):
    from ctxkit.experiment.agents.hf import TransformersAgent

    return TransformersAgent(tokenizer=tok, temperature=0.7, top_p=0.9, max_new_tokens=10)


def _episode(tok, user="Call echo with n=3."):
    from ctxkit.context.builder import ContextBuilder, MemoryLog

    log = MemoryLog()
    log.extend([EpisodeStart(episode_id="t-0", tools=TOOLS), Message(role="system", content="You are terse."), Message(role="user", content=user)])
    builder = ContextBuilder(tok, template="chatml-tools-v1", budget=4096, detect_pins=False)
    return log, builder, builder.build(log)


def _full_forward_logits(agent, ids):
    """Logits at every position from one forward over the whole sequence (no KV cache)."""
    import torch

    with torch.inference_mode():
        return agent.lm.model(input_ids=torch.tensor([list(ids)])).logits[0].float().numpy()


@pytest.mark.slow
def test_same_seed_same_turn_and_aligned_logprobs(agent, tok):
    _, _, ctx = _episode(tok)
    a = agent.act(ctx, tools=TOOLS, seed=7)
    b = agent.act(ctx, tools=TOOLS, seed=7)
    c = agent.act(ctx, tools=TOOLS, seed=8)
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs and a.raw_logprobs == b.raw_logprobs
    assert c.token_ids != a.token_ids
    assert len(a.token_ids) == len(a.logprobs) == len(a.raw_logprobs) >= 1
    assert all(lp <= 0 and math.isfinite(lp) for lp in a.logprobs + a.raw_logprobs)
    assert a.logprob_kind == "processed"
    assert a.logprobs != a.raw_logprobs  # temperature 0.7 and top-p 0.9 change the distribution
    assert a.sampling == {"temperature": 0.7, "top_k": 0, "top_p": 0.9, "min_p": 0.0, "max_new_tokens": 10,
                          "seed": 7, "order": "hf", "stop_token_ids": [0, 2]}
    assert a.policy_version == agent.lm.id and agent.name == f"transformers:{agent.lm.id}"
    assert a.timings["prefill_s"] > 0 and a.timings["decode_s"] > 0
    assert a.timings["generate_s"] == pytest.approx(a.timings["prefill_s"] + a.timings["decode_s"])


@pytest.mark.slow
def test_recorded_logprobs_match_a_full_forward_recompute(agent, tok):
    """What the KV-cached decode recorded is what a trainer recomputes from the same ids and Step.sampling."""
    _, _, ctx = _episode(tok)
    turn = agent.act(ctx, tools=TOOLS, seed=3)
    n = len(ctx.token_ids)
    logits = _full_forward_logits(agent, ctx.token_ids + turn.token_ids)[n - 1 : n - 1 + len(turn.token_ids)]
    picks = np.array(turn.token_ids)
    proc = np.take_along_axis(behaviour_logprobs(logits, turn.sampling), picks[:, None], axis=1)[:, 0]
    raw = np.take_along_axis(behaviour_logprobs(logits, {"temperature": 1.0}), picks[:, None], axis=1)[:, 0]
    np.testing.assert_allclose(turn.logprobs, proc, atol=2e-3)
    np.testing.assert_allclose(turn.raw_logprobs, raw, atol=2e-3)


@pytest.mark.slow
def test_the_kept_set_is_the_support_of_each_sampled_position(agent, tok):
    """Top-k 5: every position keeps exactly 5 ids (SmolLM2's logits have no tie at the 5th), listed, the sampled one
    among them, equal to the support a full-forward recompute keeps; top-p 0.9 keeps a varying set holding the
    sampled id; greedy keeps 1; unfiltered keeps the vocabulary, by size only. The step records it."""
    from ctxkit.experiment.agents.base import to_step
    from ctxkit.experiment.agents.sampling import SamplingConfig
    from ctxkit.kept_set import IDS_LIMIT

    _, _, ctx = _episode(tok)
    turn = agent.generate(ctx.token_ids, seed=4, config=SamplingConfig(temperature=0.8, top_k=5, max_new_tokens=8))
    kept = turn.kept_set
    assert len(kept) == len(turn.token_ids) >= 2 and kept.sizes == (5,) * len(turn.token_ids)
    assert (kept.top_k, kept.top_p, kept.min_p, kept.source, kept.ids_limit) == (5, 1.0, 0.0, "exact", IDS_LIMIT)
    assert all(t in ids for t, ids in zip(turn.token_ids, kept.ids))
    n = len(ctx.token_ids)
    logits = _full_forward_logits(agent, ctx.token_ids + turn.token_ids)[n - 1 : n - 1 + len(turn.token_ids)]
    support = [tuple(np.flatnonzero(np.isfinite(row)).tolist()) for row in behaviour_logprobs(logits, turn.sampling)]
    assert support == list(kept.ids)
    assert to_step(turn, ctx).kept_set == kept
    nucleus = agent.act(ctx, tools=TOOLS, seed=3).kept_set  # the agent's default: temperature 0.7, top-p 0.9
    assert nucleus.top_p == 0.9 and all(size >= 1 for size in nucleus.sizes)
    assert all(ids is None or len(ids) == size for ids, size in zip(nucleus.ids, nucleus.sizes))
    greedy = agent.generate(ctx.token_ids, seed=0, config=SamplingConfig(temperature=0, max_new_tokens=3))
    assert greedy.kept_set.sizes == (1,) * len(greedy.token_ids)
    assert list(greedy.kept_set.ids) == [(t,) for t in greedy.token_ids]
    free = agent.generate(ctx.token_ids, seed=0, config=SamplingConfig(temperature=1.0, max_new_tokens=2)).kept_set
    assert free.sizes == (agent.n_embeddings,) * len(free) and free.ids == (None,) * len(free)


@pytest.mark.slow
def test_temperature_one_unfiltered_processed_equals_raw(agent, tok):
    from ctxkit.experiment.agents.sampling import SamplingConfig

    _, _, ctx = _episode(tok)
    turn = agent.generate(ctx.token_ids, seed=5, config=SamplingConfig(temperature=1.0, max_new_tokens=6))
    assert turn.logprobs == turn.raw_logprobs


@pytest.mark.slow
def test_greedy_is_the_argmax_of_every_position(agent, tok):
    from ctxkit.experiment.agents.sampling import SamplingConfig

    _, _, ctx = _episode(tok)
    turn = agent.generate(ctx.token_ids, seed=0, config=SamplingConfig(temperature=0, max_new_tokens=8))
    other = agent.generate(ctx.token_ids, seed=12345, config=SamplingConfig(temperature=0, max_new_tokens=8))
    assert turn.token_ids == other.token_ids  # greedy does not depend on the seed
    assert turn.logprobs == (0.0,) * len(turn.token_ids)
    n = len(ctx.token_ids)
    logits = _full_forward_logits(agent, ctx.token_ids + turn.token_ids)[n - 1 : n - 1 + len(turn.token_ids)]
    assert tuple(int(i) for i in logits.argmax(axis=1)) == turn.token_ids


@pytest.mark.slow
def test_stops_at_end_of_turn_ids_and_at_max_new_tokens(agent, tok):
    from ctxkit.experiment.agents.hf import TransformersAgent
    from ctxkit.experiment.agents.sampling import SamplingConfig

    _, _, ctx = _episode(tok)
    greedy = SamplingConfig(temperature=0, max_new_tokens=8)
    full = agent.generate(ctx.token_ids, seed=0, config=greedy)
    assert full.finish_reason == "length" and len(full.token_ids) == 8
    # make the greedy run's third token an end-of-turn id: generation stops there and keeps it
    stopper = TransformersAgent(tokenizer=tok, temperature=0, max_new_tokens=8, stop_token_ids=[full.token_ids[2]])
    cut = stopper.generate(ctx.token_ids, seed=0)
    first = full.token_ids.index(full.token_ids[2])
    assert cut.finish_reason == "stop" and cut.token_ids == full.token_ids[: first + 1]
    # a short chat question: greedy SmolLM2 ends its turn with <|im_end|>
    _, _, hello = _episode(tok, user="Reply with the single word: hello")
    turn = TransformersAgent(tokenizer=tok, temperature=0, max_new_tokens=24).act(hello, tools=TOOLS, seed=0)
    assert turn.finish_reason == "stop" and turn.token_ids[-1] == tok.special_tokens["<|im_end|>"]
    assert turn.content is not None and "<|im_end|>" not in turn.content


@pytest.mark.slow
def test_token_out_feeds_the_next_context(agent, tok):
    from ctxkit.experiment.agents.base import to_step

    log, builder, ctx = _episode(tok)
    turn = agent.act(ctx, tools=TOOLS, seed=1)
    log.append(to_step(turn, ctx))
    log.append(Message(role="user", content="Again."))
    nxt = builder.build(log)
    n, m = len(ctx.token_ids), len(turn.token_ids)
    assert nxt.token_ids[:n] == ctx.token_ids and nxt.token_ids[n : n + m] == turn.token_ids
    assert nxt.loss_mask[n : n + m] == (1,) * m


@pytest.mark.slow
def test_tokenizer_and_context_checks(agent, tok):
    from ctxkit.experiment.agents.hf import TransformersAgent
    from ctxkit.text.tokenizer.loader import load_tokenizer

    qwen = load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))
    with pytest.raises(ConfigError) as info:
        TransformersAgent(tokenizer=qwen)
    assert "map" in str(info.value) and "token(s) to different ids" in str(info.value) and qwen.id in str(info.value)
    with pytest.raises(ConfigError) as info:
        TransformersAgent(tokenizer=tok, temprature=0.5)
    assert "unknown parameter(s) ['temprature']" in str(info.value)
    with pytest.raises(ConfigError):
        TransformersAgent(tokenizer=tok, model_path="x", model="y")
    # a context rendered with another tokenizer is refused before anything runs
    _, _, qctx = _episode(qwen)
    with pytest.raises(ConfigError) as info:
        agent.act(qctx, tools=TOOLS, seed=0)
    assert f"rendered with tokenizer {qwen.id}" in str(info.value)
    with pytest.raises(ConfigError) as info:
        agent.generate([1, 2, 49152, 5], seed=0)
    assert "token id 49152 at position 2" in str(info.value)
    with pytest.raises(ConfigError):
        agent.generate([], seed=0)
