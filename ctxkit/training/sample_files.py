"""Write training samples to Parquet (pyarrow) or JSONL, and read them back.

One row (one JSON line) per `TrainingSample`. Shared prefixes are stored once: a sample that starts with
the first `prefix_len` tokens of an earlier sample of the same episode (`prefix_sample`) stores only its
tokens from `stored_from = prefix_len` on; those prefix tokens are always prompt (mask 0, no log-prob), so
nothing is lost, and `read_samples` rebuilds full samples. Pass `inline_prefixes=True` for self-contained
rows (`stored_from = 0`; `prefix_sample`/`prefix_len` still say what is shared).

Parquet schema (`PARQUET_SCHEMA`; the JSONL records have the same keys, with `sampling` as objects and
`policy_versions` as native JSON values instead of JSON text):

| column | type | meaning |
|---|---|---|
| `episode_id` | string | episode the sample comes from |
| `sample_index` | int32 | position among the episode's samples |
| `prefix_sample` | int32, null | `sample_index` of the earlier sample sharing the first `prefix_len` tokens |
| `prefix_len` | int32 | length of that shared prefix (0 when none) |
| `stored_from` | int32 | position in the full sample of the first stored token (`prefix_len`, or 0 inline) |
| `n_tokens` | int32 | length of the full sample |
| `prompt_len` | int32 | length of the first step's context |
| `token_ids` | list<int32> | tokens `[stored_from:]` |
| `loss_mask` | list<int8> | 1 on sampled tokens, aligned with `token_ids` |
| `logprobs` | list<float64> | behaviour log-prob on sampled tokens, null elsewhere |
| `token_step` | list<int32> | per token: index into `step_seqs` of the sampling step, -1 elsewhere |
| `step_seqs` | list<int32> | log seq of each merged step |
| `logprob_kinds` | list<string> | per step: `raw` / `processed` / `recomputed` (null if unknown) |
| `logprob_kind` | string, null | the common kind, `mixed`, or null |
| `sampling` | list<string> | per step: sampling config as JSON text |
| `policy_versions` | list<string> | per step: policy version as JSON text (`7`, `"ckpt-3"`, `null`) |
| `finish_reasons` | list<string> | per step finish reason |
| `context_hashes` | list<string> | per step verified context hash |
| `reward` | float64, null | episode reward (null: unscored / no end) |
| `reward_kind` | string | provenance: one of `events.REWARD_KINDS` |
| `outcome` | string, null | `terminated` / `truncated` (null: no end event) |
| `cause` | string | why the episode ended |
| `is_final` | bool | holds the episode's last step |
| `template_id`, `tokenizer_id`, `compressor` | string | how the contexts were built |

File metadata (Parquet only; the columns above are the same for every export): `ctxkit` =
`training-samples-v1`; `ctxkit-info`, JSON given by the writer (`ctxkit samples` records the sources and,
with `--compressor`, the compressor, its parameters and the budget); `ctxkit-compactions`, JSON list of
`[episode_id, sample_index, compactions]` for samples rebuilt under another compressor
(`TrainingSample.compactions`; `read_samples` restores them). `parquet_info(path)` reads both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from ctxkit.errors import ConfigError, LogFormatError
from ctxkit.training.episode_samples import TrainingSample

__all__ = ["PARQUET_SCHEMA", "parquet_info", "parquet_schema", "read_samples", "sample_to_record", "write_jsonl", "write_parquet", "write_samples"]

PARQUET_SCHEMA: tuple[tuple[str, str], ...] = (
    ("episode_id", "string"),
    ("sample_index", "int32"),
    ("prefix_sample", "int32"),
    ("prefix_len", "int32"),
    ("stored_from", "int32"),
    ("n_tokens", "int32"),
    ("prompt_len", "int32"),
    ("token_ids", "list<int32>"),
    ("loss_mask", "list<int8>"),
    ("logprobs", "list<float64>"),
    ("token_step", "list<int32>"),
    ("step_seqs", "list<int32>"),
    ("logprob_kinds", "list<string>"),
    ("logprob_kind", "string"),
    ("sampling", "list<string>"),
    ("policy_versions", "list<string>"),
    ("finish_reasons", "list<string>"),
    ("context_hashes", "list<string>"),
    ("reward", "float64"),
    ("reward_kind", "string"),
    ("outcome", "string"),
    ("cause", "string"),
    ("is_final", "bool"),
    ("template_id", "string"),
    ("tokenizer_id", "string"),
    ("compressor", "string"),
)
"""Column name -> Arrow type, in order (see the module docstring for meanings)."""


def parquet_schema():
    """The `pyarrow.Schema` of the Parquet export."""
    import pyarrow as pa  # lazy: pyarrow loads on first use

    scalar = {"string": pa.string(), "int32": pa.int32(), "int8": pa.int8(), "float64": pa.float64(), "bool": pa.bool_()}
    fields = []
    for name, typ in PARQUET_SCHEMA:
        if typ.startswith("list<"):
            fields.append(pa.field(name, pa.list_(scalar[typ[5:-1]])))
        else:
            fields.append(pa.field(name, scalar[typ]))
    return pa.schema(fields, metadata={b"ctxkit": b"training-samples-v1"})


def sample_to_record(sample: TrainingSample, *, inline_prefixes: bool = False) -> dict[str, Any]:
    """One JSON-able record (the JSONL form) of a sample, storing tokens from `stored_from` on."""
    start = 0 if inline_prefixes else sample.prefix_len
    return {
        "episode_id": sample.episode_id,
        "sample_index": sample.sample_index,
        "prefix_sample": sample.prefix_sample,
        "prefix_len": sample.prefix_len,
        "stored_from": start,
        "n_tokens": len(sample.token_ids),
        "prompt_len": sample.prompt_len,
        "token_ids": list(sample.token_ids[start:]),
        "loss_mask": list(sample.loss_mask[start:]),
        "logprobs": list(sample.logprobs[start:]),
        "token_step": list(sample.token_step[start:]),
        "step_seqs": list(sample.step_seqs),
        "logprob_kinds": list(sample.logprob_kinds),
        "logprob_kind": sample.logprob_kind,
        "sampling": [dict(s) for s in sample.sampling],
        "policy_versions": list(sample.policy_versions),
        "finish_reasons": list(sample.finish_reasons),
        "context_hashes": list(sample.context_hashes),
        "reward": sample.reward,
        "reward_kind": sample.reward_kind,
        "outcome": sample.outcome,
        "cause": sample.cause,
        "is_final": sample.is_final,
        "template_id": sample.template_id,
        "tokenizer_id": sample.tokenizer_id,
        "compressor": sample.compressor,
    }


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


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
    rows = []
    for s in samples:
        rec = sample_to_record(s, inline_prefixes=inline_prefixes)
        rec["sampling"] = [_dumps(x) for x in rec["sampling"]]
        rec["policy_versions"] = [_dumps(x) for x in rec["policy_versions"]]
        rows.append(rec)
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

        rows = pq.read_table(path).to_pylist()
        for r in rows:
            r["sampling"] = [json.loads(x) for x in r["sampling"]]
            r["policy_versions"] = [json.loads(x) for x in r["policy_versions"]]
        return rows
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
        ids = prefix + tuple(r["token_ids"])
        if len(ids) != r["n_tokens"]:
            raise LogFormatError(f"row {n}: rebuilt {len(ids)} tokens, the row says {r['n_tokens']}", path=str(path))
        full[key] = ids
        out.append(
            TrainingSample(
                episode_id=r["episode_id"],
                sample_index=r["sample_index"],
                token_ids=ids,
                loss_mask=(0,) * start + tuple(r["loss_mask"]),
                logprobs=(None,) * start + tuple(r["logprobs"]),
                token_step=(-1,) * start + tuple(r["token_step"]),
                prompt_len=r["prompt_len"],
                step_seqs=tuple(r["step_seqs"]),
                logprob_kinds=tuple(r["logprob_kinds"]),
                sampling=tuple(r["sampling"]),
                policy_versions=tuple(r["policy_versions"]),
                finish_reasons=tuple(r["finish_reasons"]),
                context_hashes=tuple(r["context_hashes"]),
                prefix_sample=r["prefix_sample"],
                prefix_len=r["prefix_len"],
                reward=r["reward"],
                reward_kind=r["reward_kind"],
                outcome=r["outcome"],
                cause=r["cause"],
                is_final=r["is_final"],
                template_id=r["template_id"],
                tokenizer_id=r["tokenizer_id"],
                compressor=r["compressor"],
                compactions=compactions.get(key, ()),
            )
        )
    return out

