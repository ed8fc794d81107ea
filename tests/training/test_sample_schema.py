"""The one sample schema: `sample_schema.SAMPLE_COLUMNS` agrees with `TrainingSample`, the written columns are
exactly the v1 ones (names, order, types), files written before the schema was declared read back, and
the Arrow schema, `datasets` features and README table all follow it."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from conftest import REPO_ROOT, require_module
from test_export import _samples
from ctxkit.training.episode_samples import TrainingSample
from ctxkit.training.sample_files import PARQUET_SCHEMA, datasets_features, parquet_schema, read_samples, write_samples
from ctxkit.training.sample_schema import (NOT_COLUMNS, SAMPLE_COLUMNS, column_names, record_to_sample,
                                           sample_to_record, schema_drift)

V1_COLUMNS = """
episode_id:string sample_index:int32 prefix_sample:int32 prefix_len:int32 stored_from:int32 n_tokens:int32
prompt_len:int32 token_ids:list<int32> loss_mask:list<int8> logprobs:list<double> token_step:list<int32>
step_seqs:list<int32> logprob_kinds:list<string> logprob_kind:string sampling:list<string>
policy_versions:list<string> finish_reasons:list<string> context_hashes:list<string> reward:double
reward_kind:string outcome:string cause:string is_final:bool template_id:string tokenizer_id:string compressor:string
""".split()
"""Frozen: the columns of a `training-samples-v1` file, in order, with their Arrow types as pyarrow spells them."""
V2_COLUMNS = V1_COLUMNS + ["split_reason:string"]
"""Frozen: a `training-samples-v2` file: v1 plus `split_reason` (why a sample starts anew)."""

V1_JSONL = r"""
{"episode_id": "ep-x", "sample_index": 0, "prefix_sample": null, "prefix_len": 0, "stored_from": 0, "n_tokens": 9, "prompt_len": 4, "token_ids": [1, 2, 3, 4, 10, 11, 90, 91, 12], "loss_mask": [0, 0, 0, 0, 1, 1, 0, 0, 1], "logprobs": [null, null, null, null, -0.5, -0.25, null, null, -1.0], "token_step": [-1, -1, -1, -1, 0, 0, -1, -1, 1], "step_seqs": [2, 5], "logprob_kinds": ["processed", "processed"], "logprob_kind": "processed", "sampling": [{"temperature": 0.7, "top_p": 0.9, "seed": 3}, {"temperature": 0.7, "top_p": 0.9, "seed": 3}], "policy_versions": [7, 7], "finish_reasons": ["stop", "stop"], "context_hashes": ["h2", "h5"], "reward": 0.0, "reward_kind": "tool_failure", "outcome": "terminated", "cause": "tool_failed", "is_final": false, "template_id": "chatml-v1@sha256:aa", "tokenizer_id": "qwen@sha256:bb", "compressor": "window"}
{"episode_id": "ep-x", "sample_index": 1, "prefix_sample": 0, "prefix_len": 3, "stored_from": 3, "n_tokens": 7, "prompt_len": 5, "token_ids": [77, 78, 13, 14], "loss_mask": [0, 0, 1, 1], "logprobs": [null, null, -0.125, -2.0], "token_step": [-1, -1, 0, 0], "step_seqs": [8], "logprob_kinds": ["processed"], "logprob_kind": "processed", "sampling": [{"temperature": 0.7, "top_p": 0.9, "seed": 3}], "policy_versions": ["ckpt-8"], "finish_reasons": ["stop"], "context_hashes": ["h8"], "reward": 0.0, "reward_kind": "tool_failure", "outcome": "terminated", "cause": "tool_failed", "is_final": true, "template_id": "chatml-v1@sha256:aa", "tokenizer_id": "qwen@sha256:bb", "compressor": "window"}
""".lstrip()
"""Frozen: `test_export._samples()` as the JSONL writer wrote them before the schema was declared once."""


def _arrow_text(field) -> str:
    """`name:type` of a pyarrow field, a list as `list<value type>` (whatever pyarrow names its element)."""
    typ = field.type
    return f"{field.name}:list<{typ.value_type}>" if hasattr(typ, "value_type") else f"{field.name}:{typ}"


def test_schema_agrees_with_the_dataclass():
    assert schema_drift() == []
    stored = {c.name for c in SAMPLE_COLUMNS if c.role in ("field", "tokens")}
    assert stored | set(NOT_COLUMNS) == {f.name for f in dataclasses.fields(TrainingSample)}


def test_a_field_missing_from_the_schema_is_drift():
    @dataclasses.dataclass(frozen=True)
    class Grown(TrainingSample):
        note: str = ""
        """A field the schema does not know."""

    assert schema_drift(Grown) == ["field 'note' of Grown is no column (add it to SAMPLE_COLUMNS or NOT_COLUMNS)"]
    kept = [(f.name, f.type) for f in dataclasses.fields(TrainingSample) if f.name != "cause"]
    Shrunk = dataclasses.make_dataclass("Shrunk", kept, frozen=True)
    assert "column 'cause' is no field of Shrunk" in schema_drift(Shrunk)
    assert "column 'n_tokens' is no property of Shrunk" in schema_drift(Shrunk)


def test_written_columns_are_exactly_v2(tmp_path):
    require_module("pyarrow")
    import pyarrow.parquet as pq

    names = [c.split(":")[0] for c in V2_COLUMNS]
    assert column_names() == names == [n for n, _ in PARQUET_SCHEMA] == list(sample_to_record(_samples()[0]))
    assert [_arrow_text(f) for f in parquet_schema()] == V2_COLUMNS
    written = pq.read_schema(write_samples(_samples(), tmp_path / "s.parquet"))
    assert [_arrow_text(f) for f in written] == V2_COLUMNS
    assert all(f.nullable for f in written)
    assert written.metadata[b"ctxkit"] == b"training-samples-v2"
    lines = write_samples(_samples(), tmp_path / "s.jsonl").read_text().splitlines()
    assert [list(json.loads(line)) for line in lines] == [names] * 2


def test_file_written_before_the_change_reads_back(tmp_path):
    path = tmp_path / "v1.jsonl"
    path.write_text(V1_JSONL, encoding="utf-8")
    assert read_samples(path) == _samples()
    # v1 records hold no split_reason: none for the first sample, not recorded for a later one
    assert [s.split_reason for s in read_samples(path)] == ["", "unexplained"]
    v2 = "".join(line[:-1] + f', "split_reason": "{r}"}}\n' for line, r in zip(V1_JSONL.splitlines(), ["", "unexplained"]))
    assert write_samples(read_samples(path), tmp_path / "again.jsonl").read_text(encoding="utf-8") == v2


def test_v1_parquet_file_reads_back(tmp_path):
    require_module("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = write_samples(_samples(), tmp_path / "v2.parquet")
    table = pq.read_table(path)
    v1 = table.drop(["split_reason"]).replace_schema_metadata({b"ctxkit": b"training-samples-v1"})
    pq.write_table(v1, tmp_path / "v1.parquet")
    assert pa.types.is_string(table.schema.field("split_reason").type)
    assert read_samples(tmp_path / "v1.parquet") == _samples()


@pytest.mark.parametrize("inline", [False, True])
def test_parquet_round_trip_keeps_every_column(tmp_path, inline):
    require_module("pyarrow")
    import pyarrow.parquet as pq

    path = write_samples(_samples(), tmp_path / "s.parquet", inline_prefixes=inline)
    rows = pq.read_table(path).to_pylist()
    records = [sample_to_record(s, inline_prefixes=inline) for s in _samples()]
    for row, rec in zip(rows, records):
        assert row["sampling"] == [json.dumps(x, sort_keys=True) for x in rec["sampling"]]
        assert row["policy_versions"] == [json.dumps(x) for x in rec["policy_versions"]]
        assert {k: v for k, v in row.items() if k not in ("sampling", "policy_versions")} == {
            k: v for k, v in rec.items() if k not in ("sampling", "policy_versions")}
    assert read_samples(path) == _samples()


def test_nullable_says_which_values_may_be_null():
    unscored = dataclasses.replace(_samples()[0], reward=None, outcome=None, logprob_kinds=(None, "raw"))
    rec = sample_to_record(unscored)
    nullable = {"prefix_sample", "reward", "outcome", "logprob_kind"}
    assert {c.name for c in SAMPLE_COLUMNS if rec[c.name] is None} == nullable
    assert {c.name for c in SAMPLE_COLUMNS if c.nullable} == nullable
    assert record_to_sample(rec) == unscored


def test_datasets_features_follow_the_schema(tmp_path):
    datasets = require_module("datasets")
    path = write_samples(_samples(), tmp_path / "s.parquet")
    ds = datasets.Dataset.from_parquet(str(path), cache_dir=str(tmp_path / "cache"))
    assert ds.features == datasets_features()
    assert list(datasets_features()) == column_names()


def test_readme_table_lists_the_schema():
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    table = text[text.index("Parquet schema (one row per sample"):]
    rows = re.findall(r"^\| (`[^|]+`) \| ([^|]+) \|", table.split("\n\n", 2)[1], flags=re.M)
    listed = [(name.strip("` "), typ.strip()) for names, typ in rows for name in names.split(",")]
    assert listed == [(c.name, c.arrow + (", null" if c.nullable else "")) for c in SAMPLE_COLUMNS]
