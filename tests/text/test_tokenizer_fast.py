"""Tokenization at the library's floor: ids without offsets, and token starts from the ids where provable.

`count`/`encode`/`encode_segmented` take the ids-only path (`encode_batch_fast`, no offsets); a byte-level
BPE computes an ASCII piece's token starts as the running sum of its tokens' lengths instead of reading
the library's offsets. Both must equal the library's own answer exactly: on random text (unicode,
special tokens, at and behind the start), on every message text of ../shared/trajectories, for every
shared tokenizer, in either order of use (an ids-only cache entry first, or the offsets first).
"""

from __future__ import annotations

import json
import shutil
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import HF_TOKENIZERS, shared_path, tokenizer_dir
from ctxkit.events import Message
from ctxkit.log.importers import read_episodes, read_tools
from ctxkit.text.tokenizer.hf_files import (
    BYTE_LEVEL_CHARS,
    NOT_ONE_BYTE_PER_CHAR,
    TokenLengths,
    backend_functions,
    byte_level_layout,
    read_tokenizer_folder,
)
from ctxkit.text.tokenizer.loader import load_tokenizer

BYTE_LEVEL = {"qwen2.5-instruct": True, "qwen3": True, "smollm2-135m-instruct": True, "mistral-7b-instruct-v0.3": False}
"""Which shared tokenizers take the running-sum starts (the Metaspace/byte-fallback Mistral keeps the offsets)."""
TRAJECTORIES = {
    "tau-bench__gpt-4o-airline.json": "tau-bench__airline_tools.json",
    "sweagent__marshmallow-1867__function_calling_replace_from_source.traj": None,
    "sweagent__pydicom-1458.traj": None,
    "adp__swe-gym_openhands_sampled_trajectories__sample_raw.json": None,
    "adp__swe-smith__sample_raw.json": None,
}
DROPPED = {"smollm2-135m-instruct": "\x04\x06\x13\x14\x16\x1d"}
"""ASCII bytes a tokenizer's vocabulary lacks: BPE drops them (no unk token), so the token lengths do not add
up to the piece's and the piece takes the offsets path."""
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@lru_cache(maxsize=None)
def tok(name: str):
    return load_tokenizer(str(tokenizer_dir(name)))


@lru_cache(maxsize=None)
def codec(name: str):
    """A second codec over the same backend: its `library_offsets` is the reference (Rust offsets)."""
    return backend_functions(tok(name).backend, name)


def library(name: str, text: str, at_start: bool = True) -> tuple[list[int], list[int]]:
    """`(ids, starts)` of `text` as the library gives them: special tokens as their ids, every other piece
    through `encode` with offsets (behind a special token as a continuation)."""
    t, c = tok(name), codec(name)
    ids: list[int] = []
    starts: list[int] = []
    pos, first = 0, at_start
    for piece, special in t.split_special(text):
        if special:
            ids.append(t.special_tokens[piece])
            starts.append(pos)
        else:
            p_ids, p_starts = c.library_offsets(piece, first)
            ids.extend(p_ids)
            starts.extend(pos + s for s in p_starts)
        pos += len(piece)
        first = False
    return ids, starts


def texts_strategy(name: str, ascii_only: bool = False):
    specials = sorted(tok(name).special_tokens)[:30]
    plain = st.text(st.characters(max_codepoint=127) if ascii_only else st.characters(blacklist_categories=("Cs",)),
                    max_size=60)
    words = st.sampled_from(["hello", " world", "\n\n", "  ", "\t", "it's", "123", "é", "你好", "🎉", "e\u0301",
                             "{\"a\": [1]}", "\r\n", "def f():\n    pass"])
    parts = [plain, words] if ascii_only is False else [plain, st.sampled_from(["hello", " world", "\n\n", "it's"])]
    if specials:
        parts.append(st.sampled_from(specials))
    return st.lists(st.one_of(*parts), max_size=12).map("".join)


def test_which_tokenizers_take_the_running_sum():
    for name, expected in BYTE_LEVEL.items():
        assert (codec(name).piece_starts is not None) is expected, name
        assert byte_level_layout(tok(name).backend) is expected, name
    assert len(BYTE_LEVEL_CHARS) == 256 and all(len(c) == 1 for c in BYTE_LEVEL_CHARS)
    assert {chr(b) for b in range(ord("!"), ord("~") + 1)} <= BYTE_LEVEL_CHARS and " " not in BYTE_LEVEL_CHARS
    assert "\u0120" in BYTE_LEVEL_CHARS and "\u010a" in BYTE_LEVEL_CHARS  # GPT-2's space and newline


def test_token_lengths_and_added_tokens():
    backend = tok("qwen2.5-instruct").backend
    lengths = TokenLengths(backend)
    hello = backend.token_to_id("hello")
    spaced = backend.token_to_id("\u0120world")  # " world"
    assert (lengths[hello], lengths[spaced]) == (5, 6)
    assert lengths[backend.token_to_id("<|im_start|>")] == NOT_ONE_BYTE_PER_CHAR
    starts = codec("qwen2.5-instruct").piece_starts
    assert starts("hello world", [hello, spaced]) == [0, 5]
    assert starts("hello world", [hello]) is None  # lengths do not add up: the offsets path
    assert starts("héllo", backend.encode("héllo").ids) is None  # not ASCII
    assert starts("hello", [backend.token_to_id("<|im_start|>")]) is None


def test_a_dropped_byte_takes_the_offsets_path():
    c = codec("smollm2-135m-instruct")
    assert c.encode_piece_ids("\x06", True) == [] and c.piece_starts("\x06", []) is None
    for text in ["a\x06b", "x \x04\x1d y", "\x06\x06 hello"]:
        ids = c.encode_piece_ids(text, True)
        assert c.piece_starts(text, ids) is None
        assert c.encode_piece(text, True) == c.library_offsets(text, True)


@pytest.mark.parametrize("change, expected", [
    ({}, True),
    ({"post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}}, False),
    ({"post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}}, True),
    ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}}, False),
    ({"normalizer": {"type": "Lowercase"}}, False),
    ({"decoder": {"type": "Fuse"}}, False),
])
def test_the_guard_reads_the_backend_components(tmp_path, change, expected):
    """Only a layout whose offsets are the token lengths end to end takes the running sum: a post-processor
    that trims offsets, an added prefix space, another normalizer or decoder keep the offsets path; ids
    and starts stay the library's either way."""
    src = tokenizer_dir("smollm2-135m-instruct")
    for f in src.iterdir():
        if f.is_file():
            shutil.copy(f, tmp_path / f.name)
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    data.update(change)
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    backend = read_tokenizer_folder(tmp_path).backend
    c = backend_functions(backend, str(tmp_path))
    assert byte_level_layout(backend) is expected
    assert (c.piece_starts is not None) is expected
    for text in ["hello  world", " it's 12 o'clock\n\n", "x"]:
        assert c.encode_piece(text, True) == c.library_offsets(text, True)
        assert c.encode_piece_ids(text, True) == c.library_offsets(text, True)[0]


@pytest.mark.parametrize("name", HF_TOKENIZERS)
def test_ids_only_path_equals_the_library(name):
    t = tok(name)

    @SETTINGS
    @given(text=texts_strategy(name), at_start=st.booleans(), count_first=st.booleans())
    def check(text, at_start, count_first):
        t.clear_caches()
        ids, starts = library(name, text, at_start)
        if at_start:
            assert t.encode(text) == t.backend.encode(text, add_special_tokens=False).ids
        if count_first:  # ids-only cache entries first, then the offsets (the entry is completed)
            if at_start:
                assert t.count(text) == len(ids)
            assert t.encode_segmented(text, at_start=at_start) == ids
            assert t.encode_with_offsets(text, at_start=at_start) == (ids, starts)
        else:
            assert t.encode_with_offsets(text, at_start=at_start) == (ids, starts)
            assert t.encode_segmented(text, at_start=at_start) == ids
            if at_start:
                assert t.count(text) == len(ids)
        for piece, special in t.split_special(text):
            if not special:
                assert list(t.encode_piece(piece, False)) == codec(name).library_offsets(piece, False)[0]

    check()


@pytest.mark.parametrize("name", HF_TOKENIZERS)
def test_running_sum_starts_equal_the_rust_offsets_on_ascii(name):
    t, c = tok(name), codec(name)

    @SETTINGS
    @given(text=texts_strategy(name, ascii_only=True), at_start=st.booleans())
    def check(text, at_start):
        first = at_start
        for piece, special in t.split_special(text):
            if not special:
                reference = c.library_offsets(piece, first)
                assert c.encode_piece(piece, first) == reference
                ids = c.encode_piece_ids(piece, first)
                assert ids == reference[0]
                if BYTE_LEVEL[name]:  # the path is taken, not merely harmless, unless a byte has no token
                    got = c.piece_starts(piece, ids)
                    assert got == (None if set(piece) & set(DROPPED.get(name, "")) else reference[1])
            first = False

    check()


@lru_cache(maxsize=None)
def trajectory_texts() -> tuple[str, ...]:
    texts: set[str] = set()
    for name, tools in TRAJECTORIES.items():
        path = shared_path("trajectories", name)
        tool_list = read_tools(shared_path("trajectories", tools)) if tools else None
        for episode in read_episodes(path, format="auto", tools=tool_list):
            for event in episode.events:
                if isinstance(event, Message):
                    texts.update(x for x in (event.content, event.reasoning_content) if isinstance(x, str) and x)
    return tuple(sorted(texts))


@pytest.mark.parametrize("name", HF_TOKENIZERS)
def test_every_trajectory_text(name):
    """Every message text of the shared trajectories: ids-only and offsets paths equal the library's, and
    on a byte-level tokenizer every ASCII piece's running-sum starts equal the Rust offsets."""
    t, c = tok(name), codec(name)
    t.clear_caches()
    texts = trajectory_texts()
    assert len(texts) > 3000
    summed = 0
    for text in texts:
        ids, starts = library(name, text)
        assert t.encode_segmented(text) == ids and t.count(text) == len(ids)
        assert t.encode(text) == ids
        assert t.encode_with_offsets(text) == (ids, starts)
        for piece, special in t.split_special(text):
            if not special and BYTE_LEVEL[name] and piece.isascii():
                got = c.piece_starts(piece, c.encode_piece_ids(piece, True))
                dropped = set(piece) & set(DROPPED.get(name, ""))
                assert got == (None if dropped else c.library_offsets(piece, True)[1])
                summed += got is not None
    assert (summed > 3000) is BYTE_LEVEL[name]
