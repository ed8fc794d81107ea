"""Templates: loading and versioning, manifest sha check, sandbox, pinned clock, check_template."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import tokenizer_dir
from ctxkit.errors import TemplateError
from ctxkit.text.template import chat_template as templates_mod
from ctxkit.text.template.check import check_template
from ctxkit.text.template.chat_template import RENDER_CLOCK, available_templates, load_template
from ctxkit.text.tokenizer.loader import load_tokenizer


def qwen():
    return load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))


def test_tokenizer_template_is_versioned_by_text_and_options():
    t = qwen()
    tpl = load_template(None, t)
    assert tpl.origin == "tokenizer" and tpl.source == t.chat_template
    opts = json.dumps(dict(templates_mod.RENDER_OPTIONS), sort_keys=True)
    assert tpl.sha256 == hashlib.sha256((t.chat_template + "\n" + opts).encode()).hexdigest()
    assert tpl.id == f"tokenizer@sha256:{tpl.sha256[:16]}"
    assert tpl.variables == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    msgs = [{"role": "user", "content": "Hi"}]
    assert tpl.render_text(msgs, add_generation_prompt=True) == t.hf.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True)


def test_ctxkit_template_from_manifest():
    assert "chatml-tools-v1" in available_templates()
    tpl = load_template("chatml-tools-v1", load_tokenizer("tiktoken:o200k_base"))
    from importlib.resources import files

    text = files("ctxkit_templates").joinpath("chatml-tools-v1.jinja").read_text(encoding="utf-8")
    assert tpl.sha256 == hashlib.sha256(text.encode()).hexdigest() and tpl.origin == "ctxkit"
    out = tpl.render_text(
        [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        add_generation_prompt=True,
    )
    assert out == "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"


def test_manifest_sha_mismatch_is_rejected(tmp_path, monkeypatch):
    (tmp_path / "x-v1.jinja").write_text("{{ messages[0].content }}")
    manifest = {"x-v1": {"file": "x-v1.jinja", "sha256": "0" * 64}}
    monkeypatch.setattr(templates_mod, "template_manifest", lambda: (Path(tmp_path), manifest))
    with pytest.raises(TemplateError, match=r"x-v1.*sha256 of x-v1.jinja is [0-9a-f]{64}, manifest says 0{64}"):
        load_template("x-v1", qwen())
    manifest["x-v1"]["sha256"] = hashlib.sha256(b"{{ messages[0].content }}").hexdigest()
    assert load_template("x-v1", qwen()).render_text([{"role": "user", "content": "ok"}]) == "ok"


def test_file_template_and_errors(tmp_path):
    p = tmp_path / "mine.jinja"
    p.write_text("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    tpl = load_template(str(p), qwen())
    assert tpl.name == "mine" and tpl.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()
    assert tpl.render_text([{"role": "user", "content": "x"}]) == "[user]x"
    with pytest.raises(TemplateError, match="does not exist"):
        load_template(str(tmp_path / "missing.jinja"), qwen())
    with pytest.raises(TemplateError, match=r"unknown template 'nope-v9'.*chatml-tools-v1"):
        load_template("nope-v9", qwen())
    source = "{% for m in messages %}" + "x" * 300 + "{% endfor %}"  # source where a name is expected: not a path
    with pytest.raises(TemplateError, match=r"unknown template '\{% for m in messages %\}x"):
        load_template(source, qwen())
    (tmp_path / "broken.jinja").write_text("{% for m in messages %}")
    with pytest.raises(TemplateError, match="syntax error at line 1"):
        load_template(str(tmp_path / "broken.jinja"), qwen())
    (tmp_path / "raise.jinja").write_text("{{ raise_exception('no system here') }}")
    with pytest.raises(TemplateError, match="no system here"):
        load_template(str(tmp_path / "raise.jinja"), qwen()).render_text([])
    with pytest.raises(TemplateError, match="has no chat template"):
        load_template(None, load_tokenizer("tiktoken:cl100k_base"))


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__ }}",
        "{{ raise_exception.__globals__ }}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ messages.append(1) }}",
    ],
)
def test_sandbox_blocks_python_internals(source, tmp_path):
    p = tmp_path / "evil.jinja"
    p.write_text(source)
    with pytest.raises(TemplateError):
        load_template(str(p), qwen()).render_text([{"role": "user", "content": "x"}])


def test_clock_is_pinned(tmp_path):
    p = tmp_path / "date.jinja"
    p.write_text("{{ strftime_now('%Y-%m-%d %H:%M') }}")
    tpl = load_template(str(p), qwen())
    assert tpl.render_text([]) == RENDER_CLOCK.strftime("%Y-%m-%d %H:%M") == "2026-01-01 12:00"
    assert tpl.options["strftime_now"] == RENDER_CLOCK.isoformat()


def test_clock_is_an_explicit_recorded_input(tmp_path):
    """`load_template(..., clock=)` sets the date `strftime_now` reports (Llama 3.2 and gpt-oss print it); the
    clock is in the options and the id, and the default clock keeps the id a template always had."""
    from datetime import datetime

    from ctxkit.text.template.chat_template import with_clock

    p = tmp_path / "date.jinja"
    p.write_text("{{ strftime_now('%d %b %Y') }}|{{ messages | length }}")
    default = load_template(str(p), qwen())
    day = datetime(2024, 7, 26, 9, 30)
    dated = load_template(str(p), qwen(), clock=day)
    assert dated.render_text([]) == "26 Jul 2024|0"
    assert default.render_text([]) == "01 Jan 2026|0"  # the shared environment's clock is untouched
    assert dated.options["strftime_now"] == "2024-07-26T09:30:00" and dated.clock == day
    assert dated.id != default.id and dated.name == default.name
    assert load_template(str(p), qwen(), clock=day).id == dated.id  # the same clock, the same id
    assert with_clock(dated, RENDER_CLOCK) == default
    assert load_template(dated, qwen(), clock=datetime(2025, 3, 1)).render_text([]) == "01 Mar 2025|0"
    tok_tpl = load_template(None, qwen())
    assert load_template(None, qwen(), clock=RENDER_CLOCK).id == tok_tpl.id
    with pytest.raises(TemplateError, match="clock must be a datetime"):
        load_template(str(p), qwen(), clock="2024-07-26")


def test_tojson_keeps_non_ascii(tmp_path):
    p = tmp_path / "j.jinja"
    p.write_text("{{ messages[0] | tojson }}")
    out = load_template(str(p), qwen()).render_text([{"role": "user", "content": "café 你好 <b>"}])
    assert out == '{"role": "user", "content": "café 你好 <b>"}'


EXPECTED_REPORTS = {
    # name: (prefix_preserving, message_prefix_preserving, supports_tools, end_of_turn, bos_risk, default system)
    "qwen2.5-instruct": (True, False, True, "<|im_end|>", False, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
    "qwen3": (False, False, True, "<|im_end|>", False, None),
    "mistral-7b-instruct-v0.3": (False, False, True, "</s>", True, None),
    "smollm2-135m-instruct": (True, True, False, "<|im_end|>", False, "You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_REPORTS))
def test_check_template_on_stock_templates(name):
    t = load_tokenizer(str(tokenizer_dir(name)))
    report = check_template(t, None)
    pp, mpp, tools, eot, bos_risk, default_system = EXPECTED_REPORTS[name]
    assert report.prefix_preserving is pp
    assert report.message_prefix_preserving is mpp
    assert report.supports_tools is tools
    assert report.end_of_turn == eot
    assert report.bos_duplication_risk is bos_risk
    assert report.default_system_prompt == default_system
    assert report.generation_markers is False
    d = report.to_dict()
    assert {"prefix_preserving", "supports_tools", "end_of_turn"} <= set(d)
    if name == "qwen2.5-instruct":
        assert report.failed_transitions == ("tool->tool",)  # consecutive tool results share one turn
    if name == "qwen3":
        assert "assistant->user" in report.failed_transitions  # earlier reasoning dropped
        assert report.supports_reasoning


def test_check_template_chatml_and_training_markers():
    t = load_tokenizer("tiktoken:cl100k_base")
    report = check_template(t, "chatml-tools-v1")
    assert report.prefix_preserving and report.message_prefix_preserving and report.supports_tools
    assert report.end_of_turn == "<|im_end|>" and report.generation_prompt == "<|im_start|>assistant\n"
    assert report.failed_transitions == () and report.supports_reasoning
    training = tokenizer_dir("qwen2.5-instruct") / "chat_template_training.jinja"
    assert check_template(qwen(), str(training)).generation_markers is True
