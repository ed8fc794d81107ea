"""The one declaration of a training-sample file's columns, and the record <-> sample conversion.

`SAMPLE_COLUMNS` lists, in file order, every column of a sample file (`ctxkit.training.sample_files`: one
Parquet row or JSONL record per `TrainingSample`) with its Arrow type, whether its value may be null, and
what it means. Everything else derives from it: the Arrow schema (`sample_files.parquet_schema`), the
`datasets` features (`sample_files.datasets_features`), the JSONL record of a sample (`sample_to_record`),
the Parquet row (`to_parquet_row`) and the sample read back (`record_to_sample`). A column is one of:

- `field`: a `TrainingSample` field, stored whole (a tuple as a list);
- `tokens`: a per-token field stored from `stored_from` on; readers put back `pad` for the shared prefix
  the row leaves out (`token_ids` itself is rebuilt from the referenced row instead: `pad` is `FROM_PREFIX`);
- `property`: a read-only property of `TrainingSample` (`n_tokens`, `logprob_kind`), written for readers
  that do not rebuild samples; `record_to_sample` checks `n_tokens` and recomputes the rest;
- `layout`: `stored_from`, where the stored tokens start (`prefix_len`, or 0 for self-contained rows).

`TrainingSample.compactions` is no column (`NOT_COLUMNS`): the Parquet export keeps it in its file metadata.
`schema_drift(TrainingSample)` is empty exactly when the dataclass and this schema agree (every field a
column or in `NOT_COLUMNS`, every `property` column a property, nullability as the annotations say);
tests hold it to that. The Python type of a column is the annotation of its field or property (`Column.python`).

The columns and types are those of `training-samples-v2` files: a change here is a new file version. A v2
file is a v1 file plus the last column, `split_reason`; `record_to_sample` reads v1 records (no
`split_reason`) as samples with none for an episode's first sample and `unexplained` for the others.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ctxkit.errors import ConfigError
from ctxkit.training.episode_samples import TrainingSample

__all__ = [
    "Column", "FILE_VERSION", "FROM_PREFIX", "NOT_COLUMNS", "READ_VERSIONS", "ROLES", "SAMPLE_COLUMNS", "V1_MISSING",
    "column_names",
    "from_parquet_row", "record_to_sample", "sample_to_record", "schema_drift", "to_parquet_row",
]

FILE_VERSION = "training-samples-v2"
"""The `ctxkit` entry of a Parquet export's file metadata: the version of these columns."""

READ_VERSIONS: tuple[str, ...] = ("training-samples-v1", "training-samples-v2")
"""File versions `record_to_sample` reads (v1: before `split_reason`)."""

def _v1_split_reason(record: Mapping[str, Any]) -> str:
    """A v1 record's split reason: none for an episode's first sample, else not recorded (`unexplained`)."""
    return "" if record.get("sample_index") == 0 else "unexplained"


V1_MISSING: dict[str, Any] = {"split_reason": _v1_split_reason}
"""Columns a v1 record lacks -> the function of the record giving the value a sample read from it gets."""

ROLES: tuple[str, ...] = ("field", "tokens", "property", "layout")
"""How a column relates to `TrainingSample` (see the module docstring)."""

FROM_PREFIX = "from-prefix"
"""`Column.pad` of `token_ids`: the left-out prefix is the referenced row's tokens, not a constant."""

NOT_COLUMNS: dict[str, str] = {"compactions": "kept in the Parquet file metadata (`ctxkit-compactions`)"}
"""`TrainingSample` fields that are no column, and where they go instead."""


@dataclass(frozen=True)
class Column:
    """One column of a sample file."""

    name: str
    """Column name (the JSONL key; for `field`/`tokens` columns, the `TrainingSample` field; for `property`
    columns, the property)."""
    arrow: str
    """Arrow type as text: `string`, `int32`, `int8`, `float64`, `bool`, or `list<one of them>`."""
    doc: str
    """What the column holds."""
    role: str = "field"
    """One of `ROLES`."""
    nullable: bool = False
    """Whether the value itself may be null (a list's elements may be null where `doc` says so). Every Arrow
    field is declared nullable, as v1 files have them."""
    json_text: bool = False
    """Parquet stores each list element as JSON text (`sampling`'s objects, `policy_versions`' ints or
    strings); JSONL keeps them as native JSON values."""
    pad: Any = None
    """`tokens` columns: the value of each left-out shared-prefix token (`FROM_PREFIX` for `token_ids`)."""

    @property
    def is_list(self) -> bool:
        """True for a `list<...>` column."""
        return self.arrow.startswith("list<")

    @property
    def python(self) -> str:
        """The Python type of the value in a `TrainingSample`: its field's or property's annotation."""
        if self.role == "layout":
            return "int"
        if self.role == "property":
            return getattr(TrainingSample, self.name).fget.__annotations__["return"]
        return TrainingSample.__dataclass_fields__[self.name].type


SAMPLE_COLUMNS: tuple[Column, ...] = (
    Column("episode_id", "string", "episode the sample comes from"),
    Column("sample_index", "int32", "position among the episode's samples"),
    Column("prefix_sample", "int32", "`sample_index` of the earlier sample sharing the first `prefix_len` tokens",
           nullable=True),
    Column("prefix_len", "int32", "length of that shared prefix (0 when none)"),
    Column("stored_from", "int32", "position in the full sample of the first stored token (`prefix_len`, or 0 "
           "with `--inline-prefixes`)", role="layout"),
    Column("n_tokens", "int32", "length of the full sample", role="property"),
    Column("prompt_len", "int32", "length of the first step's context"),
    Column("token_ids", "list<int32>", "tokens `[stored_from:]`", role="tokens", pad=FROM_PREFIX),
    Column("loss_mask", "list<int8>", "1 on sampled tokens, aligned with `token_ids`", role="tokens", pad=0),
    Column("logprobs", "list<float64>", "behaviour log-prob on sampled tokens, null elsewhere", role="tokens"),
    Column("token_step", "list<int32>", "per token: index into `step_seqs` of the step that sampled it, -1 elsewhere",
           role="tokens", pad=-1),
    Column("step_seqs", "list<int32>", "log seq of each merged step"),
    Column("logprob_kinds", "list<string>", "per step: `raw` / `processed` / `recomputed` / `none` (null if unknown)"),
    Column("logprob_kind", "string", "the common kind, `mixed`, or null", role="property", nullable=True),
    Column("sampling", "list<string>", "per step: sampling config as JSON text", json_text=True),
    Column("policy_versions", "list<string>", "per step: policy version as JSON text", json_text=True),
    Column("finish_reasons", "list<string>", "per step finish reason"),
    Column("context_hashes", "list<string>", "per step verified context hash"),
    Column("reward", "float64", "episode reward (null: unscored / no end)", nullable=True),
    Column("reward_kind", "string", "provenance: one of `events.REWARD_KINDS`"),
    Column("outcome", "string", "`terminated` / `truncated` (null: no end event)", nullable=True),
    Column("cause", "string", "why the episode ended (`answered`, `context_budget`, `max_steps`, `tool_failed`, ...)"),
    Column("is_final", "bool", "holds the episode's last step"),
    Column("template_id", "string", "id of the chat template the contexts were rendered with"),
    Column("tokenizer_id", "string", "id of the tokenizer"),
    Column("compressor", "string", "the compressor spec the contexts were built with, as text"),
    Column("split_reason", "string", "why the sample starts anew (`drift_reasons.DRIFT_REASONS`); empty for an "
           "episode's first sample"),
)
"""Every column of a sample file, in file order (see the module docstring)."""

_JSON_TEXT: dict[str, bool] = {c.name: c.json_text for c in SAMPLE_COLUMNS}
"""Column name -> whether Parquet stores its elements as JSON text."""


def column_names() -> list[str]:
    """The column names, in file order."""
    return [c.name for c in SAMPLE_COLUMNS]


def _plain(value: Any) -> Any:
    """A list element as a JSON value (a mapping as a dict)."""
    return dict(value) if isinstance(value, Mapping) else value


def sample_to_record(sample: TrainingSample, *, inline_prefixes: bool = False) -> dict[str, Any]:
    """One JSON-able record (the JSONL form) of a sample, storing tokens from `stored_from` on."""
    start = 0 if inline_prefixes else sample.prefix_len
    rec: dict[str, Any] = {}
    for col in SAMPLE_COLUMNS:
        if col.role == "layout":
            rec[col.name] = start
            continue
        value = getattr(sample, col.name)
        if col.role == "tokens":
            value = value[start:]
        rec[col.name] = [_plain(v) for v in value] if col.is_list else value
    return rec


def to_parquet_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """A `sample_to_record` record as a Parquet row (`json_text` columns' elements as JSON text)."""
    return {k: [json.dumps(v, sort_keys=True, ensure_ascii=False) for v in record[k]] if _JSON_TEXT.get(k)
            else record[k] for k in record}


def from_parquet_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A Parquet row as the record `sample_to_record` made (`json_text` columns parsed)."""
    return {k: [json.loads(v) for v in row[k]] if _JSON_TEXT.get(k) else row[k] for k in row}


def record_to_sample(record: Mapping[str, Any], *, prefix: Sequence[int] = (),
                     compactions: Sequence[Mapping[str, Any]] = ()) -> TrainingSample:
    """The full `TrainingSample` of a record: `prefix` is the `stored_from` tokens the record leaves out
    (from the row it references); `compactions` come from the file metadata."""
    start = record["stored_from"]
    if len(prefix) != start:
        raise ConfigError(f"record_to_sample: a prefix of {len(prefix)} tokens for a record stored from {start}")
    kwargs: dict[str, Any] = {}
    for col in SAMPLE_COLUMNS:
        if col.role in ("property", "layout"):
            continue
        if col.name not in record and col.name in V1_MISSING:
            kwargs[col.name] = V1_MISSING[col.name](record)
            continue
        value = record[col.name]
        if col.role == "tokens":
            head = tuple(prefix) if col.pad == FROM_PREFIX else (col.pad,) * start
            value = head + tuple(value)
        elif col.is_list:
            value = tuple(value)
        kwargs[col.name] = value
    return TrainingSample(**kwargs, compactions=tuple(compactions))


def schema_drift(cls: type = TrainingSample) -> list[str]:
    """What disagrees between `cls` (a `TrainingSample`-like dataclass) and `SAMPLE_COLUMNS`; empty when they agree."""
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    stored = [c for c in SAMPLE_COLUMNS if c.role in ("field", "tokens")]
    out = [f"field {name!r} of {cls.__name__} is no column (add it to SAMPLE_COLUMNS or NOT_COLUMNS)"
           for name in fields if name not in NOT_COLUMNS and name not in {c.name for c in stored}]
    out += [f"column {c.name!r} is no field of {cls.__name__}" for c in stored if c.name not in fields]
    out += [f"NOT_COLUMNS names {name!r}, no field of {cls.__name__}" for name in NOT_COLUMNS if name not in fields]
    for c in SAMPLE_COLUMNS:
        if c.role == "property" and not isinstance(getattr(cls, c.name, None), property):
            out.append(f"column {c.name!r} is no property of {cls.__name__}")
            continue
        if c.role not in ROLES:
            out.append(f"column {c.name!r}: role {c.role!r} is not one of {list(ROLES)}")
        ann = fields.get(c.name) if c.role in ("field", "tokens") else c.python
        if ann is None:
            continue
        if c.is_list != ann.startswith("tuple["):
            out.append(f"column {c.name!r} is {c.arrow} but the annotation is {ann}")
        top_level_none = not ann.startswith("tuple[") and "None" in ann.split(" | ")
        if c.nullable != top_level_none:
            out.append(f"column {c.name!r}: nullable={c.nullable} but the annotation is {ann}")
    return out
