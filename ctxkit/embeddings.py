"""Embeddings for retrieval: a counted text embedder and an incremental faiss index of passages (L2).

`TextEmbedder` turns texts into L2-normalized float32 vectors with a sentence-transformers model
(all-MiniLM-L6-v2 by default, via `ctxkit.models.load_embedder`) and counts what it encodes.
`PassageIndex` keeps a faiss `IndexFlatIP` over those vectors (inner product of unit vectors = cosine)
and grows it incrementally: a document (an event's text) is cut into passages and embedded once, keyed
by its event id and the sha256 of its text; adding it again costs nothing. `search` returns the best
passage per document, for the documents a caller allows.

faiss and numpy are imported inside functions, so importing this module is cheap.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ctxkit.errors import ConfigError


def text_sha(text: str) -> str:
    """sha256 hex of a text (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_SHARED_VECTORS: dict[str, "OrderedDict[str, Any]"] = {}
"""Per embedder id: text sha256 -> unit vector, shared by every `TextEmbedder` loaded from a path."""
_SHARED_LOCK = threading.Lock()
VECTOR_CACHE_SIZE = 50_000
"""Most vectors kept per embedder (the oldest dropped first)."""


class TextEmbedder:
    """Sentence embeddings, L2-normalized float32, cached by text and counted.

    By default the model at `model_path` (all-MiniLM-L6-v2 when None) is loaded lazily on first use and
    shared (`ctxkit.models.load_embedder`), and vectors are cached per text in a process-wide cache keyed
    by the model's id, so a text is embedded once per process whoever asks. `model` may instead be any
    object with a sentence-transformers style `encode(texts, ...)`; its vectors are cached on this
    instance only.
    """

    def __init__(self, model_path: str | os.PathLike | None = None, device: str = "cpu", model: Any = None):
        self.model_path = model_path
        self.device = str(device)
        self._model = model
        self._private: OrderedDict[str, Any] | None = OrderedDict() if model is not None else None
        self._id: str | None = None
        self.calls = 0
        """Number of `encode` calls that reached the model."""
        self.texts_encoded = 0
        """Number of texts sent to the model (cache misses)."""

    @property
    def id(self) -> str:
        """`<model name>@sha256:<16 hex>` of the embedding model's weights."""
        if self._id is None:
            from ctxkit.models import embedder_id

            self._id = embedder_id(self.model_path)
        return self._id

    @property
    def model(self) -> Any:
        """The underlying model (loaded on first access)."""
        if self._model is None:
            from ctxkit.models import load_embedder

            self._model = load_embedder(self.model_path, device=self.device)
        return self._model

    def _cache(self) -> "OrderedDict[str, Any]":
        if self._private is not None:
            return self._private
        with _SHARED_LOCK:
            return _SHARED_VECTORS.setdefault(self.id, OrderedDict())

    def encode(self, texts: Sequence[str]):
        """A `(len(texts), dim)` float32 array of unit vectors (`(0, 0)` for no texts); only texts not
        seen before reach the model, in one call."""
        import numpy as np

        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        cache = self._cache()
        keys = [text_sha(t) for t in texts]
        with _SHARED_LOCK:
            found = {k: cache[k] for k in keys if k in cache}
        missing: dict[str, str] = {}
        for k, t in zip(keys, texts):
            if k not in found:
                missing.setdefault(k, t)
        if missing:
            vecs = self.model.encode(list(missing.values()), normalize_embeddings=True, convert_to_numpy=True,
                                     show_progress_bar=False)
            vecs = np.asarray(vecs, dtype=np.float32)
            if vecs.ndim != 2 or vecs.shape[0] != len(missing):
                raise ConfigError(f"embedder {self.id}: encode returned shape {vecs.shape} for {len(missing)} texts")
            self.calls += 1
            self.texts_encoded += len(missing)
            with _SHARED_LOCK:
                for k, v in zip(missing, vecs):
                    found[k] = v
                    cache[k] = v
                while len(cache) > VECTOR_CACHE_SIZE:
                    cache.popitem(last=False)
        return np.ascontiguousarray(np.stack([found[k] for k in keys]))


def chunk_text(text: str, max_chars: int) -> list[str]:
    """`text` cut into passages of at most `max_chars` characters: whole lines are packed together; a
    longer line is split at whitespace (or hard, when it has none). Empty text gives no passage."""
    if max_chars < 1:
        raise ConfigError(f"chunk_text: max_chars is {max_chars}; expected >= 1")
    pieces: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        while len(line) > max_chars:
            cut = line.rfind(" ", 0, max_chars + 1)
            if cut <= 0:
                cut = max_chars
            pieces.append(line[:cut].rstrip())
            line = line[cut:].lstrip()
        if line:
            pieces.append(line)
    out: list[str] = []
    for piece in pieces:
        if out and len(out[-1]) + 1 + len(piece) <= max_chars:
            out[-1] = out[-1] + "\n" + piece
        else:
            out.append(piece)
    return out


@dataclass(frozen=True)
class Passage:
    """One indexed passage of a document."""

    doc_id: str
    """The document (event) id."""
    doc_sha: str
    """sha256 of the whole document text."""
    chunk: int
    """0-based passage number within the document."""
    text: str
    """The passage text."""


@dataclass(frozen=True)
class Hit:
    """A search result: the best passage of one document and its cosine score."""

    passage: Passage
    score: float
    """Cosine similarity to the query, rounded to 6 decimals."""


class PassageIndex:
    """An incremental faiss `IndexFlatIP` over unit passage vectors, with the row -> passage mapping."""

    def __init__(self, embedder: TextEmbedder, max_chars: int):
        self.embedder = embedder
        self.max_chars = max_chars
        self.passages: list[Passage] = []
        """Row i of the faiss index is `passages[i]`."""
        self._docs: dict[tuple[str, str], tuple[int, int]] = {}
        self._index: Any = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Number of passages (rows) in the index."""
        return len(self.passages)

    @property
    def n_documents(self) -> int:
        """Number of documents indexed."""
        return len(self._docs)

    def has(self, doc_id: str, text: str) -> bool:
        """Whether this document (id and text) is indexed already."""
        return (doc_id, text_sha(text)) in self._docs

    def add(self, docs: Iterable[tuple[str, str]], also: Sequence[str] = ()) -> int:
        """Index the documents `(doc_id, text)` not indexed yet (one `encode` call for all their passages);
        returns the number of passages added. Texts in `also` (e.g. the next query) are embedded in the
        same call when any passage is new, so a later `search` finds their vectors cached."""
        new: list[Passage] = []
        spans: dict[tuple[str, str], tuple[int, int]] = {}
        with self._lock:
            for doc_id, text in docs:
                key = (doc_id, text_sha(text))
                if key in self._docs or key in spans:
                    continue
                chunks = chunk_text(text, self.max_chars)
                if not chunks:
                    continue
                start = len(self.passages) + len(new)
                new.extend(Passage(doc_id, key[1], i, c) for i, c in enumerate(chunks))
                spans[key] = (start, start + len(chunks))
            if not new:
                return 0
            extra = [t for t in also if t]
            vecs = self.embedder.encode([p.text for p in new] + extra)[: len(new)]
            if self._index is None:
                import faiss

                self._index = faiss.IndexFlatIP(vecs.shape[1])
            self._index.add(vecs)
            self.passages.extend(new)
            self._docs.update(spans)
            return len(new)

    def search(self, query: str, k: int, allowed: Mapping[tuple[str, str], int] | None = None) -> list[Hit]:
        """The `k` best documents for `query` (each by its best passage), among the `allowed` `(doc_id,
        sha)` keys when given (mapped to their rank for breaking score ties; index order otherwise)."""
        if k <= 0 or not self.passages or not query:
            return []
        vec = self.embedder.encode([query])
        n = len(self.passages)
        width = min(n, max(16 * k, 256))
        while True:
            with self._lock:
                scores, rows = self._index.search(vec, width)
            best: dict[tuple[str, str], tuple[float, int]] = {}
            for score, row in zip(scores[0].tolist(), rows[0].tolist()):
                if row < 0:
                    continue
                p = self.passages[row]
                key = (p.doc_id, p.doc_sha)
                if allowed is not None and key not in allowed:
                    continue
                s = round(float(score), 6)
                if key not in best or (s, -row) > (best[key][0], -best[key][1]):
                    best[key] = (s, row)
            if len(best) >= k or width >= n:
                break
            width = n
        def tie(item):
            key, (score, row) = item
            return (-score, allowed[key] if allowed is not None else row, row)

        ranked = sorted(best.items(), key=tie)[:k]
        return [Hit(self.passages[row], score) for _, (score, row) in ranked]
