"""Read a Hugging Face tokenizer folder with the `tokenizers` library alone, no `transformers`.

`read_tokenizer_folder(path)` builds the `tokenizers.Tokenizer` backend that `transformers`' fast
tokenizer would wrap, and reads what `load_tokenizer` needs beside it (bos/eos text, the chat template)
from `tokenizer_config.json`, `special_tokens_map.json` and `chat_template.jinja`. Loading a tokenizer
this way takes a fraction of a second instead of the seconds `transformers` needs to import.

Two folder layouts are understood:

- `tokenizer.json`: loaded as it is (the serialized backend, added tokens included);
- `vocab.json` + `merges.txt` of a Qwen2 tokenizer (`tokenizer_class` `Qwen2Tokenizer`): the byte-level
  BPE that `transformers`' `Qwen2Tokenizer` builds (NFC, Qwen's split regex, byte-level pre-tokenizer and
  decoder), with the added tokens of `tokenizer_config.json`'s `added_tokens_decoder` at their ids.

Anything else (a SentencePiece `tokenizer.model` only, another vocab/merges family, a config that asks
for `split_special_tokens`, `add_prefix_space` on a `tokenizer.json`, a special token the backend does not
hold as an added token, added-token ids that do not come out as declared) returns None: the caller then
loads through `transformers`, whose result is the reference. Tests compare the backends built here with
`transformers`' on every shared tokenizer, component by component.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ctxkit.errors import TokenizerError

QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Qwen2's pre-tokenizer split pattern (as `transformers`' `Qwen2Tokenizer` sets it)."""

QWEN2_CLASSES = ("Qwen2Tokenizer", "Qwen2TokenizerFast")
"""`tokenizer_class` values whose `vocab.json` + `merges.txt` are built into a Qwen2 byte-level BPE."""

HF_VOCAB_FILES = (
    "tokenizer.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)
"""Files of a Hugging Face tokenizer folder whose bytes make up its id (the chat template is hashed
separately, by `text/template/chat_template.py`)."""

SPECIAL_TOKEN_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""Named special tokens, in the order `transformers`' `special_tokens_map` lists them."""
_LLAMA = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
_QWEN2 = {"eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
CLASS_SPECIAL_DEFAULTS: dict[str | None, dict[str, str]] = {
    None: {}, "TokenizersBackend": {}, "PreTrainedTokenizerFast": {},
    "LlamaTokenizer": _LLAMA, "LlamaTokenizerFast": _LLAMA, "Qwen2Tokenizer": _QWEN2, "Qwen2TokenizerFast": _QWEN2,
}
"""`tokenizer_class` values read here, with the named special tokens their `transformers` class defaults to
(a folder's `tokenizer_config.json` overrides them, an explicit null included); other classes load
through `transformers`."""
CHAT_TEMPLATE_FILE = "chat_template.jinja"
"""A folder's own chat template file; it takes priority over `tokenizer_config.json`'s `chat_template`."""
CHAT_TEMPLATE_DIR = "additional_chat_templates"
"""Folder of named extra templates (`<name>.jinja`) beside the default one."""


@dataclass(frozen=True, eq=False)
class TokenizerFiles:
    """A Hugging Face tokenizer folder read without `transformers`.

    `backend` is the `tokenizers.Tokenizer` (added tokens included), `special_tokens_map` the named
    special tokens as `transformers`' `special_tokens_map` gives them (the variables a chat template
    sees), `bos_token`/`eos_token` their text (None when unset), `chat_template` the default template
    text (None when none)."""

    path: Path
    backend: Any
    special_tokens_map: dict[str, str]
    chat_template: str | None

    @property
    def bos_token(self) -> str | None:
        """The BOS token text, None when unset."""
        return self.special_tokens_map.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        """The EOS token text, None when unset."""
        return self.special_tokens_map.get("eos_token")


def hash_files(paths: Iterable[Path]) -> str:
    """sha256 hex over `(name, bytes)` of each file in order: the digest in tokenizer ids (logs record it)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()


def folder_digest(path: Path) -> str:
    """`hash_files` over the folder's `HF_VOCAB_FILES` that exist; a folder with no vocabulary file
    (tokenizer.json, vocab.json or tokenizer.model) is a `TokenizerError` listing what it holds."""
    files = [path / n for n in HF_VOCAB_FILES if (path / n).is_file()]
    if not any(f.name in ("tokenizer.json", "vocab.json", "tokenizer.model") for f in files):
        found = sorted(p.name for p in path.iterdir())
        raise TokenizerError(
            f"{path}: not a tokenizer folder (no tokenizer.json, vocab.json or tokenizer.model); found {found}"
        )
    return hash_files(files)


def read_json(path: Path) -> dict:
    """A JSON object file, `{}` when it does not exist; a malformed one is a `TokenizerError` naming it."""
    if not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot read tokenizer file: {exc}") from exc
    if not isinstance(obj, dict):
        raise TokenizerError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def token_text(value: Any) -> str | None:
    """The text of a configured special token: a string, or a serialized AddedToken's `content`."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def chat_template_of(path: Path, config: dict) -> str | None:
    """The default chat template of a folder, chosen as `transformers` chooses it: `chat_template.jinja`
    (and named ones under `additional_chat_templates/`) over `tokenizer_config.json`'s `chat_template`
    (a string, or a list of `{name, template}`); of several named templates, the one named `default`."""
    templates: dict[str, str] = {}
    if (path / CHAT_TEMPLATE_FILE).is_file():
        templates["default"] = (path / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    extra = path / CHAT_TEMPLATE_DIR
    if extra.is_dir():
        for f in sorted(extra.glob("*.jinja")):
            templates[f.stem] = f.read_text(encoding="utf-8")
    if not templates:
        value = config.get("chat_template")
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            templates = {t["name"]: t["template"] for t in value if isinstance(t, dict) and "name" in t}
    return templates.get("default")


def named_special_tokens(config: dict, special_map: dict, defaults: dict[str, str], padding: Any) -> dict[str, str]:
    """The named special tokens: the class `defaults`, the pad token of the backend's `padding` where the
    class has none, then `tokenizer_config.json` (or `special_tokens_map.json` for keys the config lacks),
    an explicit null unsetting one; in `SPECIAL_TOKEN_ATTRIBUTES` order."""
    values: dict[str, Any] = dict(defaults)
    if isinstance(padding, dict) and padding.get("pad_token"):
        values.setdefault("pad_token", padding["pad_token"])
    for key in SPECIAL_TOKEN_ATTRIBUTES:
        if key in config:
            values[key] = config[key]
        elif key in special_map:
            values[key] = special_map[key]
    return {k: t for k in SPECIAL_TOKEN_ATTRIBUTES if (t := token_text(values.get(k)))}


def configured_special_tokens(config: dict, special_map: dict) -> list[str]:
    """Every special token text a folder names (bos/eos/unk/pad/..., additional and extra ones)."""
    out: list[str] = list(named_special_tokens(config, special_map, {}, None).values())
    for key in ("additional_special_tokens", "extra_special_tokens"):
        value = config.get(key, special_map.get(key))
        items = value.keys() if isinstance(value, dict) else value if isinstance(value, list) else []
        out.extend(t for t in (token_text(v) for v in items) if t)
    return out


def _qwen2_backend(path: Path, config: dict) -> Any:
    """The byte-level BPE `transformers`' `Qwen2Tokenizer` builds from `vocab.json` + `merges.txt`."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers  # lazy: tokenizers loads on first use
    from tokenizers import Tokenizer as Backend  # lazy: tokenizers loads on first use
    from tokenizers.models import BPE  # lazy: tokenizers loads on first use

    try:
        model = BPE.from_file(str(path / "vocab.json"), str(path / "merges.txt"), dropout=None, unk_token=None,
                              continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    except Exception as exc:  # the Rust reader's own errors
        raise TokenizerError(f"{path}: cannot read vocab.json/merges.txt: {exc}") from exc
    backend = Backend(model)
    backend.decoder = decoders.ByteLevel()
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space") or False), use_regex=False),
    ])
    declared = config.get("added_tokens_decoder") or {}
    tokens: list[tuple[int, Any]] = []
    for key, spec in declared.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("content"), str):
            raise TokenizerError(f"{path / 'tokenizer_config.json'}: added_tokens_decoder[{key!r}] has no 'content'")
        tokens.append((int(key), AddedToken(
            spec["content"], single_word=bool(spec.get("single_word", False)), lstrip=bool(spec.get("lstrip", False)),
            rstrip=bool(spec.get("rstrip", False)), normalized=bool(spec.get("normalized", False)),
            special=bool(spec.get("special", False)),
        )))
    tokens.sort(key=lambda t: t[0])
    backend.add_tokens([t for _, t in tokens])
    if any(backend.token_to_id(t.content) != i for i, t in tokens):
        return None  # ids not contiguous after the vocabulary: leave it to transformers
    return backend


def read_tokenizer_folder(path: str | Path) -> TokenizerFiles | None:
    """Read a tokenizer folder without `transformers`; None when its layout needs `transformers` (see module)."""
    path = Path(path)
    config = read_json(path / "tokenizer_config.json")
    special_map = read_json(path / "special_tokens_map.json")
    cls = config.get("tokenizer_class")
    if config.get("split_special_tokens") or config.get("fix_mistral_regex") or cls not in CLASS_SPECIAL_DEFAULTS:
        return None
    if isinstance(config.get("extra_special_tokens"), dict):  # named extra tokens: transformers' own handling
        return None
    if (path / "tokenizer.json").is_file():
        if config.get("add_prefix_space") is not None:
            return None
        from tokenizers import Tokenizer as Backend  # lazy: tokenizers loads on first use

        try:
            backend = Backend.from_file(str(path / "tokenizer.json"))
        except Exception as exc:  # the Rust parser's own errors
            raise TokenizerError(f"{path / 'tokenizer.json'}: cannot read tokenizer: {exc}") from exc
    elif (path / "vocab.json").is_file() and (path / "merges.txt").is_file() and cls in QWEN2_CLASSES:
        if config.get("add_bos_token") or config.get("add_eos_token"):
            return None  # transformers' post-processor would add them: its own handling
        backend = _qwen2_backend(path, config)
        if backend is None:
            return None
    else:
        return None
    added = {t.content for t in backend.get_added_tokens_decoder().values()}
    named = named_special_tokens(config, special_map, CLASS_SPECIAL_DEFAULTS[cls], backend.padding)
    listed = configured_special_tokens(config, special_map) + list(read_json(path / "added_tokens.json"))
    if any(t not in added for t in [*named.values(), *listed]):
        return None  # transformers would add it as a new special token
    return TokenizerFiles(path=path, backend=backend, special_tokens_map=named, chat_template=chat_template_of(path, config))


def byte_level_chars() -> frozenset[str]:
    """The 256 characters of GPT-2's byte-to-unicode table: a byte-level BPE vocabulary spells every byte
    as one of them (printable bytes as themselves, the rest shifted to U+0100 and up)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), ord("\u00ff") + 1)]
    shifted = [b for b in range(256) if b not in keep]
    return frozenset(chr(b) for b in keep) | frozenset(chr(256 + n) for n in range(len(shifted)))


BYTE_LEVEL_CHARS = byte_level_chars()
"""GPT-2's byte-to-unicode alphabet (256 one-code-point characters)."""
NOT_ONE_BYTE_PER_CHAR = 1 << 62
"""The length `TokenLengths` gives an id whose string is not spelled in `BYTE_LEVEL_CHARS` (an added token):
far above any text's length, so a piece holding it fails the sum check and takes the offsets path."""
ASCII_PROBES = (
    "hello world", "  two  spaces ", "\n\n\t tabs\tand\r\nnewlines  \n", "it's we'll they'd I'M", "x=1+2; y = f(a, b)[0]",
    "def f():\n    return {'a': [1, 2]}\n", "0123456789 12345 3.14159", "~!@#$%^&*()_+`-={}|[]\\:\";'<>?,./",
    "\x00\x01\x1f\x7f ctrl", "ALLCAPS camelCase snake_case kebab-case", " ", "\n", "a", "   trailing   ",
    "https://example.com/path?q=1&r=2#frag", "<not special> <x/> [y] {z}", "\r\r\n \n\n\n\n x",
)
"""Varied ASCII texts on which `ascii_starts_function`'s running sum must equal the Rust offsets at load."""


class TokenLengths(dict):
    """id -> character length of its vocabulary string, filled on first sight of an id (reading the whole
    vocabulary up front costs 0.1 s for a 150k vocabulary). An id whose string is not all byte-level
    characters (an added token) gets `NOT_ONE_BYTE_PER_CHAR`."""

    def __init__(self, backend: Any):
        super().__init__()
        self._backend = backend
        self._added = frozenset(int(i) for i in backend.get_added_tokens_decoder())

    def __missing__(self, token_id: int) -> int:
        text = None if token_id in self._added else self._backend.id_to_token(token_id)
        n = len(text) if text and BYTE_LEVEL_CHARS.issuperset(text) else NOT_ONE_BYTE_PER_CHAR
        self[token_id] = n
        return n


def component_state(component: Any) -> dict | None:
    """The JSON state of a backend component (normalizer, pre-tokenizer, ...), None when unset."""
    return None if component is None else json.loads(component.__getstate__())


def byte_level_layout(backend: Any) -> bool:
    """True when `backend` is a GPT-2-style byte-level BPE whose Rust offsets on ASCII text are the token
    strings' lengths laid end to end: a BPE model without byte fallback or affixes, no normalizer or NFC
    (the identity on ASCII), a ByteLevel pre-tokenizer without an added prefix space (alone or behind
    regex splits), a ByteLevel decoder, and no post-processor that trims offsets."""
    model = backend.model
    if type(model).__name__ != "BPE" or model.byte_fallback or model.dropout:
        return False
    if (model.continuing_subword_prefix or "") or (model.end_of_word_suffix or ""):
        return False
    norm = component_state(backend.normalizer)
    if norm is not None and norm.get("type") != "NFC":
        return False
    pre = component_state(backend.pre_tokenizer)
    steps = (pre.get("pretokenizers") or []) if pre and pre.get("type") == "Sequence" else [pre]
    if not steps or any(s is None or s.get("type") not in ("Split", "ByteLevel") for s in steps):
        return False
    levels = [s for s in steps if s["type"] == "ByteLevel"]
    if len(levels) != 1 or levels[0].get("add_prefix_space"):
        return False
    post = component_state(backend.post_processor)
    if post is not None and post.get("type") != "TemplateProcessing" and not (
        post.get("type") == "ByteLevel" and not post.get("trim_offsets")
    ):
        return False
    dec = component_state(backend.decoder)
    return dec is not None and dec.get("type") == "ByteLevel"


def ascii_starts_function(
    backend: Any, library_offsets: Callable[[str, bool], tuple[list[int], list[int]]],
    encode_piece_ids: Callable[[str, bool], list[int]],
) -> Callable[[str, Sequence[int]], list[int] | None] | None:
    """`starts(piece, ids)` for a byte-level BPE (`byte_level_layout`), None for any other backend.

    On an ASCII piece each token's characters are its bytes, so its length is its vocabulary string's and
    the starts are the running sum of those lengths; `starts` returns None (take the offsets path) for a
    non-ASCII piece or when the lengths do not add up to the piece's. Enabled only when, on `ASCII_PROBES`
    at and behind the start, the ids and starts equal `library_offsets`' (the Rust offsets) exactly."""
    if not byte_level_layout(backend):
        return None
    lengths = TokenLengths(backend)
    length_of = lengths.__getitem__

    def starts(piece: str, ids: Sequence[int]) -> list[int] | None:
        if not piece.isascii():
            return None
        out = list(accumulate(map(length_of, ids), initial=0))
        if out.pop() != len(piece):
            return None
        return out

    try:
        for text in ASCII_PROBES:
            for at_start in (True, False):
                ids, rust = library_offsets(text, at_start)
                fast_ids = encode_piece_ids(text, at_start)
                if list(fast_ids) != list(ids) or starts(text, fast_ids) != list(rust):
                    return None
    except TokenizerError:  # a backend that does not parse its special tokens: no continuation anchor
        return None
    return starts


@dataclass(frozen=True, eq=False)
class BackendCodec:
    """How ctxkit encodes with a `tokenizers` backend under the chat-template conventions (special-token
    text parsed as special, no BOS/EOS added); built by `backend_functions`.

    `encode_full(text)` gives ids; `library_offsets(piece, at_start)` gives `(ids, starts)` of a piece
    holding no added token, starts from the library's (Rust) offsets: the reference; `encode_piece` the
    same pair, the starts computed from the ids where `piece_starts` proves them; `encode_piece_ids` the
    ids alone, no offsets computed; `piece_starts(piece, ids)` the starts from the ids where provably equal
    to the library's (`ascii_starts_function`), else None; the field is None for a tokenizer where that is
    never proven."""

    special: dict[str, int]
    segmentable: bool
    encode_full: Callable[[str], list[int]]
    library_offsets: Callable[[str, bool], tuple[list[int], list[int]]]
    encode_piece: Callable[[str, bool], tuple[list[int], list[int]]]
    encode_piece_ids: Callable[[str, bool], list[int]]
    piece_starts: Callable[[str, Sequence[int]], list[int] | None] | None
    decode: Callable[[Sequence[int], bool], str]


def backend_functions(backend: Any, spec: str) -> BackendCodec:
    """The `BackendCodec` of a `tokenizers` backend.

    `segmentable` is True when no added token has lstrip/rstrip/single_word/normalized set (cutting text
    at added tokens is then exact); `encode_piece(piece, at_start)` encodes a piece behind a special
    token as a continuation when `at_start` is False (Metaspace `prepend_scheme="first"` prepends only at
    the start of a text). Ids come from `encode_batch_fast` (no offsets computed) where the installed
    `tokenizers` has it; they equal `encode`'s."""
    added = backend.get_added_tokens_decoder()
    special = {tok.content: int(i) for i, tok in added.items()}
    segmentable = all(not (t.lstrip or t.rstrip or t.single_word or t.normalized) for t in added.values())
    anchor = min(special, key=lambda t: special[t]) if special else None
    fast = getattr(backend, "encode_batch_fast", None)

    if fast is not None:
        def ids_of(text: str) -> list[int]:
            return fast([text], add_special_tokens=False)[0].ids
    else:  # tokenizers < 0.21
        def ids_of(text: str) -> list[int]:
            return backend.encode(text, add_special_tokens=False).ids

    def checked_tail(ids: list[int]) -> list[int]:
        if not ids or ids[0] != special[anchor]:
            raise TokenizerError(f"{spec!r}: special token {anchor!r} did not encode to its own id")
        return ids[1:]

    def library_offsets(piece: str, at_start: bool) -> tuple[list[int], list[int]]:
        if at_start or anchor is None:
            enc = backend.encode(piece, add_special_tokens=False)
            return enc.ids, [s for s, _ in enc.offsets]
        # Behind a special token the piece does not start the text: encode it after the anchor token and
        # drop the anchor's own id.
        enc = backend.encode(anchor + piece, add_special_tokens=False)
        ids = checked_tail(enc.ids)
        shift = len(anchor)
        return ids, [max(0, s - shift) for s, _ in enc.offsets[1:]]

    def encode_piece_ids(piece: str, at_start: bool) -> list[int]:
        if at_start or anchor is None:
            return ids_of(piece)
        return checked_tail(ids_of(anchor + piece))

    def decode(ids: Sequence[int], skip: bool) -> str:
        return backend.decode(ids, skip_special_tokens=skip)

    piece_starts = ascii_starts_function(backend, library_offsets, encode_piece_ids)
    encode_piece = library_offsets
    if piece_starts is not None:
        def encode_piece(piece: str, at_start: bool) -> tuple[list[int], list[int]]:
            if piece.isascii():
                ids = encode_piece_ids(piece, at_start)
                starts = piece_starts(piece, ids)
                if starts is not None:
                    return ids, starts
            return library_offsets(piece, at_start)

    return BackendCodec(
        special=special, segmentable=segmentable, encode_full=ids_of, library_offsets=library_offsets,
        encode_piece=encode_piece, encode_piece_ids=encode_piece_ids, piece_starts=piece_starts, decode=decode,
    )
