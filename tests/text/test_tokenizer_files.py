"""Tokenizer folders read without transformers: the same backend, special tokens, template and ids as
transformers' fast tokenizer; ids of the tokenizer unchanged; transformers loaded only when asked for."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys

import pytest

from conftest import HF_TOKENIZERS, REPO_ROOT, tokenizer_dir
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.tokenizer.hf_files import read_tokenizer_folder
from ctxkit.text.tokenizer.loader import load_tokenizer

IDS = {
    "mistral-7b-instruct-v0.3": "mistral-7b-instruct-v0.3@sha256:1d233f2977535f73",
    "smollm2-135m-instruct": "smollm2-135m-instruct@sha256:d6341524f8b50cd6",
    "qwen2.5-instruct": "qwen2.5-instruct@sha256:2644daf4513d59b0",
    "qwen3": "qwen3@sha256:66c471429cffc0e9",
}
"""Tokenizer ids as logs recorded them before the transformers-free loader (sha256 over the vocabulary files)."""

TEXTS = [
    "hello world",
    " leading space<|im_start|>user\nhé llo 你好 🎉<|im_end|>\n",
    "[INST] do it [/INST] done</s><s>[TOOL_CALLS] x",
    "e\u0301 NFC\r\n\t  tabs  <tool_call>\n{}\n</tool_call><think>\n</think>",
]


def _hf(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@pytest.mark.parametrize("name", HF_TOKENIZERS)
def test_folder_backend_equals_transformers(name):
    """Every component of the backend (added tokens with their flags included) and every value read from
    the config equal what transformers builds from the same folder."""
    files = read_tokenizer_folder(tokenizer_dir(name))
    assert files is not None
    hf = _hf(tokenizer_dir(name))
    ours, theirs = json.loads(files.backend.to_str()), json.loads(hf.backend_tokenizer.to_str())
    for part in ("normalizer", "pre_tokenizer", "model", "decoder", "added_tokens"):
        assert ours[part] == theirs[part], part
    assert files.special_tokens_map == hf.special_tokens_map
    assert (files.bos_token, files.eos_token) == (hf.bos_token, hf.eos_token)
    assert files.chat_template == hf.chat_template


@pytest.mark.parametrize("name", HF_TOKENIZERS)
def test_loaded_tokenizer_matches_transformers(name):
    tok = load_tokenizer(str(tokenizer_dir(name)))
    assert tok.id == IDS[name]
    assert tok.hf is tok.hf and type(tok.hf).__module__.startswith("transformers")  # loaded once, on first use
    assert tok.vocab_size == len(tok.hf)
    assert tok.special_tokens_map == tok.hf.special_tokens_map
    assert tok.special_tokens == {t.content: i for i, t in tok.hf.backend_tokenizer.get_added_tokens_decoder().items()}
    rng = random.Random(3)
    specials = sorted(tok.special_tokens)[:30]
    texts = TEXTS + ["".join(rng.choice(specials + ["a b", " \n", "é", "12 34", "  x"]) for _ in range(12)) for _ in range(40)]
    for text in texts:
        assert tok.encode(text) == tok.hf(text, add_special_tokens=False)["input_ids"], text
        assert tok.encode_model_input(text) == tok.hf(text)["input_ids"], text


def test_render_and_load_need_no_transformers():
    """`ctxkit render` of the bundled example (tokenizer, template, profile, render) imports neither
    transformers nor torch."""
    code = (
        "import sys\n"
        "from ctxkit.cli.parser import main\n"
        f"rc = main(['render', 'examples/agent_episode.json', '--tokenizer', {str(tokenizer_dir('qwen2.5-instruct'))!r}])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'torch'))\n"
        "print('HEAVY', rc, heavy, file=sys.stderr)\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True)
    assert "HEAVY 0 []" in out.stderr
    assert json.loads(out.stdout)["token_ids"][:3] == [151644, 8948, 198]


def test_templates_see_the_same_variables_as_apply_chat_template():
    tok = load_tokenizer(str(tokenizer_dir("smollm2-135m-instruct")))
    tpl = load_template(None, tok)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert tpl.render_text(msgs) == tok.hf.apply_chat_template(msgs, tokenize=False)


def _copy(name, tmp_path, config_update=None, drop=()):
    folder = tmp_path / name
    shutil.copytree(tokenizer_dir(name), folder)
    for f in folder.iterdir():
        f.chmod(0o644)
    for f in drop:
        (folder / f).unlink()
    if config_update is not None:
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        cfg.update(config_update)
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def test_chat_template_precedence_follows_transformers(tmp_path):
    """chat_template.jinja wins over the config's template; a list of named templates gives `default`."""
    both = _copy("smollm2-135m-instruct", tmp_path, {"chat_template": "{{ 'config' }}"})
    assert read_tokenizer_folder(both).chat_template == (both / "chat_template.jinja").read_text() == _hf(both).chat_template
    named = _copy("mistral-7b-instruct-v0.3", tmp_path, {"chat_template": [
        {"name": "default", "template": "{{ 'd' }}"}, {"name": "tool_use", "template": "{{ 't' }}"}]},
        drop=["chat_template.jinja"])
    assert read_tokenizer_folder(named).chat_template == "{{ 'd' }}"
    assert load_tokenizer(str(named)).chat_template == "{{ 'd' }}"


@pytest.mark.parametrize("update", [
    {"split_special_tokens": True},
    {"tokenizer_class": "GPT2Tokenizer"},
    {"pad_token": "<not-an-added-token>"},
    {"extra_special_tokens": {"image_token": "<|im_start|>"}},
])
def test_layouts_it_does_not_model_go_through_transformers(tmp_path, update):
    """A config asking for what the reader does not model returns None; `load_tokenizer` then loads
    through transformers, still a working tokenizer."""
    folder = _copy("qwen2.5-instruct", tmp_path, update)
    assert read_tokenizer_folder(folder) is None
    tok = load_tokenizer(str(folder))
    assert tok.backend is tok.hf.backend_tokenizer
    assert tok.encode("<|im_start|>user\nhi") == tok.hf("<|im_start|>user\nhi", add_special_tokens=False)["input_ids"]
