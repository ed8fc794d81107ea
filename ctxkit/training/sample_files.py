"""Write training samples to Parquet (pyarrow) or JSONL, and read them back.

One row (one JSON line) per `TrainingSample`. Shared prefixes are stored once: a sample that starts with
the first `prefix_len` tokens of an earlier sample of the same episode (`prefix_sample`) stores only its
tokens from `stored_from = prefix_len` on; those prefix tokens are always prompt (mask 0, no log-prob), so
nothing is lost, and `read_samples` rebuilds full samples. Pass `inline_prefixes=True` for self-contained
rows (`stored_from = 0`; `prefix_sample`/`prefix_len` still say what is shared).

Columns: `ctxkit.training.sample_schema.SAMPLE_COLUMNS`, the one declaration of their names, order, Arrow
types and meanings (`PARQUET_SCHEMA` here is its `(name, type)` pairs; `parquet_schema()` the Arrow schema,
`datasets_features()` the `datasets` features). The JSONL records have the same keys, with `sampling` as
objects and `policy_versions` as native JSON values instead of JSON text.

File metadata (Parquet only; the columns are the same for every export): `ctxkit` = `training-samples-v2`
(`sample_schema.FILE_VERSION`); `ctxkit-info`, JSON given by the writer (`ctxkit samples` records the sources
and, with `--compressor`, the compressor, its parameters and the budget); `ctxkit-compactions`, JSON list of
`[episode_id, sample_index, compactions]` for samples rebuilt under another compressor
(`TrainingSample.compactions`; `read_samples` restores them). `parquet_info(path)` reads both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from ctxkit.errors import ConfigError, LogFormatError
from ctxkit.training.episode_samples import TrainingSample
from ctxkit.training.sample_schema import (FILE_VERSION, SAMPLE_COLUMNS, from_parquet_row, record_to_sample,
                                           sample_to_record, to_parquet_row)

__all__ = ["PARQUET_SCHEMA", "datasets_features", "parquet_info", "parquet_schema", "read_samples", "sample_to_record",
           "write_jsonl", "write_parquet", "write_samples"]

PARQUET_SCHEMA: tuple[tuple[str, str], ...] = tuple((c.name, c.arrow) for c in SAMPLE_COLUMNS)
"""Column name -> Arrow type, in order: `sample_schema.SAMPLE_COLUMNS` as pairs."""


def parquet_schema():
    """The `pyarrow.Schema` of the Parquet export (from `sample_schema.SAMPLE_COLUMNS`)."""
    import pyarrow as pa  # lazy: pyarrow loads on first use

    scalar = {"string": pa.string(), "int32": pa.int32(), "int8": pa.int8(), "float64": pa.float64(), "bool": pa.bool_()}
    fields = []
    for col in SAMPLE_COLUMNS:
        typ = pa.list_(scalar[col.arrow[5:-1]]) if col.is_list else scalar[col.arrow]
        fields.append(pa.field(col.name, typ))  # nullable, as in every v1 file (`Column.nullable` is the contract)
    return pa.schema(fields, metadata={b"ctxkit": FILE_VERSION.encode()})


def datasets_features():
    """The `datasets.Features` of a Parquet export as `datasets` loads it (from `parquet_schema()`)."""
    from datasets import Features  # lazy: datasets loads on first use

    return Features.from_arrow_schema(parquet_schema())


def write_parquet(samples: Iterable[TrainingSample], path, *, inline_prefixes: bool = False,
                  info: Mapping[str, Any] | None = None) -> Path:
    """Write samples to a Parquet file (schema `PARQUET_SCHEMA`, `info` and the samples' compactions in the
    file metadata); returns the path."""
    import pyarrow as pa  # lazy: pyarrow loads on first use
    import pyarrow.parquet as pq  # lazy: pyarrow loads on first use

    samples = list(samples)
    schema = parquet_schema()
    extra = {}
    if info:
        extra[b"ctxkit-info"] = json.dumps(info, sort_keys=True, ensure_ascii=False).encode()
    compactions = [[s.episode_id, s.sample_index, [dict(c) for c in s.compactions]] for s in samples if s.compactions]
    if compactions:
        extra[b"ctxkit-compactions"] = json.dumps(compactions, sort_keys=True, ensure_ascii=False).encode()
    if extra:
        schema = schema.with_metadata({**schema.metadata, **extra})
    rows = [to_parquet_row(sample_to_record(s, inline_prefixes=inline_prefixes)) for s in samples]
    table = pa.Table.from_pylist(rows, schema=schema)
    path = Path(path)
    pq.write_table(table, path)
    return path


def write_jsonl(samples: Iterable[TrainingSample], path, *, inline_prefixes: bool = False) -> Path:
    """Write samples as JSON lines (one record per line, `sample_to_record`); returns the path."""
    path = Path(path)
    with open(path, "w", encoding="utf-8") as fh:
        for s in samples:
            fh.write(json.dumps(sample_to_record(s, inline_prefixes=inline_prefixes), ensure_ascii=False, allow_nan=False))
            fh.write("\n")
    return path


def write_samples(samples: Iterable[TrainingSample], path, *, inline_prefixes: bool = False,
                  info: Mapping[str, Any] | None = None) -> Path:
    """Write to Parquet or JSONL by the file suffix (`.parquet`, `.jsonl`); `info` is kept in Parquet's file
    metadata only (JSONL rows have no place for it)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        return write_parquet(samples, path, inline_prefixes=inline_prefixes, info=info)
    if suffix in (".jsonl", ".ndjson"):
        return write_jsonl(samples, path, inline_prefixes=inline_prefixes)
    raise ConfigError(f"output {path}: unknown format {suffix or '(no suffix)'}; use .parquet or .jsonl")


def _records(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # lazy: pyarrow loads on first use

        return [from_parquet_row(r) for r in pq.read_table(path).to_pylist()]
    if suffix in (".jsonl", ".ndjson"):
        rows = []
        with open(path, encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise LogFormatError(f"not JSON: {exc.msg}", path=str(path), line=i) from None
        return rows
    raise ConfigError(f"input {path}: unknown format {suffix or '(no suffix)'}; use .parquet or .jsonl")


def parquet_info(path) -> dict[str, Any]:
    """`{"info": ..., "compactions": {(episode_id, sample_index): [...]}}` from a Parquet export's file
    metadata (empty when the writer recorded none)."""
    import pyarrow.parquet as pq  # lazy: pyarrow loads on first use

    meta = pq.read_schema(path).metadata or {}
    try:
        info = json.loads(meta[b"ctxkit-info"]) if b"ctxkit-info" in meta else {}
        rows = json.loads(meta[b"ctxkit-compactions"]) if b"ctxkit-compactions" in meta else []
    except ValueError as exc:
        raise LogFormatError(f"Parquet file metadata is not JSON: {exc}", path=str(path)) from None
    return {"info": info, "compactions": {(ep, int(i)): tuple(c) for ep, i, c in rows}}


def read_samples(path) -> list[TrainingSample]:
    """Read an export back into full `TrainingSample`s (shared prefixes resolved from earlier rows;
    compactions restored from a Parquet file's metadata)."""
    path = Path(path)
    compactions = parquet_info(path)["compactions"] if path.suffix.lower() == ".parquet" else {}
    full: dict[tuple[str, int], tuple[int, ...]] = {}
    out = []
    for n, r in enumerate(_records(path)):
        key = (r["episode_id"], r["sample_index"])
        start = r["stored_from"]
        prefix: tuple[int, ...] = ()
        if start:
            ref = full.get((r["episode_id"], r["prefix_sample"]))
            if ref is None or len(ref) < start:
                raise LogFormatError(
                    f"row {n}: prefix sample {r['prefix_sample']} of episode {r['episode_id']!r} is missing or too short",
                    path=str(path),
                )
            prefix = ref[:start]
        sample = record_to_sample(r, prefix=prefix, compactions=compactions.get(key, ()))
        if sample.n_tokens != r["n_tokens"]:
            raise LogFormatError(f"row {n}: rebuilt {sample.n_tokens} tokens, the row says {r['n_tokens']}",
                                 path=str(path))
        full[key] = sample.token_ids
        out.append(sample)
    return out
