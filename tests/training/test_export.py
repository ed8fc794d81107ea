"""Parquet/JSONL export of training samples: exact round trip, shared prefixes stored once, readable by
pyarrow and by `datasets` offline."""

from __future__ import annotations

import json
import math

import pytest

from conftest import require_module
from ctxkit.errors import ConfigError
from ctxkit.events import Step
from ctxkit.training.sample_files import PARQUET_SCHEMA, parquet_schema, read_samples, sample_to_record, write_parquet, write_samples
from ctxkit.training.episode_samples import EpisodeMeta, assemble_samples


def _meta(reward=0.0, kind="tool_failure", outcome="terminated", cause="tool_failed"):
    return EpisodeMeta(episode_id="ep-x", reward=reward, reward_kind=kind, outcome=outcome, cause=cause,
                       template_id="chatml-v1@sha256:aa", tokenizer_id="qwen@sha256:bb", compressor="window")


def _step(seq, ids, lps, version):
    return Step(seq=seq, id=f"e{seq}-00000000", token_ids=tuple(ids), logprobs=tuple(lps), logprob_kind="processed",
                sampling={"temperature": 0.7, "top_p": 0.9, "seed": 3}, policy_version=version, finish_reason="stop",
                context_hash=f"h{seq}")


def _samples():
    # step 1 extends step 0's tokens; step 2 starts a new sample sharing the first 3 tokens (a compaction)
    triples = [
        (_step(2, [10, 11], [-0.5, -0.25], 7), (1, 2, 3, 4), "h2"),
        (_step(5, [12], [-1.0], 7), (1, 2, 3, 4, 10, 11, 90, 91), "h5"),
        (_step(8, [13, 14], [-0.125, -2.0], "ckpt-8"), (1, 2, 3, 77, 78), "h8"),
    ]
    return assemble_samples(triples, _meta())


def test_shared_prefix_stored_once_in_records():
    s0, s1 = _samples()
    rec1 = sample_to_record(s1)
    assert (s1.prefix_sample, s1.prefix_len) == (0, 3)
    assert rec1["stored_from"] == 3 and rec1["token_ids"] == [77, 78, 13, 14] and rec1["n_tokens"] == 7
    assert rec1["loss_mask"] == [0, 0, 1, 1] and rec1["logprobs"] == [None, None, -0.125, -2.0]
    inline = sample_to_record(s1, inline_prefixes=True)
    assert inline["stored_from"] == 0 and inline["token_ids"] == [1, 2, 3, 77, 78, 13, 14]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
@pytest.mark.parametrize("inline", [False, True])
def test_round_trip_is_exact(tmp_path, suffix, inline):
    if suffix == ".parquet":
        require_module("pyarrow")
    samples = _samples()
    path = write_samples(samples, tmp_path / f"out{suffix}", inline_prefixes=inline)
    assert read_samples(path) == samples


def test_parquet_schema_and_pyarrow_read(tmp_path):
    require_module("pyarrow")
    import pyarrow.parquet as pq
    path = write_parquet(_samples(), tmp_path / "s.parquet")
    table = pq.read_table(path)
    assert table.schema.names == [name for name, _ in PARQUET_SCHEMA]
    assert table.schema.equals(parquet_schema(), check_metadata=False)
    rows = table.to_pylist()
    assert rows[0]["token_ids"] == [1, 2, 3, 4, 10, 11, 90, 91, 12]
    assert rows[0]["loss_mask"] == [0, 0, 0, 0, 1, 1, 0, 0, 1]
    assert rows[0]["logprobs"] == [None] * 4 + [-0.5, -0.25, None, None, -1.0]
    assert rows[0]["token_step"] == [-1] * 4 + [0, 0, -1, -1, 1]
    assert rows[0]["policy_versions"] == ["7", "7"] and rows[1]["policy_versions"] == ['"ckpt-8"']
    assert json.loads(rows[1]["sampling"][0]) == {"seed": 3, "temperature": 0.7, "top_p": 0.9}
    assert [r["reward_kind"] for r in rows] == ["tool_failure", "tool_failure"]
    assert [r["reward"] for r in rows] == [0.0, 0.0]
    assert [r["is_final"] for r in rows] == [False, True]


def test_datasets_reads_parquet_offline(tmp_path):
    datasets = require_module("datasets")
    path = write_parquet(_samples(), tmp_path / "s.parquet")
    ds = datasets.Dataset.from_parquet(str(path), cache_dir=str(tmp_path / "cache"))
    assert ds.num_rows == 2
    assert ds[1]["token_ids"] == [77, 78, 13, 14] and ds[1]["prefix_sample"] == 0 and ds[1]["stored_from"] == 3
    assert ds[0]["logprob_kind"] == "processed"
    loaded = datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache2"))
    assert loaded["reward_kind"] == ["tool_failure", "tool_failure"]
    assert loaded[0]["n_tokens"] == 9


def test_reward_provenance_distinguishable_at_zero(tmp_path):
    require_module("pyarrow")
    triples = [(_step(2, [10], [-0.5], 1), (1, 2), "h2")]
    kinds = ["scored", "unscored", "tool_failure", "task_failure", "length_truncation"]
    rows = []
    for kind in kinds:
        reward = None if kind == "unscored" else 0.0
        outcome = "truncated" if kind == "length_truncation" else "terminated"
        rows += assemble_samples(triples, _meta(reward=reward, kind=kind, outcome=outcome))
    back = read_samples(write_parquet(rows, tmp_path / "k.parquet"))
    assert [(s.reward, s.reward_kind, s.outcome) for s in back] == [
        (0.0, "scored", "terminated"),
        (None, "unscored", "terminated"),
        (0.0, "tool_failure", "terminated"),
        (0.0, "task_failure", "terminated"),
        (0.0, "length_truncation", "truncated"),
    ]


def test_bad_output_format_and_nan(tmp_path):
    with pytest.raises(ConfigError, match="unknown format .csv"):
        write_samples(_samples(), tmp_path / "x.csv")
    with pytest.raises(ConfigError, match="step seq 1: log-prob nan of sampled token 0 is not finite"):
        assemble_samples([(_step(1, [5], [math.nan], 1), (1,), "h")], _meta())
