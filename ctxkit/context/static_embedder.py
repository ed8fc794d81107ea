"""A static embedder derived from a sentence-transformers model: one vector per token, looked up and averaged.

Contextual embedding costs a transformer forward pass per text; on a 2-core CPU that made the summarize and
retrieve arms of the quickstart ~16x the cost of the rule-based arms per episode. The static embedder is the
cheap alternative a run can choose (`embedder="static"`, `summarizer_params = {model_path = "static"}`):

- The table: for every token `t` of the base model's vocabulary, row `t` is the base model's sentence vector
  of the input `[CLS] t [SEP]` (its own pooling and normalization, fixed width 3, rows computed in vocabulary
  order in batches of `BUILD_BATCH`, with `encode_threads()` torch threads). Built once per base model and
  cached on disk (`cache_dir()`), with a metadata file holding the base model's id and the table's sha256,
  checked on every load; a table that fails the check is rebuilt (with a warning), never used.
- A text's vector: the mean of the rows of its WordPiece tokens (the base tokenizer, no special tokens, no
  truncation) minus the table's centroid (the mean of all rows), L2-normalized, accumulated in float64. The
  raw rows share a large common direction (unrelated texts sat at cosine ~0.8); taking the centroid out
  spreads them (~0.2-0.4) while related texts stay near (~0.6-0.8). A pure function of the table and the
  text, so it does not depend on the batch; a text with no tokens gets the zero vector.

Specs: `static` (the default embedder's base, all-MiniLM-L6-v2) or `static:<model folder>`. The id is
`static-v1:<base model id>`, distinct from the base model's, so cached vectors and recorded specs never mix
the two. torch and sentence-transformers are needed only to build a table; loading one needs numpy and
`tokenizers`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

from ctxkit.errors import ConfigError
from ctxkit.context.encode_threads import encode_threads, torch_threads
from ctxkit.context.models import record_load, default_embedder_path, embedder_id, load_sentence_transformer

STATIC_SPEC = "static"
"""The spec naming the static embedder of the default base model (`static:<folder>` names another base)."""
STATIC_VERSION = 1
"""Version of the table construction and the text pooling (part of the id)."""
BUILD_BATCH = 512
"""Vocabulary rows per base-model call when building a table."""
CACHE_ENV = "CTXKIT_CACHE"
"""Environment variable naming ctxkit's cache folder (else `$XDG_CACHE_HOME/ctxkit`, else `~/.cache/ctxkit`)."""


def is_static_spec(spec: Any) -> bool:
    """Whether an embedder spec names a static embedder (`static` or `static:<folder>`)."""
    return isinstance(spec, str) and (spec == STATIC_SPEC or spec.startswith(STATIC_SPEC + ":"))


def static_base(spec: str) -> Path:
    """The base model folder of a static spec; `ConfigError` when it does not exist."""
    if not is_static_spec(spec):
        raise ConfigError(f"embedder spec {spec!r} is not a static spec ('static' or 'static:<model folder>')")
    rest = spec[len(STATIC_SPEC) + 1:]
    if spec == STATIC_SPEC:
        return default_embedder_path().resolve()
    if not rest:
        raise ConfigError(f"embedder spec {spec!r}: expected 'static:<model folder>'")
    base = Path(rest).expanduser()
    if not base.is_dir():
        raise ConfigError(f"embedder spec {spec!r}: base model folder {base} does not exist")
    return base.resolve()


def static_embedder_id(spec: str) -> str:
    """`static-v1:<base model id>` (the base id as `ctxkit.context.models.model_id` computes it)."""
    return f"static-v{STATIC_VERSION}:{embedder_id(static_base(spec))}"


def cache_dir() -> Path:
    """ctxkit's cache folder: `$CTXKIT_CACHE`, else `$XDG_CACHE_HOME/ctxkit`, else `~/.cache/ctxkit`."""
    given = os.environ.get(CACHE_ENV, "").strip()
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "ctxkit"


def _tokenizer(base: Path) -> Any:
    from tokenizers import Tokenizer  # lazy: tokenizers loads on first use

    path = base / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"static embedder: base model folder {base} has no tokenizer.json")
    tok = Tokenizer.from_file(str(path))
    tok.no_truncation()
    tok.no_padding()
    return tok


def _special_id(tok: Any, names: Sequence[str], base: Path) -> int:
    for name in names:
        found = tok.token_to_id(name)
        if found is not None:
            return int(found)
    raise ConfigError(f"static embedder: the tokenizer of {base} has none of the special tokens {list(names)}")


def build_table(base: Path, device: str = "cpu"):
    """The `(vocab, dim)` float32 table of `base` (see the module docstring); needs the `retrieval` extra."""
    import numpy as np  # lazy: numpy loads on first use
    import torch  # lazy: torch loads on first use

    tok = _tokenizer(base)
    first = _special_id(tok, ("[CLS]", "<s>"), base)
    last = _special_id(tok, ("[SEP]", "</s>"), base)
    model = load_sentence_transformer(base, device)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    rows: list[Any] = []
    with torch.inference_mode(), torch_threads(torch, encode_threads()):
        for start in range(0, vocab, BUILD_BATCH):
            ids = torch.arange(start, min(vocab, start + BUILD_BATCH), dtype=torch.long)
            n = len(ids)
            input_ids = torch.stack([torch.full((n,), first), ids, torch.full((n,), last)], dim=1)
            features = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
                        "token_type_ids": torch.zeros_like(input_ids)}
            features = {k: v.to(model.device) for k, v in features.items()}
            rows.append(model.forward(features)["sentence_embedding"].float().cpu().numpy())
    return np.ascontiguousarray(np.concatenate(rows), dtype=np.float32)


def _table_paths(base_id: str) -> tuple[Path, Path]:
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in base_id) + f"-static-v{STATIC_VERSION}"
    folder = cache_dir() / "static-embedders"
    return folder / f"{stem}.npy", folder / f"{stem}.json"


def _read_table(table_path: Path, meta_path: Path, base_id: str, warn: bool = True):
    """The cached table, or None when it is missing or fails its check (then a warning says why)."""
    import numpy as np  # lazy: numpy loads on first use

    if not table_path.is_file() or not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        data = table_path.read_bytes()
        problem = None
        if meta.get("base_id") != base_id or meta.get("version") != STATIC_VERSION:
            problem = f"built for {meta.get('base_id')!r} v{meta.get('version')}"
        elif hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            problem = "its sha256 differs from the one recorded when it was built"
        if problem is None:
            return np.load(io.BytesIO(data), allow_pickle=False)
    except (OSError, ValueError, AttributeError) as exc:
        problem = f"unreadable ({exc})"
    if warn:
        warnings.warn(f"static embedder table {table_path}: {problem}; rebuilding it", RuntimeWarning, stacklevel=3)
    return None


def _write_table(table, table_path: Path, meta_path: Path, base_id: str, seconds: float) -> None:
    import numpy as np  # lazy: numpy loads on first use

    buf = io.BytesIO()
    np.save(buf, table, allow_pickle=False)
    data = buf.getvalue()
    meta = {"base_id": base_id, "version": STATIC_VERSION, "shape": list(table.shape), "dtype": str(table.dtype),
            "sha256": hashlib.sha256(data).hexdigest(), "build_s": round(seconds, 3)}
    table_path.parent.mkdir(parents=True, exist_ok=True)
    for path, payload in ((table_path, data), (meta_path, json.dumps(meta, indent=1).encode())):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(payload)
        os.replace(tmp, path)


class StaticEmbedder:
    """A loaded static embedder: the table and the base tokenizer; `encode` has sentence-transformers' shape."""

    def __init__(self, spec: str, table: Any, tokenizer: Any):
        self.spec = spec
        """The spec it was loaded from."""
        self.id = static_embedder_id(spec)
        """`static-v1:<base model id>`."""
        self.table = table
        """The `(vocab, dim)` float32 token table."""
        self.tokenizer = tokenizer
        """The base model's `tokenizers.Tokenizer` (no truncation, no padding)."""
        self.centroid = table.mean(axis=0, dtype="float64")
        """The mean of all rows (float64), taken out of every text's mean."""

    def encode(self, texts: Sequence[str], normalize_embeddings: bool = True, **_ignored: Any):
        """A `(len(texts), dim)` float32 array: per text the mean of its tokens' rows minus the centroid,
        L2-normalized unless `normalize_embeddings` is False; a text without tokens gives zeros."""
        import numpy as np  # lazy: numpy loads on first use

        texts = list(texts)
        out = np.zeros((len(texts), self.table.shape[1]), dtype=np.float32)
        for i, enc in enumerate(self.tokenizer.encode_batch(texts, add_special_tokens=False) if texts else ()):
            if not enc.ids:
                continue
            vec = self.table[np.asarray(enc.ids, dtype=np.int64)].sum(axis=0, dtype=np.float64) / len(enc.ids)
            vec = vec - self.centroid
            if normalize_embeddings:
                norm = float(np.sqrt(vec @ vec))
                vec = vec / norm if norm > 0 else vec
            out[i] = vec
        return out


_STATIC_CACHE: dict[tuple[str, str], StaticEmbedder] = {}
_STATIC_LOCK = threading.Lock()


def load_static_embedder(spec: str = STATIC_SPEC, device: str = "cpu") -> StaticEmbedder:
    """The static embedder of `spec`, cached per process; the table is read from `cache_dir()` or built
    there (under a file lock, so parallel workers build it once). The load is recorded in `model_loads`."""
    from filelock import FileLock  # lazy: only a load needs it

    base = static_base(spec)
    key = (str(base), str(device))
    with _STATIC_LOCK:
        cached = _STATIC_CACHE.get(key)
        if cached is not None:
            return cached
        started = time.perf_counter()
        base_id = embedder_id(base)
        table_path, meta_path = _table_paths(base_id)
        table = _read_table(table_path, meta_path, base_id)
        if table is None:
            table_path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(table_path) + ".lock"):
                table = _read_table(table_path, meta_path, base_id, warn=False)
                if table is None:
                    t0 = time.perf_counter()
                    table = build_table(base, device)
                    _write_table(table, table_path, meta_path, base_id, time.perf_counter() - t0)
        loaded = StaticEmbedder(spec, table, _tokenizer(base))
        _STATIC_CACHE[key] = loaded
        record_load("embedder", f"{STATIC_SPEC}:{base}", str(device), time.perf_counter() - started)
        return loaded


def clear_static_cache() -> None:
    """Forget every loaded static embedder (tables on disk stay)."""
    with _STATIC_LOCK:
        _STATIC_CACHE.clear()
