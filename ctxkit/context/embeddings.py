"""Embeddings for retrieval and summaries: a cached, counted text embedder and a faiss passage index.

`TextEmbedder` turns texts into L2-normalized float32 vectors with a sentence-transformers model
(all-MiniLM-L6-v2 by default, via `ctxkit.context.models.load_embedder`), through the content-hash cache of
`ctxkit.context.embedding_cache`, and counts what it encodes; `encode_texts` computes each vector independently
of its batch, so results are the same with a cold cache, a warm one, or none.
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
from ctxkit.context.embedding_cache import count_encode, vector_cache, vector_key
from ctxkit.context.models import embedder_id, load_embedder
from ctxkit.context.encode_threads import encode_threads, torch_threads
from ctxkit.context.static_embedder import is_static_spec, load_static_embedder, static_embedder_id


def text_sha(text: str) -> str:
    """sha256 hex of a text (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


ENCODE_BATCH = 32
"""Most texts per model call in `encode_texts`."""
LENGTH_BUCKET = 32
"""Texts are padded to a multiple of this many tokens (at most the model's `max_seq_length`)."""
def encode_texts(model: Any, texts: Sequence[str]):
    """A `(len(texts), dim)` float32 array of unit vectors for `texts`, in as few model calls as the
    length buckets allow.

    For a sentence-transformers model each vector is a pure function of the model and its own text: every
    text is padded to its own length rounded up to `LENGTH_BUCKET` tokens, texts of one bucket run
    together (up to `ENCODE_BATCH` per call), and with that fixed width a row's bytes do not depend on how
    many other rows share the call (checked in tests). Plain `encode` pads to the longest text of a batch,
    which changes the last bits of a vector with its batch mates. Any other object with a
    sentence-transformers style `encode(texts, ...)` is called once, as it is. The model runs with
    `encode_threads()` torch threads (restored after the call).
    """
    import numpy as np  # lazy: numpy loads on first use

    texts = list(texts)
    tokenizer = getattr(model, "tokenizer", None)
    limit = getattr(model, "max_seq_length", None)
    if tokenizer is None or not isinstance(limit, int) or not callable(getattr(model, "forward", None)):
        vecs = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)
    import torch  # lazy: torch loads on first use

    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=limit)["input_ids"]]
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(min(limit, -(-n // LENGTH_BUCKET) * LENGTH_BUCKET), []).append(i)
    out: list[Any] = [None] * len(texts)
    device = getattr(model, "device", "cpu")
    with torch.inference_mode(), torch_threads(torch, encode_threads()):
        for width, rows in sorted(groups.items()):
            for s in range(0, len(rows), ENCODE_BATCH):
                chunk = rows[s:s + ENCODE_BATCH]
                features = tokenizer([texts[i] for i in chunk], truncation=True, max_length=width,
                                     padding="max_length", return_tensors="pt")
                features = {k: v.to(device) for k, v in features.items()}
                emb = model.forward(features)["sentence_embedding"]
                emb = torch.nn.functional.normalize(emb.float(), p=2, dim=1).cpu().numpy()
                for j, i in enumerate(chunk):
                    out[i] = emb[j].copy()
    return np.stack(out).astype(np.float32, copy=False)


class TextEmbedder:
    """Sentence embeddings, L2-normalized float32, cached by content hash and counted.

    By default the model at `model_path` (all-MiniLM-L6-v2 when None; `static` or `static:<folder>`: the
    static embedder of `ctxkit.context.static_embedder`) is loaded lazily on first use and
    shared (`ctxkit.context.models.load_embedder`: once per process), and vectors go through the process-wide
    `ctxkit.context.embedding_cache` keyed by sha256(model id + text), on disk too when a cache folder is set
    (`set_cache_dir`, as a run does), so a text is embedded once per model per run whoever asks; a warm
    cache never loads the model. Misses are encoded in one batched `encode_texts` call. `model` may instead
    be any object with a sentence-transformers style `encode(texts, ...)`; its vectors are cached on this
    instance only.
    """

    def __init__(self, model_path: str | os.PathLike | None = None, device: str = "cpu", model: Any = None):
        self.model_path = model_path
        self.device = str(device)
        self._model = model
        self._private: OrderedDict[bytes, Any] | None = OrderedDict() if model is not None else None
        self._id: str | None = None
        self.calls = 0
        """Number of `encode` calls that reached the model."""
        self.texts_encoded = 0
        """Number of texts sent to the model (cache misses)."""

    @property
    def id(self) -> str:
        """`<model name>@sha256:<16 hex>` of the embedding model's weights."""
        if self._id is None:
            static = is_static_spec(self.model_path)
            self._id = static_embedder_id(self.model_path) if static else embedder_id(self.model_path)
        return self._id

    @property
    def model(self) -> Any:
        """The underlying model (loaded on first access)."""
        if self._model is None:
            if is_static_spec(self.model_path):
                self._model = load_static_embedder(self.model_path, device=self.device)
            else:
                self._model = load_embedder(self.model_path, device=self.device)
        return self._model

    def encode(self, texts: Sequence[str]):
        """A `(len(texts), dim)` float32 array of unit vectors (`(0, 0)` for no texts); only texts not
        cached reach the model, in one batched call."""
        import numpy as np  # lazy: numpy loads on first use


        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        mid = self.id
        keys = [vector_key(mid, t) for t in texts]
        shared = vector_cache(mid) if self._private is None else None
        if shared is not None:
            found = shared.get_many(keys)
        else:
            found = {k: self._private[k] for k in keys if k in self._private}
        missing: dict[bytes, str] = {}
        for k, t in zip(keys, texts):
            if k not in found:
                missing.setdefault(k, t)
        if missing:
            vecs = encode_texts(self.model, list(missing.values()))
            if vecs.ndim != 2 or vecs.shape[0] != len(missing):
                raise ConfigError(f"embedder {mid}: encode returned shape {vecs.shape} for {len(missing)} texts")
            self.calls += 1
            self.texts_encoded += len(missing)
            count_encode(len(missing))
            new = dict(zip(missing, vecs))
            found.update(new)
            if shared is not None:
                shared.put_many(new)
            else:
                self._private.update(new)
                while len(self._private) > VECTOR_CACHE_SIZE:
                    self._private.popitem(last=False)
        return np.ascontiguousarray(np.stack([found[k] for k in keys]))


VECTOR_CACHE_SIZE = 50_000
"""Most vectors kept by an embedder built around a given `model` object (the oldest dropped first)."""


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
                import faiss  # lazy: faiss loads on first use

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
