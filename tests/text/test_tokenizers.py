"""Tokenizer loading, exact encoding conventions, segment-wise encoding and typed errors."""

from __future__ import annotations

import random

import pytest

from conftest import HF_TOKENIZERS, require_module, shared_path, tokenizer_dir
from ctxkit.errors import TokenizerError
from ctxkit.text.tokenizer.loader import CHATML_TIKTOKEN_SPECIALS, Tokenizer, load_tokenizer

SAMPLES = [
    "",
    "hello world",
    " leading space and trailing space ",
    "<|im_start|>user\nhé llo, wörld! 你好 🎉<|im_end|>\n<|im_start|>assistant\n",
    "[INST] do it [/INST] done</s>[TOOL_CALLS] [{\"name\": \"f\"}]</s>",
    "<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}\n</tool_call><|im_end|>",
    "\n\n\n  \t tabs\tand\r\nnewlines  \n",
    "<s><s>[INST]  two spaces[/INST]",
    "e\u0301 combining accent then NFC",
]


def _random_text(rng: random.Random, specials: list[str]) -> str:
    alphabet = "abc XYZ 123 \n\t.,;:!?'\"{}[]<>|/_-éü你好🎉"
    parts = []
    for _ in range(rng.randint(1, 12)):
        if specials and rng.random() < 0.35:
            parts.append(rng.choice(specials))
        else:
            parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))))
    return "".join(parts)


@pytest.mark.parametrize("name", HF_TOKENIZERS)
def test_hf_encode_matches_transformers_and_segmented(name):
    tok = load_tokenizer(str(tokenizer_dir(name)))
    assert tok.kind == "hf" and tok.segmentable
    assert tok.id.startswith(f"{name}@sha256:") and len(tok.id.split(":")[-1]) == 16
    rng = random.Random(hash(name) % 1000)
    specials = sorted(tok.special_tokens)[:40]
    texts = SAMPLES + [_random_text(rng, specials) for _ in range(150)]
    for text in texts:
        expected = tok.hf(text, add_special_tokens=False)["input_ids"]
        assert tok.encode(text) == expected, text
        assert tok.encode_segmented(text) == expected, text
        assert tok.count(text) == len(expected)


@pytest.mark.parametrize("name", HF_TOKENIZERS)
def test_hf_continuation_encoding(name):
    """Encoding the text after a special-token boundary as a continuation gives the tail of the full ids."""
    tok = load_tokenizer(str(tokenizer_dir(name)))
    special = sorted(tok.special_tokens)[0]
    head, tail = f"abc {special}", " hello world<|im_end|> x"
    full = tok.encode(head + tail)
    assert tok.encode_segmented(head) + tok.encode_segmented(tail, at_start=False) == full


@pytest.mark.parametrize("name", HF_TOKENIZERS)
def test_encode_with_specials_marks_the_special_tokens(name):
    """`encode_with_specials` gives `encode_with_offsets`' ids and starts plus the positions of exactly the
    special tokens it cut out, at and behind the start."""
    tok = load_tokenizer(str(tokenizer_dir(name)))
    rng = random.Random(f"specials-{name}")
    specials = sorted(tok.special_tokens)[:40]
    ids_of_specials = set(tok.special_tokens.values())
    for text in SAMPLES + [_random_text(rng, specials) for _ in range(60)]:
        for at_start in (True, False):
            ids, starts, at = tok.encode_with_specials(text, at_start=at_start)
            assert (ids, starts) == tok.encode_with_offsets(text, at_start=at_start)
            assert at == [k for k, t in enumerate(ids) if t in ids_of_specials]
            assert [text[starts[k]:starts[k] + len(tok.decode([ids[k]]))] for k in at] == [
                tok.decode([ids[k]]) for k in at]


@pytest.mark.parametrize("name", HF_TOKENIZERS)
def test_encode_with_specials_equals_the_library_offsets(name):
    """ASCII texts holding special tokens (taken in one library call where the tokenizer is a byte-level BPE):
    `encode_with_specials` gives the library's own ids and character starts, at the start and, behind a
    special token, as a continuation (the ids and starts the same text has after `abc`)."""
    tok = load_tokenizer(str(tokenizer_dir(name)))
    rng = random.Random(f"whole-{name}")
    specials = sorted(tok.special_tokens)[:40]
    alphabet = "abc XYZ 123 \n\t.,;:!?'\"{}[]<>|/_-~"
    for _ in range(120):
        parts = [rng.choice(specials) if rng.random() < 0.35 else
                 "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(rng.randint(1, 10))]
        text = "".join(parts)
        enc = tok.backend.encode(text, add_special_tokens=False)
        ids, starts, at = tok.encode_with_specials(text)
        assert (ids, starts) == (enc.ids, [a for a, _ in enc.offsets]), text
        assert at == [k for k, t in enumerate(ids) if t in set(tok.special_tokens.values())]
        cont = rng.choice(specials) + text
        whole = tok.backend.encode("abc" + cont, add_special_tokens=False)
        k = len(tok.backend.encode("abc", add_special_tokens=False).ids)
        ids, starts, _ = tok.encode_with_specials(cont, at_start=False)
        assert ids == whole.ids[k:], cont
        assert starts == [a - 3 for a, _ in whole.offsets[k:]], cont


def test_mistral_metaspace_prepends_only_at_start():
    tok = load_tokenizer(str(tokenizer_dir("mistral-7b-instruct-v0.3")))
    alone = tok.encode("hello")
    after = tok.encode("[INST]hello")[1:]
    assert alone != after  # "▁hello" at the start, "hello" behind a special token
    assert tok.encode_segmented("hello", at_start=False) == after


def test_known_ids_and_no_bos():
    qwen = load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))
    assert qwen.encode("<|im_start|><|im_end|>") == [151644, 151645]
    assert qwen.eos_token == "<|im_end|>" and qwen.bos_token is None
    mistral = load_tokenizer(str(tokenizer_dir("mistral-7b-instruct-v0.3")))
    assert mistral.encode("<s>[INST]") == [1, 3]
    assert mistral.encode("hi")[0] != 1  # no BOS added
    assert mistral.decode([1, 3]) == "<s>[INST]"


def test_cached_per_spec():
    path = str(tokenizer_dir("smollm2-135m-instruct"))
    assert load_tokenizer(path) is load_tokenizer(path)
    tok = load_tokenizer(path)
    assert load_tokenizer(tok) is tok


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_tiktoken_matches_tiktoken(encoding, tiktoken_dir, monkeypatch):
    tiktoken = require_module("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    tok = load_tokenizer(f"tiktoken:{encoding}")
    assert tok.kind == "tiktoken" and tok.id.startswith(f"{encoding}+chatml@sha256:")
    # Reference: tiktoken's own encoding built from the same rank file, plus the ChatML specials.
    ranks = load_tiktoken_bpe(str(tiktoken_dir / f"{encoding}.tiktoken"))
    base = tiktoken.Encoding(name=encoding, pat_str=tok.encoding._pat_str, mergeable_ranks=ranks, special_tokens={})
    ref = tiktoken.Encoding(
        name=encoding,
        pat_str=tok.encoding._pat_str,
        mergeable_ranks=ranks,
        special_tokens=dict(tok.special_tokens),
    )
    rng = random.Random(7)
    specials = sorted(tok.special_tokens)
    for text in SAMPLES + [_random_text(rng, specials) for _ in range(150)]:
        expected = ref.encode(text, allowed_special="all")
        assert tok.encode(text) == expected
        assert tok.encode_segmented(text) == expected
        plain = "".join(p for p, s in tok.split_special(text) if not s)
        assert tok.encode(plain) == base.encode_ordinary(plain)
    im = CHATML_TIKTOKEN_SPECIALS[encoding]
    assert tok.encode("<|im_start|>x<|im_end|>")[0] == im["<|im_start|>"]
    assert tok.decode(tok.encode("héllo <|im_end|>")) == "héllo <|im_end|>"
    assert tok.decode(tok.encode("héllo <|im_end|>"), skip_special_tokens=True) == "héllo "


def test_tiktoken_path_spec_and_env(tiktoken_dir, monkeypatch, tmp_path):
    by_name = load_tokenizer("tiktoken:cl100k_base")
    by_path = load_tokenizer(f"tiktoken:{tiktoken_dir / 'cl100k_base.tiktoken'}")
    assert by_path.id == by_name.id
    assert by_path.encode("hello <|endoftext|>") == by_name.encode("hello <|endoftext|>") == [15339, 220, 100257]


def test_tiktoken_hash_mismatch_is_typed(tmp_path, monkeypatch):
    bad = tmp_path / "cl100k_base.tiktoken"
    bad.write_text("aGVsbG8= 0\n")
    monkeypatch.setenv("CTXKIT_TIKTOKEN_DIR", str(tmp_path))
    from ctxkit.text.tokenizer.tiktoken_files import tiktoken_constructor

    with pytest.raises(TokenizerError, match="cl100k_base"):
        tiktoken_constructor("cl100k_base")


def test_errors_are_typed(tmp_path):
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(str(tmp_path / "missing"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(TokenizerError, match=r"found \['notes.txt'\]"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(TokenizerError, match="unknown tiktoken encoding 'nope'.*cl100k_base"):
        load_tokenizer("tiktoken:nope")
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer("tiktoken:/no/such/file.tiktoken")
    with pytest.raises(TokenizerError):
        load_tokenizer("")
    tok = load_tokenizer(str(tokenizer_dir("smollm2-135m-instruct")))
    with pytest.raises(TokenizerError):
        tok.encode(123)  # type: ignore[arg-type]


def test_caches_are_bounded():
    from ctxkit.text.tokenizer.loader import _LRU

    tok = load_tokenizer(str(tokenizer_dir("smollm2-135m-instruct")))
    assert isinstance(tok, Tokenizer)
    cache = _LRU(100, maxchars=1000)
    for i in range(150):
        cache.put(i, i)
    assert len(cache) == 100 and cache.get(0) is None and cache.get(149) == 149
    pieces = _LRU(100, maxchars=1000)
    for i in range(20):
        pieces.put(("x" * 100 + str(i), True), (i,))
    assert len(pieces) <= 10 and pieces.get(("x" * 100 + "19", True)) == (19,)


def test_hub_id_offline_is_typed(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TokenizerError, match="cannot load Hugging Face tokenizer 'ctxkit-test/does-not-exist'"):
        load_tokenizer("ctxkit-test/does-not-exist")
