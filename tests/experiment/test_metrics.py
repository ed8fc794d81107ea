"""Statistics and per-episode metrics: exact values on constructed cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkit.events import EpisodeEnd, Step, ToolCall, ToolResult, Compaction, Pin
from ctxkit.experiment.metrics import StepRecord, common_prefix, episode_metrics
from ctxkit.experiment.stats import paired_bootstrap, quantiles, rate, stage_bound


def test_stage_bound_matches_the_worked_example():
    b = stage_bound({"generate": 30.0, "train": 10.0, "score": 20.0}, {"sync": 5.0})
    assert b.serial_s == 65.0
    assert b.bound_s == 35.0
    assert round(b.speedup, 2) == 1.86
    assert b.bottleneck == "generate"


def test_stage_bound_without_stages_is_neutral():
    b = stage_bound({}, {})
    assert (b.serial_s, b.bound_s, b.speedup, b.bottleneck) == (0.0, 0.0, 1.0, None)


def test_quantiles_linear_interpolation():
    q = quantiles(list(range(1, 101)))
    assert q == {"p50": 50.5, "p90": pytest.approx(90.1), "p99": pytest.approx(99.01)}
    assert quantiles([]) == {"p50": None, "p90": None, "p99": None}
    assert quantiles([7.0]) == {"p50": 7.0, "p90": 7.0, "p99": 7.0}


def test_rate():
    assert rate([True, False, False, True]) == 0.5
    assert rate([]) is None


def test_bootstrap_constant_difference_is_exact_even_with_noisy_pairs():
    # Baseline values vary wildly between pairs, but every pair differs by exactly 0.5: a paired interval is
    # degenerate at 0.5 (an unpaired one would be wide).
    rng = np.random.default_rng(1)
    base = {("t", i): float(rng.normal(0, 100)) for i in range(30)}
    arm = {k: v + 0.5 for k, v in base.items()}
    ci = paired_bootstrap(base, arm, n_resamples=500, seed=3)
    assert ci.n_pairs == 30
    assert ci.mean_diff == pytest.approx(0.5)
    assert ci.low == pytest.approx(0.5) and ci.high == pytest.approx(0.5)
    assert ci.excludes_zero()


def test_bootstrap_half_ones_matches_the_normal_approximation():
    # Differences are 1 for half the pairs, 0 for the rest: mean 0.5, standard error sqrt(0.25 / n).
    n = 400
    base = {i: 0.0 for i in range(n)}
    arm = {i: float(i % 2) for i in range(n)}
    ci = paired_bootstrap(base, arm, n_resamples=4000, seed=0)
    half_width = 1.96 * np.sqrt(0.25 / n)
    assert ci.mean_diff == 0.5
    assert ci.low == pytest.approx(0.5 - half_width, abs=0.01)
    assert ci.high == pytest.approx(0.5 + half_width, abs=0.01)
    assert ci.excludes_zero()


def test_bootstrap_uses_only_pairs_and_is_seeded():
    base = {"a": 1.0, "b": 2.0, "c": 3.0, "x": 100.0}
    arm = {"a": 2.0, "b": 2.0, "c": 5.0, "y": -100.0}
    one = paired_bootstrap(base, arm, n_resamples=300, seed=7)
    two = paired_bootstrap(dict(reversed(list(base.items()))), arm, n_resamples=300, seed=7)
    assert one == two
    assert one.n_pairs == 3 and one.mean_diff == pytest.approx(1.0)
    assert paired_bootstrap({}, arm).mean_diff is None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=25), st.integers(0, 2**31))
def test_bootstrap_interval_brackets_the_mean(diffs, seed):
    base = {i: 0.0 for i in range(len(diffs))}
    arm = {i: d for i, d in enumerate(diffs)}
    ci = paired_bootstrap(base, arm, n_resamples=200, seed=seed)
    lo, hi = min(diffs), max(diffs)
    assert lo - 1e-9 <= ci.low <= ci.high <= hi + 1e-9


@given(st.lists(st.integers(0, 5), max_size=30), st.lists(st.integers(0, 5), max_size=30))
def test_common_prefix_property(a, b):
    n = common_prefix(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]


def _rec(prompt, full, reused, gen=3):
    return StepRecord(prompt, full, reused, gen, build_s=0.1, prefill_s=0.2, decode_s=0.3, generate_s=0.5, tool_s=0.05)


def test_episode_metrics_counts_and_ratios():
    call = lambda i, path: ToolCall(id=f"c{i}", name="read_file", arguments=f'{{"path": "{path}"}}')
    events = [
        Step(token_ids=(1, 2, 3), tool_calls=(call(0, "a"),)),
        ToolResult(tool_call_id="c0", content="x", duration_s=0.01),
        Step(token_ids=(1, 2, 3, 4), tool_calls=(call(1, "b"),)),
        ToolResult(tool_call_id="c1", content="x", duration_s=0.02),
        Compaction(compressor="window-v1"),
        Pin(pin_id="p", text="Never."),
        # same call, arguments spelled differently: still a repeat
        Step(token_ids=(5,), tool_calls=(ToolCall(id="c2", name="read_file", arguments='{"path":"a"}'),)),
        ToolResult(tool_call_id="c2", content="x", status="error", duration_s=0.03),
        EpisodeEnd(outcome="terminated", cause="tool_failed", reward=0.0, reward_kind="tool_failure",
                   scores={"quality": 0.0, "violations": 0}),
    ]
    steps = [_rec(100, 100, 0), _rec(200, 250, 90), _rec(100, 400, 50)]
    m = episode_metrics(events, steps, wall_s=2.0)
    assert (m["outcome"], m["cause"], m["reward_kind"], m["completed"]) == ("terminated", "tool_failed", "tool_failure", False)
    assert (m["steps"], m["tool_calls"], m["repeated_tool_calls"], m["tool_errors"]) == (3, 3, 1, 1)
    assert (m["compactions"], m["pins"]) == (1, 1)
    assert m["prompt_tokens"] == [100, 200, 100]
    assert (m["prompt_tokens_total"], m["peak_context"], m["full_tokens_total"]) == (400, 200, 750)
    assert m["compression_ratio"] == 750 / 400
    assert m["prefix_reuse"] == 140 / 400
    assert (m["generated_tokens"], m["loss_tokens"]) == (8, 8)
    t = m["timing"]
    assert t["tool_waits"] == [0.01, 0.02, 0.03]
    assert t["build_s"] == pytest.approx(0.3) and t["generate_s"] == pytest.approx(1.5)
    assert t["other_s"] == pytest.approx(2.0 - 0.3 - 1.5 - 0.15)


def test_malformed_tool_calls_are_counted_apart_from_parsed_ones():
    # One parsed call beside a block with bad JSON, then a turn whose only call never closes: the malformed
    # blocks run no tool, so they are not in tool_calls; the report's valid-call rate is parsed / attempted.
    from ctxkit.experiment.report import valid_call_rate
    good = ToolCall(id="c0", name="read_file", arguments='{"path": "a"}')
    events = [
        Step(token_ids=(1,), tool_calls=(good,),
             content='<tool_call>\n{"name": "read_file", "arguments": {"path": "a"}}\n</tool_call>\n'
                     '<tool_call>\n{"name": "read_file", "arguments": {path: b}}\n</tool_call>'),
        ToolResult(tool_call_id="c0", content="x"),
        Step(token_ids=(2,), content='I will read it. <tool_call>\n{"name": "ls", "arguments": {}}'),
        EpisodeEnd(outcome="terminated", cause="answered", reward=0.0, reward_kind="task_failure"),
    ]
    m = episode_metrics(events, [_rec(10, 10, 0), _rec(10, 10, 0)], wall_s=1.0)
    assert (m["tool_calls"], m["malformed_tool_calls"]) == (1, 2)
    assert valid_call_rate([m]) == 1 / 3
    assert valid_call_rate([{"tool_calls": 0}]) is None  # nothing attempted (and a row from before the field)
    assert valid_call_rate([{"tool_calls": 4}]) == 1.0


def test_discarded_episode_has_no_loss_tokens():
    events = [Step(token_ids=(1, 2)), EpisodeEnd(outcome="truncated", cause="context_budget", reward_kind="length_truncation")]
    m = episode_metrics(events, [_rec(10, 10, 0)], wall_s=1.0)
    assert m["discarded"] and not m["timed_out"] and not m["completed"]
    assert (m["generated_tokens"], m["loss_tokens"]) == (2, 0)
    assert m["reward"] is None and m["quality"] == 0.0


@pytest.mark.parametrize("events, discarded", [
    # nothing sampled: nothing to train on, whatever the end says
    ([EpisodeEnd(outcome="truncated", cause="wall_time", reward_kind="limit_truncation")], True),
    # a limit truncation with steps is kept (bootstrapped), a length truncation or an unscored end is dropped
    ([Step(token_ids=(1,)), EpisodeEnd(outcome="truncated", cause="max_steps", reward_kind="limit_truncation")], False),
    ([Step(token_ids=(1,)), EpisodeEnd(outcome="truncated", cause="context_limit", reward_kind="length_truncation")], True),
    ([Step(token_ids=(1,)), EpisodeEnd(outcome="truncated", cause="harness_error", reward_kind="unscored")], True),
    ([Step(token_ids=(1,))], True),  # no end
    ([Step(token_ids=(1,)), EpisodeEnd(outcome="terminated", cause="tool_failed", reward=0.0, reward_kind="tool_failure")],
     False),
])
def test_discarded_is_the_audit_definition(events, discarded):
    from ctxkit.training.preflight import is_discarded

    steps = [e for e in events if isinstance(e, Step)]
    end = next((e for e in events if isinstance(e, EpisodeEnd)), None)
    m = episode_metrics(events, [_rec(10, 10, 0)] * len(steps), wall_s=1.0)
    assert m["discarded"] is discarded is is_discarded(steps, end)
    assert m["loss_tokens"] == (0 if discarded else m["generated_tokens"])
