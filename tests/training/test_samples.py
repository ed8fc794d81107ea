"""Training samples from real logs: merged by exact extension, split after a compaction or a
history-rewriting template (prompt = exactly that step's context), shared prefixes referenced, log-probs
aligned to the mask, reward provenance carried."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import require_module, shared_path, tokenizer_dir
from rollout_driver import Driver
from ctxkit.context.builder import ContextBuilder
from ctxkit.errors import ReplayError
from ctxkit.events import Compaction, EpisodeEnd, EpisodeStart, Message, Step
from ctxkit.log.event_log import EventLog
from ctxkit.training.context_replay import replay
from ctxkit.training.rl_math import masked_mean
from ctxkit.training.episode_samples import samples, split_statistics


def qwen() -> str:
    return str(tokenizer_dir("qwen2.5-instruct"))


def run(path, compressor="keep-all", budget=4096, n_turns=5, params=None, tokenizer=None):
    builder = ContextBuilder(tokenizer or qwen(), compressor=compressor, params=params or {}, budget=budget)
    log = EventLog.create(path, episode_id="ep-s")
    Driver(n_turns=n_turns, episode_id="ep-s").run(log, builder)
    return log


def contexts(log):
    n = sum(isinstance(e, Step) for e in log.events())
    return [replay(log, step=k).token_ids for k in range(n)]


def check_faithful(log, out):
    """The invariants every sample list must satisfy against its log."""
    steps = [e for e in log.events() if isinstance(e, Step)]
    ctxs = contexts(log)
    by_seq = {s.seq: (s, c) for s, c in zip(steps, ctxs)}
    assert [q for s in out for q in s.step_seqs] == [s.seq for s in steps]  # every step exactly once, in order
    for sample in out:
        first_step, first_ctx = by_seq[sample.step_seqs[0]]
        assert sample.token_ids[: sample.prompt_len] == first_ctx  # the prompt is exactly that context
        assert len(sample.token_ids) == len(sample.loss_mask) == len(sample.logprobs) == len(sample.token_step)
        for k, seq in enumerate(sample.step_seqs):
            step, ctx = by_seq[seq]
            assert sample.token_ids[: len(ctx)] == ctx  # each merged context extends the sample token for token
            span = slice(len(ctx), len(ctx) + len(step.token_ids))
            assert sample.token_ids[span] == step.token_ids
            assert set(sample.loss_mask[span]) == {1} and set(sample.token_step[span]) == {k}
            assert sample.logprobs[span] == step.logprobs
        sampled = [t for t, m in zip(sample.token_ids, sample.loss_mask) if m]
        assert sampled == [t for seq in sample.step_seqs for t in by_seq[seq][0].token_ids]
        assert all((lp is None) == (m == 0) for lp, m in zip(sample.logprobs, sample.loss_mask))
        if sample.prefix_sample is not None:
            ref = out[sample.prefix_sample]
            assert sample.token_ids[: sample.prefix_len] == ref.token_ids[: sample.prefix_len]
            assert sample.prefix_len <= sample.prompt_len
    # consecutive samples exist only because the next context did not extend the previous sample
    for a, b in zip(out, out[1:]):
        nxt = by_seq[b.step_seqs[0]][1]
        assert nxt[: len(a.token_ids)] != a.token_ids


def test_keep_all_episode_is_one_sample(tmp_path):
    log = run(tmp_path / "k.jsonl")
    out = samples(log)
    assert len(out) == 1
    s = out[0]
    steps = [e for e in log.events() if isinstance(e, Step)]
    last_ctx = replay(log, step=-1).token_ids
    assert s.token_ids == last_ctx + steps[-1].token_ids
    assert s.n_sampled == sum(len(st.token_ids) for st in steps)
    assert s.step_seqs == tuple(st.seq for st in steps)
    assert s.policy_versions == (0, 0, 1, 1, 2)
    assert s.logprob_kind == "processed" and s.sampling[0] == {"temperature": 0.7, "top_p": 0.95, "seed": 0}
    assert (s.reward, s.reward_kind, s.outcome, s.cause, s.is_final) == (1.0, "scored", "terminated", "answered", True)
    assert s.episode_id == "ep-s" and s.compressor.startswith("keep-all-v1")
    assert s.tokenizer_id.startswith("qwen2.5-instruct@sha256:") and s.template_id.startswith("tokenizer@sha256:")
    assert s.token_policy_versions[s.prompt_len:s.prompt_len + 2] == (0, 0)
    all_lps = [x for st in steps for x in st.logprobs]
    assert masked_mean([x if x is not None else 0.0 for x in s.logprobs], s.loss_mask) == pytest.approx(sum(all_lps) / len(all_lps), rel=1e-12)
    check_faithful(log, out)


def test_compaction_starts_a_new_sample_whose_prompt_is_that_context(tmp_path):
    log = run(tmp_path / "m.jsonl", compressor="mask-observations", budget=600, n_turns=8, params={"keep_last": 2})
    events = log.events()
    comps = [e.seq for e in events if isinstance(e, Compaction)]
    assert comps
    out = samples(log)
    steps = [e for e in events if isinstance(e, Step)]
    first_after = next(s for s in steps if s.seq > comps[0])
    split = next(s for s in out if first_after.seq in s.step_seqs)
    assert split.step_seqs[0] == first_after.seq and split.sample_index >= 1
    assert split.token_ids[: split.prompt_len] == replay(log, step=steps.index(first_after)).token_ids
    assert split.prefix_sample == 0 and split.prefix_len > 0  # the system prompt and task are shared, stored once
    assert [s.is_final for s in out] == [False] * (len(out) - 1) + [True]
    # every split follows a recorded compaction, and says so
    assert out[0].split_reason == "" and {s.split_reason for s in out[1:]} == {"compaction"}
    stats = split_statistics(out)
    assert stats["splits"] == len(out) - 1 and stats["splits_by_reason"]["compaction"] == len(out) - 1
    assert sum(stats["splits_by_reason"].values()) == stats["splits"] and stats["samples"] == len(out)
    check_faithful(log, out)


def test_history_rewriting_template_splits_samples(tmp_path):
    """Mistral v0.3 moves the system prompt into the last user turn: a new user turn rewrites history."""
    builder = ContextBuilder(str(tokenizer_dir("mistral-7b-instruct-v0.3")), budget=4096)
    log = EventLog.create(tmp_path / "mis.jsonl", episode_id="ep-m")
    log.extend([EpisodeStart(episode_id="ep-m", context=builder.describe(), sampler={"seed": 1, "temperature": 0.6}),
                Message(role="system", content="Be brief."), Message(role="user", content="What is 2+2?")])
    from ctxkit.text.rendering.renderer import encode_assistant_turn

    for i, follow_up in enumerate(["What is 3+3?", None]):
        ctx = builder.build(log)
        ids = encode_assistant_turn({"role": "assistant", "content": f"Answer {i}."}, builder.tokenizer, builder.template)
        log.append(Step(context_hash=ctx.hash, context_length=ctx.n_tokens, token_ids=tuple(ids), content=f"Answer {i}.",
                        logprobs=tuple([-0.25] * len(ids)), logprob_kind="processed", sampling={"temperature": 0.6}, policy_version=3))
        if follow_up:
            log.append(Message(role="user", content=follow_up))
    log.append(EpisodeEnd(outcome="truncated", cause="max_steps", reward=None, reward_kind="limit_truncation"))
    out = samples(log)
    assert len(out) == 2
    assert out[1].prefix_sample == 0 and out[1].prefix_len == 2  # "<s>[INST]" is all the two contexts share
    assert [s.split_reason for s in out] == ["", "template_rewrite"]  # the moved system prompt, no sampled token
    assert (out[1].reward, out[1].reward_kind, out[1].outcome, out[1].cause) == (None, "limit_truncation", "truncated", "max_steps")
    check_faithful(log, out)


def test_tampered_log_refuses_samples(tmp_path):
    from log_tamper import flip, rechain

    log = run(tmp_path / "t.jsonl", n_turns=3)
    log.close()
    target = [e for e in log.events() if e.kind == "tool_result"][0]

    def edit(body):
        for obj in body:
            if obj["id"] == target.id:
                obj["content"] = flip(obj["content"], 3)
        return body

    rechain(log.path, edit)
    with pytest.raises(ReplayError, match=r"step 1 \(seq \d+\): context hash mismatch.*refusing to build samples"):
        samples(log.path)


def test_missing_end_is_unscored_and_outcome_unknown(tmp_path):
    builder = ContextBuilder(qwen(), budget=4096)
    log = EventLog.create(tmp_path / "open.jsonl", episode_id="ep-open")
    d = Driver(n_turns=3, episode_id="ep-open")
    d.run(log, builder, max_units=3)  # start, step 0, tool result: no end
    out = samples(log)
    assert [(s.reward, s.reward_kind, s.outcome, s.cause) for s in out] == [(None, "unscored", None, "")]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n_turns=st.integers(2, 7),
    compressor=st.sampled_from(["keep-all", "window", "mask-observations", "truncate-tool-output"]),
    budget=st.integers(420, 900),
)
def test_samples_are_faithful_property(tmp_path_factory, n_turns, compressor, budget):
    path = tmp_path_factory.mktemp("prop") / "p.jsonl"
    if compressor == "keep-all":
        budget = 4096
    params = {"keep_last": 1} if compressor in ("window", "mask-observations") else {}
    log = run(path, compressor=compressor, budget=budget, n_turns=n_turns, params=params)
    check_faithful(log, samples(log))


def _thinking_episode(path, builder, n_questions=3):
    """Questions answered with reasoning (Qwen3's `<think>` form), each answer sampled as the template writes it
    when it is the latest turn; a new question makes the template drop the reasoning before it."""
    tok = builder.tokenizer
    log = EventLog.create(path, episode_id="ep-t")
    log.extend([EpisodeStart(episode_id="ep-t", context=builder.describe(), sampler={"seed": 1}),
                Message(role="user", content="Is 17 prime?")])
    for q in range(n_questions):
        ctx = builder.build(log)
        reasoning, answer = f"Check divisors of {17 + q}.", f"Answer {q}."
        text = f"<think>\n{reasoning}\n</think>\n\n{answer}<|im_end|>"
        if tok.decode(list(ctx.token_ids)).endswith("<think>\n"):  # the generation prompt prefilled it
            text = text[len("<think>\n"):]
        ids = tok.encode(text)
        log.append(Step(context_hash=ctx.hash, context_length=ctx.n_tokens, token_ids=tuple(ids), content=answer,
                        reasoning_content=reasoning, logprobs=tuple([-0.5] * len(ids)), logprob_kind="processed",
                        sampling={"temperature": 1.0}, policy_version=0))
        log.append(Message(role="user", content=f"And {18 + q}?"))
    log.append(EpisodeEnd(outcome="truncated", cause="max_steps", reward=None, reward_kind="limit_truncation"))
    return log


@pytest.mark.parametrize("history, reasons", [("sampled", [""]), ("template", ["", "thinking_stripped", "thinking_stripped"])])
def test_thinking_history_modes_split_where_the_template_rewrote(tmp_path, history, reasons):
    """Qwen3 drops earlier reasoning at each new user turn. `sampled` keeps the sampled ids (one sample, a
    drift per dropped turn); `template` renders history as the template does (ids equal `apply_chat_template`),
    so a sample starts exactly at each rewrite. Both replay to the recorded hashes; the mode is recorded."""
    builder = ContextBuilder(str(tokenizer_dir("qwen3")), budget=4096, history=history)
    log = _thinking_episode(tmp_path / f"{history}.jsonl", builder)
    assert builder.describe().get("history") == (None if history == "sampled" else "template")
    assert ContextBuilder.from_description(builder.describe()).history == history
    out = samples(log)
    assert [s.split_reason for s in out] == reasons
    check_faithful(log, out)
    last = replay(log, step=-1).context
    assert [d.reason for d in last.rendered.drifts] == (["thinking_stripped"] * 2 if history == "sampled" else [])
    if history == "template":
        msgs = [{"role": "user", "content": "Is 17 prime?"}]
        for q in range(2):
            msgs += [{"role": "assistant", "content": f"Answer {q}.", "reasoning_content": f"Check divisors of {17 + q}."},
                     {"role": "user", "content": f"And {18 + q}?"}]
        hf = builder.tokenizer.hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False)
        assert list(last.token_ids) == hf


def test_keep_reasoning_kwargs_are_recorded_and_replayed(tmp_path):
    from ctxkit.benchmarks.template_families import family_tokenizer
    from ctxkit.text.template.chat_template import load_template, with_kwargs
    from ctxkit.text.tokenizer.loader import load_tokenizer

    require_module("trl")
    tok = load_tokenizer(str(family_tokenizer("qwen3_6", shared_path(), tmp_path)))
    keep = with_kwargs(load_template(None, tok), {"preserve_thinking": True})
    builder = ContextBuilder(tok, keep, budget=4096)
    desc = builder.describe()["template"]
    assert desc["kwargs"] == {"preserve_thinking": True} and desc["spec"] is None and desc["id"] == keep.id
    assert ContextBuilder.from_description(builder.describe(), tokenizer=tok).template.id == keep.id
    log = _thinking_episode(tmp_path / "keep.jsonl", builder)
    out = samples(log)  # the template keeps every turn's reasoning: nothing to split, nothing drifts
    assert [s.split_reason for s in out] == [""] and out[0].template_id == keep.id
    assert replay(log, step=-1).context.rendered.drifts == ()
    check_faithful(log, out)
