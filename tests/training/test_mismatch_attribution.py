"""Mismatch attribution (`ctxkit.training.mismatch.attribution`) on hand-built scored steps: one test per cause,
the priority order, the table, and the CLI's checks of its options before any model loads."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ctxkit.cli.parser import main
from ctxkit.edits import MaskEdit
from ctxkit.errors import ConfigError
from ctxkit.events import Compaction, EpisodeStart, Message, Step
from ctxkit.kept_set import KeptSet
from ctxkit.training.mismatch import ScoredStep, attribute, render_text
from ctxkit.training.mismatch.attribution import CAUSES, cause_of, render_attribution

LOG = "run/ep.jsonl"


def _scored(seq, behaviour, recomputed, *, kind="processed", support=None, drifts=(), log=LOG):
    behaviour = np.asarray(behaviour, dtype=np.float64)
    recomputed = np.asarray(recomputed, dtype=np.float64)
    return ScoredStep(
        log=log, episode_id="ep", index=seq, seq=seq, context_length=10, token_ids=tuple(range(100, 100 + len(behaviour))),
        logprob_kind=kind, behaviour=behaviour, behaviour_raw=None, recomputed_raw=recomputed,
        recomputed_processed=recomputed, sampling={"temperature": 1.0, "top_k": 3},
        drift_spans=tuple(drifts), recomputed_support=None if support is None else np.asarray(support),
    )


def _rows(att, kind="processed"):
    """cause -> (tokens, mean abs log-ratio) of the rows with tokens."""
    return {r["cause"]: (r["tokens"], r["mean_abs_log_ratio"]) for r in att["kinds"][kind]["rows"] if r["tokens"]}


def test_policy_version_lag_is_a_recorded_version_other_than_the_scorers():
    steps = [_scored(1, [-1, -1, -1], [-1, 0, -1]), _scored(2, [-1, -1, -1], [-1, -1, -3]),
             _scored(3, [-1, -1], [0.5, -1])]
    events = {LOG: [Step(seq=1, token_ids=(1, 2, 3), policy_version=1), Step(seq=2, token_ids=(1, 2, 3), policy_version="2"),
                    Step(seq=3, token_ids=(1, 2))]}  # step 3: no version recorded: not lag
    att = attribute(steps, events, policy_version=2)
    assert _rows(att) == {"policy_version_lag": (1, 1.0), "engine_numerics": (2, 1.75)}
    k = att["kinds"]["processed"]
    assert (k["steps"], k["tokens"], k["out_of_bounds"], k["steps_with_kept_set"]) == (3, 8, 3, 0)
    assert _rows(attribute(steps, events)) == {"engine_numerics": (3, 1.5)}  # no scorer version: lag not checked


def test_outside_kept_set_three_ways():
    kept = KeptSet(sizes=(3, 3, 3, 70), ids=((100, 7, 8), (7, 8, 9), (102, 7, 8), None))
    step = _scored(1, [-1, -1, -1, -1], [0, 0, 0, 0], support=[3, 3, 4, 70])
    # token 0: in the kept ids, same support size: numerics; token 1 (id 101): not in the recorded ids;
    # token 2: the trainer keeps 4 ids where the sampler kept 3; token 3: ids not recorded, sizes agree: numerics
    assert _rows(attribute([step], {LOG: [Step(seq=1, token_ids=(100, 101, 102, 103), kept_set=kept)]})) == {
        "outside_kept_set": (2, 1.0), "engine_numerics": (2, 1.0)}
    # no kept set recorded: only the trainer-side cut (-inf recomputed) is known
    cut = _scored(1, [-1, -1, -1], [-math.inf, 0, -1])
    att = attribute([cut], {LOG: [Step(seq=1, token_ids=(1, 2, 3))]})
    assert [(r["cause"], r["tokens"], r["mean_abs_log_ratio"], r["non_finite"]) for r in att["kinds"]["processed"]["rows"]
            if r["tokens"]] == [("outside_kept_set", 1, None, 1), ("engine_numerics", 1, 1.0, 0)]


def test_drift_rows_by_reason():
    step = _scored(1, [-1] * 5, [0, 0, 0, 0, -1], drifts=[(1, 3, "bpe_merge"), (3, 4, "unexplained")])
    att = attribute([step], {LOG: [Step(seq=1, token_ids=(1, 2, 3, 4, 5))]})
    assert [r["cause"] for r in att["kinds"]["processed"]["rows"]] == [
        "policy_version_lag", "outside_kept_set", "drift:bpe_merge", "drift:unexplained", "compaction_boundary",
        "engine_numerics"]
    assert _rows(att) == {"drift:bpe_merge": (2, 1.0), "drift:unexplained": (1, 1.0), "engine_numerics": (1, 1.0)}
    assert [r["share"] for r in att["kinds"]["processed"]["rows"]] == [0.0, 0.0, 0.5, 0.25, 0.0, 0.25]


def test_compaction_boundary_is_the_first_tokens_of_the_first_step_after_a_compaction_with_edits():
    steps = [_scored(1, [-1, -1], [0, 0]), _scored(3, [-1] * 4, [0] * 4), _scored(4, [-1, -1], [0, 0]),
             _scored(6, [-1, -1], [0, 0])]
    events = {LOG: [Step(seq=1, token_ids=(1, 2)), Compaction(seq=2, compressor="mask", edits=(MaskEdit("e0-x", "[m]"),)),
                    Step(seq=3, token_ids=(1, 2, 3, 4)), Step(seq=4, token_ids=(1, 2)),
                    Compaction(seq=5, compressor="none"),  # no edits: nothing changed, no boundary
                    Step(seq=6, token_ids=(1, 2))]}
    assert _rows(attribute(steps, events, boundary_tokens=2)) == {"compaction_boundary": (2, 1.0), "engine_numerics": (8, 1.0)}
    assert _rows(attribute(steps, events, boundary_tokens=0)) == {"engine_numerics": (10, 1.0)}
    with pytest.raises(ConfigError, match="boundary_tokens=-1; expected an integer >= 0"):
        attribute(steps, events, boundary_tokens=-1)


def test_every_cause_holds_on_one_token_and_the_priority_order_decides():
    kept = KeptSet(sizes=(2,), ids=((7, 8),))
    scored = _scored(2, [-1], [0], drifts=[(0, 1, "bpe_merge")])
    args = dict(after_compaction=True, boundary_tokens=4)
    step = Step(seq=2, token_ids=(100,), policy_version="old", kept_set=kept)
    assert cause_of(scored, step, 0, policy_version="new", **args) == "policy_version_lag"
    assert cause_of(scored, step, 0, policy_version="old", **args) == "outside_kept_set"
    step = Step(seq=2, token_ids=(100,), policy_version="old")
    assert cause_of(scored, step, 0, policy_version="old", **args) == "drift:bpe_merge"
    assert cause_of(_scored(2, [-1], [0]), step, 0, policy_version="old", **args) == "compaction_boundary"
    assert cause_of(_scored(2, [-1], [0]), step, 0, after_compaction=False, policy_version="old") == "engine_numerics"
    assert cause_of(_scored(2, [-1], [0]), None, 0, after_compaction=False) == "engine_numerics"
    assert CAUSES == ("policy_version_lag", "outside_kept_set", "drift", "compaction_boundary", "engine_numerics")


def test_raw_steps_are_a_table_of_their_own_and_the_report_renders_it():
    steps = [_scored(1, [-1, -1], [0, -1]), _scored(2, [-2, -2, -2], [-2, -4, -2], kind="raw")]
    att = attribute(steps, {LOG: [Step(seq=1, token_ids=(1, 2)), Step(seq=2, token_ids=(1, 2, 3))]})
    assert list(att["kinds"]) == ["processed", "raw"]
    assert _rows(att, "raw") == {"engine_numerics": (1, 2.0)}
    assert render_attribution(att)[4:] == [
        "processed: 1 of 2 tokens out of bounds; kept set recorded on 0 of 1 steps", "",
        "| cause | tokens | share | mean abs log-ratio |", "|---|---|---|---|",
        "| policy_version_lag | 0 | 0.00% | - |", "| outside_kept_set | 0 | 0.00% | - |",
        "| compaction_boundary | 0 | 0.00% | - |", "| engine_numerics | 1 | 100.00% | 1 |", "",
        "raw: 1 of 3 tokens out of bounds; kept set recorded on 0 of 1 steps", "",
        "| cause | tokens | share | mean abs log-ratio |", "|---|---|---|---|",
        "| policy_version_lag | 0 | 0.00% | - |", "| outside_kept_set | 0 | 0.00% | - |",
        "| compaction_boundary | 0 | 0.00% | - |", "| engine_numerics | 1 | 100.00% | 2 |", ""]
    from ctxkit.training.mismatch import analyze

    text = render_text({**analyze(steps), "attribution": att})
    assert "### mismatch attribution: tokens outside the TIS / token-mask bounds, by cause" in text
    assert "policy version not given (lag not checked)" in text


@pytest.fixture()
def no_model(monkeypatch):
    """Fail the test if anything tries to load a model."""
    import ctxkit.training.mismatch.scoring as scoring

    def refuse(*args, **kwargs):
        raise AssertionError("the model loader was called")

    monkeypatch.setattr(scoring, "load_causal_lm", refuse)


@pytest.mark.parametrize("option, message", [
    (["--boundary-tokens", "-1"], "argument --boundary-tokens: expected an integer >= 0, got -1"),
    (["--boundary-tokens", "x"], "argument --boundary-tokens: expected an integer >= 0, got 'x'"),
    (["--policy-version", " "], "argument --policy-version: expected a non-empty policy version"),
])
def test_attribution_options_are_checked_before_any_model_loads(tmp_path, capsys, no_model, option, message):
    from ctxkit.log.event_log import EventLog

    with EventLog.create(tmp_path / "ep.jsonl", episode_id="ep") as log:
        log.extend([EpisodeStart(episode_id="ep"), Message(role="user", content="hi"),
                    Step(token_ids=(1, 2), content="yo", logprobs=(-0.1, -0.2), logprob_kind="processed")])
    assert main(["mismatch", str(tmp_path / "ep.jsonl"), "--model", "default", *option]) == 2
    assert message in capsys.readouterr().err


def test_step_drifts_maps_a_rendered_drift_onto_the_sampled_tokens_it_covers(smollm_tok):
    """A turn sampled as `hel|lo| world` where the tokenizer writes `hello| world`: the later context's render records
    a drift, which `step_drifts` places on tokens [0, 2) of the step (the differing run `hel|lo`)."""
    from ctxkit.context.builder import ContextBuilder, MemoryLog
    from ctxkit.training.mismatch.scoring import step_drifts

    tok = smollm_tok
    end = tok.special_tokens["<|im_end|>"]
    sampled = tuple(tok.encode("hel") + tok.encode("lo") + tok.encode(" world")) + (end,)
    assert tok.encode("hello world") != list(sampled[:-1])  # a non-canonical split of the same text
    log = MemoryLog()
    log.extend([EpisodeStart(episode_id="d"), Message(role="user", content="hi")])
    builder = ContextBuilder(tok, None, "keep-all", 4096, detect_pins=False)
    first = builder.build(log)
    step = log.append(Step(context_hash=first.hash, context_length=len(first.token_ids), token_ids=sampled,
                           content="hello world"))
    log.append(Message(role="user", content="again"))
    later = builder.build(log)
    assert len(later.rendered.drifts) == 1
    assert later.rendered.drifts[0].reason == "bpe_merge"
    assert step_drifts(later, {}) == {step.id: {(0, 2, "bpe_merge")}}
    assert step_drifts(first, {}) == {}  # no sampled turn in the first context


@pytest.mark.slow
def test_scored_steps_carry_their_drifts_the_last_turn_included(smollm_tok, tmp_path):
    """Scoring a real log with SmolLM2: both turns were sampled with a non-canonical split, the first one's drift
    shows in the second step's context, the last one's only in the whole log's render; the attribution puts the
    out-of-bounds tokens of those spans on the drift."""
    pytest.importorskip("torch")
    from ctxkit.context.builder import ContextBuilder
    from ctxkit.context.models import load_causal_lm
    from ctxkit.log.event_log import EventLog, read_events
    from ctxkit.training.mismatch.scoring import score_steps

    tok = smollm_tok
    end = tok.special_tokens["<|im_end|>"]
    sampled = tuple(tok.encode("hel") + tok.encode("lo") + tok.encode(" world")) + (end,)
    builder = ContextBuilder(tok, None, "keep-all", 4096, detect_pins=False)
    path = tmp_path / "ep.jsonl"
    with EventLog.create(path, episode_id="d") as log:
        log.extend([EpisodeStart(episode_id="d", context=builder.describe()), Message(role="user", content="hi")])
        for turn in range(2):
            ctx = builder.build(log)
            log.append(Step(context_hash=ctx.hash, context_length=len(ctx.token_ids), token_ids=sampled,
                            content="hello world", logprobs=(-1.0,) * len(sampled), logprob_kind="raw"))
            log.append(Message(role="user", content="again"))
    steps, skipped = score_steps(path, load_causal_lm(None, device="cpu", dtype="float32"))
    assert skipped == 0 and [s.drift_spans for s in steps] == [((0, 2, "bpe_merge"),), ((0, 2, "bpe_merge"),)]
    att = attribute(steps, {str(path): read_events(path)})
    ratios = [np.exp(s.recomputed - s.behaviour) for s in steps]
    out = [(r > 2.0) | (r < 0.5) for r in ratios]
    want_drift = sum(int(o[:2].sum()) for o in out)
    assert want_drift >= 1  # the first sampled piece, `hel` after a greeting, is far from log-prob -1
    rows = {r["cause"]: r["tokens"] for r in att["kinds"]["raw"]["rows"]}
    assert rows.get("drift:bpe_merge", 0) == want_drift and rows["engine_numerics"] == sum(int(o[2:].sum()) for o in out)
