"""A content-hash cache of embedding vectors: in memory per process, and on disk under a run folder.

Each vector is keyed by `vector_key(model_id, text)` (sha256 of the model id, a NUL byte and the text), so
a text is embedded once per model however many arms, episodes, steps or worker processes ask for it. The
cache is an optimization only: it stores exactly the vectors the model gave, and a hit returns those
bytes, so a run with a warm cache records what a cold run recorded.

On disk (`set_cache_dir(root)`; a run uses `<run>/cache/embeddings`), every model has a folder
`<root>/<model id, ':' and '@' replaced>/` holding one append-only file per writing process
(`<pid>-<random>.vec`). Each record is self-checking:

    b"CKE1" | dim (uint32 LE) | key (32 bytes) | dim float32 LE | sha256(everything before)[:8]

Readers take the complete records with a valid checksum and a finite unit-norm vector; a partial tail (a
writer in progress, a killed process) is left for a later read, and a corrupt record ends the reading of
its file: nothing after it is trusted. No file is ever rewritten, so concurrent workers need no lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import struct
import threading
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

MAGIC = b"CKE1"
"""First bytes of every on-disk record."""
_HEAD = struct.Struct("<4sI32s")
_CHECK_BYTES = 8
MAX_DIM = 65_536
"""Largest vector dimension a record may claim (anything larger is corruption)."""
MEMORY_LIMIT = 50_000
"""Most vectors kept in memory per model (the oldest dropped first; the disk keeps them all)."""

_LOCK = threading.RLock()
_CACHE_DIR: Path | None = None
_CACHES: dict[tuple[str, str | None], "VectorCache"] = {}
_STATS = {"texts_encoded": 0, "encode_calls": 0}


def vector_key(model_id: str, text: str) -> bytes:
    """The 32-byte cache key of `text` under the model `model_id`."""
    return hashlib.sha256(model_id.encode("utf-8") + b"\0" + text.encode("utf-8")).digest()


def set_cache_dir(path: str | os.PathLike | None) -> None:
    """Use `path` as this process's on-disk embedding cache root (None: memory only)."""
    global _CACHE_DIR
    with _LOCK:
        _CACHE_DIR = None if path is None else Path(path)


@contextlib.contextmanager
def using_cache_dir(path: str | os.PathLike | None) -> Iterator[None]:
    """`set_cache_dir(path)` for the duration of a `with` block (the previous root restored after)."""
    previous = _CACHE_DIR
    set_cache_dir(path)
    try:
        yield
    finally:
        set_cache_dir(previous)


def cache_dir() -> Path | None:
    """This process's on-disk embedding cache root, or None."""
    return _CACHE_DIR


def run_cache_dir(run_dir: str | os.PathLike) -> Path:
    """Where a run folder keeps its embedding cache: `<run>/cache/embeddings`."""
    return Path(run_dir) / "cache" / "embeddings"


def encode_stats() -> dict[str, int]:
    """Process-wide counts of texts sent to an embedding model and of model calls (for tests and benchmarks)."""
    with _LOCK:
        return dict(_STATS)


def count_encode(n_texts: int) -> None:
    """Record one model call over `n_texts` texts in `encode_stats`."""
    with _LOCK:
        _STATS["encode_calls"] += 1
        _STATS["texts_encoded"] += n_texts


def model_folder_name(model_id: str) -> str:
    """A file-system-safe folder name for a model id."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in model_id)


def vector_cache(model_id: str) -> "VectorCache":
    """The process-wide cache of `model_id` under the current `cache_dir()` (created on first use)."""
    with _LOCK:
        root = _CACHE_DIR
        key = (model_id, None if root is None else str(root))
        cache = _CACHES.get(key)
        if cache is None:
            cache = VectorCache(model_id, None if root is None else root / model_folder_name(model_id))
            _CACHES[key] = cache
        return cache


def clear_vector_caches() -> None:
    """Forget every in-memory vector (on-disk files stay) and reset `encode_stats`."""
    with _LOCK:
        for cache in _CACHES.values():
            cache.close()
        _CACHES.clear()
        _STATS.update(texts_encoded=0, encode_calls=0)


def parse_records(data: bytes) -> tuple[list[tuple[bytes, Any]], int, bool]:
    """`(records, bytes consumed, corrupt)` of on-disk cache bytes: complete valid records from the start;
    reading stops at a partial tail (not consumed, not corrupt) or at the first invalid record (corrupt)."""
    import numpy as np  # lazy: numpy loads on first use

    out: list[tuple[bytes, Any]] = []
    pos = 0
    n = len(data)
    while pos < n:
        if n - pos < _HEAD.size:
            return out, pos, data[pos:pos + 4] != MAGIC[: n - pos]
        magic, dim, key = _HEAD.unpack_from(data, pos)
        if magic != MAGIC or not 0 < dim <= MAX_DIM:
            return out, pos, True
        end = pos + _HEAD.size + 4 * dim + _CHECK_BYTES
        if end > n:
            return out, pos, False
        body = data[pos:end - _CHECK_BYTES]
        if hashlib.sha256(body).digest()[:_CHECK_BYTES] != data[end - _CHECK_BYTES:end]:
            return out, pos, True
        vec = np.frombuffer(body, dtype="<f4", offset=_HEAD.size).astype(np.float32)
        norm = float(np.linalg.norm(vec))
        if not np.isfinite(vec).all() or not math.isclose(norm, 1.0, abs_tol=1e-3):
            return out, pos, True
        out.append((key, vec))
        pos = end
    return out, pos, False


def record_bytes(key: bytes, vec: Any) -> bytes:
    """One on-disk record for the unit vector `vec` under `key`."""
    import numpy as np  # lazy: numpy loads on first use

    v = np.ascontiguousarray(vec, dtype="<f4")
    body = _HEAD.pack(MAGIC, v.shape[0], key) + v.tobytes()
    return body + hashlib.sha256(body).digest()[:_CHECK_BYTES]


class VectorCache:
    """The vectors of one model: a bounded in-memory map, backed by a folder of append-only files when given."""

    def __init__(self, model_id: str, folder: Path | None):
        self.model_id = model_id
        self.folder = folder
        """The model's on-disk folder (None: memory only)."""
        self._mem: OrderedDict[bytes, Any] = OrderedDict()
        self._offsets: dict[str, int] = {}
        self._dead: set[str] = set()
        self._own: Any = None
        self._own_name: str | None = None
        self._lock = threading.Lock()

    def get_many(self, keys: Iterable[bytes]) -> dict[bytes, Any]:
        """The cached vectors among `keys` (reading what other processes appended when some are missing)."""
        keys = list(keys)
        with self._lock:
            found = {k: self._mem[k] for k in keys if k in self._mem}
            if len(found) < len(set(keys)) and self.folder is not None:
                self._refresh()
                found = {k: self._mem[k] for k in keys if k in self._mem}
            return found

    def put_many(self, items: Mapping[bytes, Any]) -> None:
        """Remember new vectors (and append them to this process's file when on disk)."""
        with self._lock:
            fresh = [(k, v) for k, v in items.items() if k not in self._mem]
            for k, v in fresh:
                self._remember(k, v)
            if self.folder is None or not fresh:
                return
            try:
                if self._own is None:
                    self.folder.mkdir(parents=True, exist_ok=True)
                    self._own_name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}.vec"
                    self._own = open(self.folder / self._own_name, "ab")
                self._own.write(b"".join(record_bytes(k, v) for k, v in fresh))
                self._own.flush()
            except OSError:
                self._own = None  # an unwritable cache only costs speed

    def close(self) -> None:
        """Close this process's cache file."""
        with self._lock:
            if self._own is not None:
                self._own.close()
                self._own = None

    def __len__(self) -> int:
        """Vectors held in memory."""
        return len(self._mem)

    def _remember(self, key: bytes, vec: Any) -> None:
        self._mem[key] = vec
        while len(self._mem) > MEMORY_LIMIT:
            self._mem.popitem(last=False)

    def _refresh(self) -> None:
        """Read the bytes appended to the model's files since the last read (other processes' vectors)."""
        try:
            names = sorted(p.name for p in self.folder.glob("*.vec"))
        except OSError:
            return
        for name in names:
            if name in self._dead or name == self._own_name:
                continue
            start = self._offsets.get(name, 0)
            try:
                with open(self.folder / name, "rb") as fh:
                    fh.seek(start)
                    data = fh.read()
            except OSError:
                continue
            records, used, corrupt = parse_records(data)
            for k, v in records:
                if k not in self._mem:
                    self._remember(k, v)
            self._offsets[name] = start + used
            if corrupt:
                self._dead.add(name)
