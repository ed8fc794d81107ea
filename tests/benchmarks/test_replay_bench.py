"""`ctxkit.benchmarks.replay_bench`: a tiny run (20 turns, a budget that makes both compressors compact),
asserting the report's shape, that every replayed step verifies and that the new replay's results equal the
per-step reference's; and its command line. Never timing values."""

from __future__ import annotations

import json

from conftest import tokenizer_dir
from ctxkit.benchmarks import replay_bench

TIMING_KEYS = {"total_s", "p50_ms", "p90_ms", "p99_ms", "max_ms", "decisions"}


def test_small_run_has_the_shape_and_identical_results():
    result = replay_bench.run(str(tokenizer_dir("qwen2.5-instruct")), turns=20, budget=3000, repeats=1)
    assert result.ok and result.turns == 20 and result.repeats == 1
    assert [a.compressor for a in result.arms] == list(replay_bench.DEFAULT_COMPRESSORS)
    for arm in result.arms:
        assert arm.steps == 20 and arm.compactions >= 1
        assert arm.all_ok and arm.identical
        for t in (arm.live, arm.replay, arm.reference):
            assert t.decisions == 20 and t.total_s > 0
        assert arm.replay_vs_live is not None and arm.reference_vs_live is not None
    data = result.to_dict()
    assert TIMING_KEYS <= set(data["arms"][0]["replay"])
    text = replay_bench.replay_table(result)
    assert "reference replay" in text and "vs live" in text


def test_command_line_prints_json(capsys):
    code = replay_bench.main(["--tokenizer", str(tokenizer_dir("qwen2.5-instruct")), "--turns", "6", "--budget", "1500",
                              "--compressors", "window", "--repeats", "1", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["turns"] == 6 and [a["compressor"] for a in data["arms"]] == ["window"]
    assert data["arms"][0]["identical"] and data["arms"][0]["all_ok"]
