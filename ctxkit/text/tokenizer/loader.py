"""Tokenizers: one `Tokenizer` face over Hugging Face tokenizers and tiktoken encodings.

`load_tokenizer(spec)` accepts a local Hugging Face tokenizer folder, a hub id (loaded from the local
cache when offline), `tiktoken:<encoding>` (the `.tiktoken` rank file is found offline, see
`tiktoken_search_dirs`) or `tiktoken:/path/to/file.tiktoken`. Loaded tokenizers are cached per spec.

A folder is read with the `tokenizers` library alone (`hf_files.read_tokenizer_folder`: no
`transformers` import, a fraction of a second); hub ids and folder layouts it does not understand load
through `transformers`' `AutoTokenizer`. Either way `Tokenizer.hf` gives the `transformers` tokenizer,
loaded on first use, for comparisons with `apply_chat_template` and for models.

Encoding follows the chat-template convention: special-token text is parsed as special tokens and no
BOS/EOS is ever added (`add_special_tokens=False`), which is how `apply_chat_template` tokenizes.

Both backends split text at added/special tokens first and encode each piece independently, so
`encode_segmented` encodes piece by piece with a cache keyed by the piece text and whether it starts
the text (Metaspace tokenizers prepend a word marker only there). It gives the same ids as `encode`
(tests check this on every shared tokenizer) and makes re-tokenizing a growing conversation O(new).
Ids alone (`encode`, `count`, `encode_segmented`) are computed without character offsets; token starts
(`encode_with_offsets`) come from the library's offsets, or, for a byte-level BPE on ASCII text, from the
token lengths (`hf_files.ascii_starts_function`, proven equal at load and checked per piece).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ctxkit.errors import TokenizerError
from ctxkit.text.tokenizer.hf_files import backend_functions, folder_digest, read_tokenizer_folder
from ctxkit.text.tokenizer.tiktoken_files import (  # re-exported: their historical home
    CHATML_TIKTOKEN_SPECIALS, SHARED_ENV, TIKTOKEN_ENV, read_tiktoken, shared_dir, tiktoken_search_dirs,
)

__all__ = ["CHATML_TIKTOKEN_SPECIALS", "SHARED_ENV", "TIKTOKEN_ENV", "Tokenizer", "load_tokenizer", "shared_dir",
           "tiktoken_search_dirs"]


class _LRU:
    """A bounded mapping with least-recently-used eviction (thread-safe): at most `maxsize` entries and,
    when keys are `(text, ...)` tuples, at most `maxchars` characters of key text."""

    def __init__(self, maxsize: int, maxchars: int = 32_000_000):
        self.maxsize = maxsize
        self.maxchars = maxchars
        self._chars = 0
        self._data: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _weight(key: Any) -> int:
        return len(key[0]) if isinstance(key, tuple) and key and isinstance(key[0], str) else 0

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            if key not in self._data:
                self._chars += self._weight(key)
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize or (self._chars > self.maxchars and len(self._data) > 1):
                old, _ = self._data.popitem(last=False)
                self._chars -= self._weight(old)

    def __len__(self) -> int:
        return len(self._data)


class Tokenizer:
    """A loaded tokenizer: encode/decode/count with the chat-template conventions.

    Attributes: `spec` (what was asked for), `id` (`<name>@sha256:<16 hex>` over the vocabulary files),
    `kind` (`"hf"` or `"tiktoken"`), `backend` (the `tokenizers.Tokenizer`, None for tiktoken), `hf` (the
    transformers tokenizer, loaded on first use; None for tiktoken), `encoding` (the tiktoken Encoding,
    None for HF), `chat_template`, `bos_token`, `eos_token`, `special_tokens` (added/special token text -> id).
    """

    def __init__(
        self,
        *,
        spec: str,
        id: str,
        kind: str,
        encode_full: Callable[[str], list[int]],
        encode_piece: Callable[[str, bool], tuple[list[int], list[int]]],
        encode_piece_ids: Callable[[str, bool], list[int]] | None = None,
        piece_starts: Callable[[str, Sequence[int]], list[int] | None] | None = None,
        decode: Callable[[Sequence[int], bool], str],
        special_tokens: Mapping[str, int],
        segmentable: bool,
        hf: Any = None,
        hf_loader: Callable[[], Any] | None = None,
        backend: Any = None,
        special_tokens_map: Mapping[str, str] | None = None,
        encoding: Any = None,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ):
        self.spec = spec
        self.id = id
        self.kind = kind
        self._hf = hf
        self._hf_loader = hf_loader
        self._hf_lock = threading.Lock()
        self.backend = backend
        self._special_tokens_map = None if special_tokens_map is None else dict(special_tokens_map)
        self.encoding = encoding
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.special_tokens: Mapping[str, int] = dict(special_tokens)
        self.segmentable = segmentable
        """True when added tokens split text exactly (no lstrip/rstrip/normalized/single_word flags), so
        `encode_segmented` is exact; otherwise it falls back to `encode`."""
        self._encode_full = encode_full
        self._encode_piece = encode_piece
        self._encode_piece_ids = encode_piece_ids or (lambda piece, at_start: encode_piece(piece, at_start)[0])
        self._piece_starts = piece_starts
        self._decode = decode
        self.clear_caches()
        texts = sorted(self.special_tokens, key=len, reverse=True)
        self._special_re = re.compile("|".join(re.escape(t) for t in texts)) if texts else None

    def __repr__(self) -> str:
        return f"Tokenizer({self.id!r}, kind={self.kind!r})"

    def clear_caches(self) -> None:
        """Forget every cached count and piece encoding (benchmarks start each pass cold with it)."""
        self._count_cache = _LRU(65536)  # content hash -> count
        self._recent_counts: dict[str, int] = {}  # text -> count, see count()
        self._piece_cache = _LRU(65536)  # (piece, at_start) -> (ids, starts or None)

    @property
    def hf(self) -> Any:
        """The `transformers` tokenizer (None for tiktoken), loaded on first use: `transformers` is imported
        only by code that asks for it (comparisons with `apply_chat_template`, models)."""
        if self._hf is None and self._hf_loader is not None:
            with self._hf_lock:
                if self._hf is None:
                    self._hf = self._hf_loader()
        return self._hf

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """Named special tokens (`bos_token`, `eos_token`, `pad_token`, ...) -> text, as `transformers`'
        `special_tokens_map` gives them: the variables a chat template sees beside `messages`."""
        if self._special_tokens_map is None:
            if self.hf is not None:
                self._special_tokens_map = {k: str(v) for k, v in self.hf.special_tokens_map.items()}
            else:
                named = {"bos_token": self.bos_token, "eos_token": self.eos_token}
                self._special_tokens_map = {k: v for k, v in named.items() if v}
        return dict(self._special_tokens_map)

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        if self.backend is not None:
            return int(self.backend.get_vocab_size(with_added_tokens=True))
        return int(self.encoding.n_vocab)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token text becomes special ids; no BOS/EOS added (computed without
        character offsets; not cached)."""
        if not isinstance(text, str):
            raise TokenizerError(f"{self.id}: encode() needs a str, got {type(text).__name__}")
        return self._encode_full(text)

    def encode_model_input(self, text: str) -> list[int]:
        """Ids of `text` as the tokenizer's own `tokenizer(text)` call gives them: its post-processor adds
        BOS/EOS where it does (for tiktoken, the same as `encode`). `encode` never adds them."""
        if self.backend is None:
            return self.encode(text)
        return self.backend.encode(text, add_special_tokens=True).ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Text of `ids` (special tokens kept unless `skip_special_tokens`)."""
        try:
            return self._decode(list(ids), skip_special_tokens)
        except Exception as exc:  # backend errors on out-of-range ids
            raise TokenizerError(f"{self.id}: cannot decode ids: {exc}") from exc

    def count(self, text: str) -> int:
        """Number of tokens `encode(text)` gives, cached by the text's content hash (and, for the texts
        counted most recently, by the string itself: its hash is kept by Python, so a text counted again at
        every compaction costs one dict lookup instead of hashing its bytes)."""
        recent = self._recent_counts
        n = recent.get(text)
        if n is not None:
            return n
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        n = self._count_cache.get(key)
        if n is None:
            n = len(self.encode_segmented(text))
            self._count_cache.put(key, n)
        if len(recent) >= 8192:
            recent.clear()
        recent[text] = n
        return n

    def split_special(self, text: str) -> list[tuple[str, bool]]:
        """`text` cut at special/added tokens: a list of `(piece, is_special)`, empty pieces dropped."""
        if self._special_re is None:
            return [(text, False)] if text else []
        out: list[tuple[str, bool]] = []
        pos = 0
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                out.append((text[pos : m.start()], False))
            out.append((m.group(), True))
            pos = m.end()
        if pos < len(text):
            out.append((text[pos:], False))
        return out

    def encode_piece(self, piece: str, at_start: bool) -> tuple[int, ...]:
        """Ids of one piece of text holding no special token; `at_start` says it begins the text.

        Cached by `(piece, at_start)`. Computes no character offsets: a piece first seen here is cached
        with its ids only (`encode_piece_offsets` completes the entry when it needs the starts)."""
        key = (piece, at_start)
        hit = self._piece_cache.get(key)
        if hit is None:
            hit = (tuple(self._encode_piece_ids(piece, at_start)), None)
            self._piece_cache.put(key, hit)
        return hit[0]

    def encode_piece_offsets(self, piece: str, at_start: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """`(ids, starts)` of one piece: its ids and the character offset (in the piece) where each starts.

        Cached by `(piece, at_start)`. Where the backend proves the starts from the ids (a byte-level BPE on
        an ASCII piece, `hf_files.ascii_starts_function`), they are the running sum of the tokens'
        lengths; otherwise they are the library's offsets."""
        key = (piece, at_start)
        hit = self._piece_cache.get(key)
        if hit is not None and hit[1] is not None:
            return hit
        starts = None
        if hit is not None and self._piece_starts is not None:  # ids cached without starts
            ids = hit[0]
            starts = self._piece_starts(piece, ids)
        if starts is None:
            ids, starts = self._encode_piece(piece, at_start)
            ids = tuple(ids)
        hit = (ids, tuple(starts))
        self._piece_cache.put(key, hit)
        return hit

    def encode_with_offsets(self, text: str, *, at_start: bool = True) -> tuple[list[int], list[int]]:
        """`(ids, starts)`: `encode_segmented(text)` plus each token's start offset (characters) in `text`."""
        if not self.segmentable:
            if not at_start:
                raise TokenizerError(f"{self.id}: tokenizer is not segmentable; cannot encode a continuation")
            return self._encode_piece(text, True)
        ids, starts, _ = self.encode_with_specials(text, at_start=at_start)
        return ids, starts

    def encode_with_specials(self, text: str, *, at_start: bool = True) -> tuple[list[int], list[int], list[int]]:
        """`(ids, starts, specials)`: `encode_with_offsets(text)` plus the positions in `ids` of the special
        tokens, in order (a segmentable tokenizer only: they are where `split_special` cut the text)."""
        if not self.segmentable:
            raise TokenizerError(f"{self.id}: tokenizer is not segmentable; its special tokens are not cut out")
        ids: list[int] = []
        starts: list[int] = []
        specials: list[int] = []
        first = at_start
        pos = 0
        for piece, special in self.split_special(text):
            if special:
                specials.append(len(ids))
                ids.append(self.special_tokens[piece])
                starts.append(pos)
            else:
                p_ids, p_starts = self.encode_piece_offsets(piece, first)
                ids.extend(p_ids)
                starts.extend(map(pos.__add__, p_starts) if pos else p_starts)
            pos += len(piece)
            first = False
        return ids, starts, specials

    def encode_segmented(self, text: str, *, at_start: bool = True) -> list[int]:
        """Same ids as `encode(text)`, computed piece by piece with a cache (exact for segmentable tokenizers).

        `at_start=False` encodes `text` as the continuation of a longer text whose previous part ended at
        a special-token boundary."""
        if not self.segmentable:
            if not at_start:
                raise TokenizerError(f"{self.id}: tokenizer is not segmentable; cannot encode a continuation")
            return self.encode(text)
        ids: list[int] = []
        first = at_start
        for piece, special in self.split_special(text):
            if special:
                ids.append(self.special_tokens[piece])
            else:
                ids.extend(self.encode_piece(piece, first))
            first = False
        return ids


_CACHE: dict[str, Tokenizer] = {}
_CACHE_LOCK = threading.Lock()


def load_tokenizer(spec: str | os.PathLike | Tokenizer) -> Tokenizer:
    """Load a tokenizer: folder | hub id | `tiktoken:<encoding>` | `tiktoken:<path.tiktoken>` (cached per spec)."""
    if isinstance(spec, Tokenizer):
        return spec
    if not isinstance(spec, (str, os.PathLike)) or not str(spec):
        raise TokenizerError(f"tokenizer spec must be a non-empty string or path, got {spec!r}")
    key = str(spec)
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
    if cached is not None:
        return cached
    if key.startswith("tiktoken:"):
        tok = _load_tiktoken(key)
    else:
        tok = _load_hf(key)
    with _CACHE_LOCK:
        _CACHE.setdefault(key, tok)
        return _CACHE[key]


# --------------------------------------------------------------------------------------------- HF


def _load_hf(spec: str) -> Tokenizer:
    path = Path(spec).expanduser()
    looks_like_path = path.is_absolute() or spec.startswith((".", "~")) or os.sep in spec.strip("/").split("/", 1)[-1]
    if path.exists() and not path.is_dir():
        raise TokenizerError(f"tokenizer spec {spec!r} is a file; expected a tokenizer folder, a hub id or 'tiktoken:...'")
    if path.is_dir():
        digest = folder_digest(path)
        name = path.name
    elif looks_like_path or spec.count("/") > 1:
        raise TokenizerError(f"tokenizer folder {spec!r} does not exist")
    else:
        digest = None
        name = spec.rsplit("/", 1)[-1]
    source = str(path) if path.is_dir() else spec
    folder = read_tokenizer_folder(path) if path.is_dir() else None
    if folder is not None:
        hf, backend, named = None, folder.backend, folder.special_tokens_map
        template, bos, eos = folder.chat_template, folder.bos_token, folder.eos_token
    else:
        hf = _auto_tokenizer(spec, source)
        backend, named = hf.backend_tokenizer, None
        template, bos, eos = getattr(hf, "chat_template", None), hf.bos_token, hf.eos_token
        if isinstance(template, dict):  # several named templates: the default one
            template = template.get("default")
    if digest is None:
        digest = hashlib.sha256(backend.to_str().encode()).hexdigest()
    codec = backend_functions(backend, spec)
    return Tokenizer(
        spec=spec,
        id=f"{name}@sha256:{digest[:16]}",
        kind="hf",
        encode_full=codec.encode_full,
        encode_piece=codec.encode_piece,
        encode_piece_ids=codec.encode_piece_ids,
        piece_starts=codec.piece_starts,
        decode=codec.decode,
        special_tokens=codec.special,
        segmentable=codec.segmentable,
        hf=hf,
        hf_loader=lambda: _auto_tokenizer(spec, source),
        backend=backend,
        special_tokens_map=named,
        chat_template=template,
        bos_token=bos,
        eos_token=eos,
    )


def _auto_tokenizer(spec: str, source: str) -> Any:
    """`transformers`' fast tokenizer for `source` (a folder or hub id); errors are `TokenizerError`s."""
    try:
        from transformers import AutoTokenizer  # lazy: transformers loads on first use

        hf = AutoTokenizer.from_pretrained(source)
    except Exception as exc:
        raise TokenizerError(f"cannot load Hugging Face tokenizer {spec!r}: {type(exc).__name__}: {exc}") from exc
    if getattr(hf, "backend_tokenizer", None) is None:
        raise TokenizerError(f"{spec!r}: only fast (tokenizers-backed) Hugging Face tokenizers are supported")
    return hf


def _load_tiktoken(spec: str) -> Tokenizer:
    c = read_tiktoken(spec)
    return Tokenizer(
        spec=spec, id=c.id, kind="tiktoken", encode_full=c.encode_full, encode_piece=c.encode_piece,
        encode_piece_ids=c.encode_piece_ids, decode=c.decode, special_tokens=c.special, segmentable=True,
        encoding=c.encoding, chat_template=None, bos_token=None, eos_token=c.eos_token,
    )
