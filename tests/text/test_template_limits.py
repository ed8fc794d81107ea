"""Untrusted templates: render limits enforced inside the sandbox (time, output, sizes, recursion).

Hostile templates run in a child process under an address-space limit (`RLIMIT_AS`), importing only
`ctxkit.text.template.chat_template` (no torch, no transformers), so a regression fails the test instead of taking the
machine down. The subprocess timeout is a safety net, never the assertion: the child reports what it
raised and how much its peak memory grew.
"""

from __future__ import annotations

import json
import re
import os
import resource
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, tokenizer_dir
from ctxkit.errors import ConfigError, TemplateError
from ctxkit.text.template.limits import DEFAULT_LIMITS, RenderLimits
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.tokenizer.loader import load_tokenizer

CL100K = "tiktoken:cl100k_base"
"""A tokenizer without a chat template (file templates get its BOS/EOS variables)."""

ADDRESS_SPACE = 3 * 1024**3
"""The child's address-space limit (bytes)."""

CLI_ADDRESS_SPACE = 4 * 1024**3
"""The CLI child's (it loads transformers for the tokenizer)."""

CHILD = r"""
import hashlib, json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
from ctxkit.errors import TemplateError
from ctxkit.text.template.limits import RenderLimits
from ctxkit.text.template.chat_template import ChatTemplate

source, limits = sys.argv[1], json.loads(sys.argv[2])
template = ChatTemplate(name="evil", sha256=hashlib.sha256(source.encode()).hexdigest(), source=source,
                        origin="file", limits=RenderLimits(**limits))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    out = template.render_text([{"role": "user", "content": "hi"}])
    result = {"error": None, "output_chars": len(out)}
except TemplateError as exc:
    result = {"error": type(exc).__name__, "message": str(exc)}
except BaseException as exc:
    result = {"error": type(exc).__name__, "message": str(exc)[:300]}
result["maxrss_growth_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps(result))
""".replace("ADDRESS_SPACE", str(ADDRESS_SPACE))


def render_in_child(source: str, **limits) -> dict:
    """Render `source` in a memory-limited child; what it raised (or rendered) and its memory growth."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, source, json.dumps(limits)],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


MAX_GROWTH_KIB = 256 * 1024
"""Peak memory a refused template may add (the limits refuse before building the big value)."""

HOSTILE = [
    # (template, the limit that must be named, what it says)
    ("{{ 'a' * 1000000000 }}", "max_length=16000000", "'*' on a str would be 1000000000 long"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "max_depth=64", "calls nested too deeply"),
    ("{% for i in range(100000000) %}{{ i }}{% endfor %}", "max_range=100000", "range of 100000000 items"),
    ("{{ [0] * 1000000000 }}", "max_length=16000000", "'*' on a list would be 1000000000 long"),
    ("{{ 'a' | center(1000000000) }}", "max_length=16000000", "|center would be 1000000000 long"),
    ("{{ 'a'.ljust(1000000000) }}", "max_length=16000000", "str.ljust would be 1000000000 long"),
    ("{{ '{:>1000000000}'.format('a') }}", "max_length=16000000", "a format width of 1000000000"),
    ("{{ '%1000000000s' % 'a' }}", "max_length=16000000", "a '%' format width of 1000000000"),
    ("{{ 3 ** 100000000 }}", "max_int_bits=65536", "an integer ** would have about 200000000 bits"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "max_length=16000000", "a string joined with '~' would be 16777216 long"),
    ("{% set x %}{% for i in range(1000) %}{{ 'a' * 10000000 }}{% endfor %}{% endset %}{{ x | length }}",
     "max_output_chars=64000000", "70000000 characters output"),
    ("{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}",
     "max_length=16000000", "namespace attribute 'l'"),
]


@pytest.mark.parametrize("source, limit, what", HOSTILE, ids=[h[1].split("=")[0] + f"-{i}" for i, h in enumerate(HOSTILE)])
def test_hostile_template_hits_a_limit_without_growing_memory(source, limit, what):
    result = render_in_child(source)
    assert result["error"] == "TemplateError", result
    assert result["message"].startswith("template evil@sha256:")
    assert f"render limit {limit} exceeded: " in result["message"] and what in result["message"]
    assert result["maxrss_growth_kib"] < MAX_GROWTH_KIB, result


def test_deadline_ends_a_loop_without_calls():
    source = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    result = render_in_child(source, max_seconds=0.5)
    assert result["error"] == "TemplateError", result
    assert "render limit max_seconds=0.5 exceeded: the render took longer" in result["message"]


def test_limits_are_parameters(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ 'ab' * 10 }}|{% for i in range(5) %}{{ i }}{% endfor %}")
    assert load_template(str(path), load_tokenizer(CL100K)).render_text([]) == "abababababababababab|01234"
    tight = load_template(str(path), load_tokenizer(CL100K), limits=RenderLimits(max_length=19))
    with pytest.raises(TemplateError, match=r"^template t@sha256:[0-9a-f]{16}: render limit max_length=19 exceeded: "
                                           r"'\*' on a str would be 20 long$"):
        tight.render_text([])
    with pytest.raises(TemplateError, match="render limit max_range=4 exceeded: range of 5 items"):
        load_template(str(path), load_tokenizer(CL100K), limits=RenderLimits(max_range=4)).render_text([])
    with pytest.raises(TemplateError, match="render limit max_output_chars=10 exceeded"):
        load_template(str(path), load_tokenizer(CL100K), limits=RenderLimits(max_output_chars=10)).render_text([])
    assert load_template(str(path), load_tokenizer(CL100K)).limits == DEFAULT_LIMITS
    with pytest.raises(ConfigError, match=r"RenderLimits.max_depth must be a positive number, got 0"):
        RenderLimits(max_depth=0)


def test_ordinary_python_errors_are_template_errors(tmp_path):
    path = tmp_path / "div.jinja"
    path.write_text("{{ 1 / 0 }}")
    with pytest.raises(TemplateError, match=r"^template div@sha256:[0-9a-f]{16} failed to render: "
                                           r"ZeroDivisionError: division by zero$"):
        load_template(str(path), load_tokenizer(CL100K)).render_text([])


def long_conversation(n_cycles: int = 60, tool_chars: int = 20_000) -> tuple[list[dict], list[dict]]:
    """302 messages: system, user, then cycles of (assistant with two tool calls, two tool results with
    long outputs, assistant answer, user); tool-call ids are 9 characters (Mistral's rule)."""
    tools = [{"type": "function", "function": {
        "name": "read_file", "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
    msgs: list[dict] = [{"role": "system", "content": "You are a careful agent."},
                        {"role": "user", "content": "Read every file and summarize."}]
    for c in range(n_cycles):
        a, b = f"call{2 * c:05d}", f"call{2 * c + 1:05d}"
        msgs += [
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": a, "type": "function", "function": {"name": "read_file", "arguments": {"path": f"f{c}.txt"}}},
                {"id": b, "type": "function", "function": {"name": "read_file", "arguments": {"path": f"g{c}.txt"}}}]},
            {"role": "tool", "tool_call_id": a, "content": (f"line {c} naïve 你好 " * tool_chars)[:tool_chars]},
            {"role": "tool", "tool_call_id": b, "content": f"short {c}"},
            {"role": "assistant", "content": f"File {c} read."},
            {"role": "user", "content": f"Next ({c})."},
        ]
    return msgs, tools


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "qwen3", "mistral-7b-instruct-v0.3", "smollm2-135m-instruct"])
def test_real_templates_render_a_long_conversation_unchanged(name):
    tok = load_tokenizer(str(tokenizer_dir(name)))
    msgs, tools = long_conversation()
    template = load_template(None, tok)
    for agp in (False, True):
        expected = tok.hf.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=agp)
        assert template.render_text(msgs, tools=tools, add_generation_prompt=agp) == expected


def test_ctxkit_templates_render_a_long_conversation_unchanged():
    from ctxkit.text.template.chat_template import available_templates, template_manifest

    tok = load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))
    msgs, tools = long_conversation()
    root, manifest = template_manifest()
    assert available_templates()
    for name in available_templates():
        source = root.joinpath(manifest[name]["file"]).read_text(encoding="utf-8")
        expected = tok.hf.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True,
                                              chat_template=source)
        got = load_template(name, tok).render_text(msgs, tools=tools, add_generation_prompt=True)
        assert got == expected and len(got) > 1_200_000


def test_cli_render_with_a_hostile_template_is_one_error_line(tmp_path):
    evil = tmp_path / "evil.jinja"
    evil.write_text("{{ 'a' * 1000000000 }}")
    conv = tmp_path / "conv.json"
    conv.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    proc = subprocess.run(
        [sys.executable, "-m", "ctxkit.cli.parser", "render", str(conv), "--template", str(evil),
         "--tokenizer", str(tokenizer_dir("qwen2.5-instruct"))],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (CLI_ADDRESS_SPACE, CLI_ADDRESS_SPACE)),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctxkit: error: template evil@sha256:")
    assert "render limit max_length=16000000 exceeded: '*' on a str would be 1000000000 long" in lines[0]


def test_tojson_keeps_the_text_per_container_and_options():
    from ctxkit.text.template.limits import tojson

    args = {"cmd": "ls -l", "n": [1, 2]}
    assert tojson(args) == '{"cmd": "ls -l", "n": [1, 2]}'
    assert tojson(args) is tojson(args)  # kept by identity
    assert tojson(args, indent=2) == '{\n  "cmd": "ls -l",\n  "n": [\n    1,\n    2\n  ]\n}'
    assert tojson(args, separators=[",", ":"]) == '{"cmd":"ls -l","n":[1,2]}'  # unhashable options: not kept
    assert tojson({"cmd": "ls -l", "n": [1, 2]}, sort_keys=True) == '{"cmd": "ls -l", "n": [1, 2]}'


FAST_PATHS = [
    # a public str attribute (methods, through a loop: Jinja passes `_loop_vars` to calls made there)
    ("{% for m in messages %}{{ m.content.strip().upper() }}|{{ m.content.startswith('h') }}|"
     "{{ m.content.split(' ') | length }}|{{ m.content.nope is defined }}{% endfor %}",
     "HI THERE|False|4|FalseIF IT FITS|False|3|False"),
    # a macro called in a loop and from a macro; a dict view's method
    ("{% macro q(x) %}<{{ x.replace('i', 'I') }}>{% endmacro %}{% macro w(x) %}[{{ q(x) }}]{% endmacro %}"
     "{% for m in messages %}{{ w(m.content) }}{% for k, v in m.items() %}{{ k }}{% endfor %}{% endfor %}",
     "[< hI there >]rolecontent[<If It fIts>]rolecontent"),
    # str.format and format_map stay wrapped by the sandbox's formatter
    ("{{ '{}-{}'.format(messages[0].content, 2) }}{{ '{a}'.format_map({'a': 1}) }}", " hi there -21"),
    # a macro called where autoescape is on gets the caller's eval context (without it, its output is escaped)
    ("{% macro b(x) %}<{{ x }}>{% endmacro %}{% autoescape true %}{{ b('&') }}{% endautoescape %}{{ b('&') }}",
     "<&><&>"),
]


@pytest.mark.parametrize("source, text", FAST_PATHS, ids=["str-attributes", "macros", "format", "autoescape"])
def test_sandbox_fast_paths_render_as_jinjas_own_sandbox(source, text, tmp_path):
    """The sandbox's shortcuts (a plain str's public attributes, calls of built-in methods and macros) give the
    text Jinja's `ImmutableSandboxedEnvironment` gives, and what it refuses stays refused."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    messages = [{"role": "user", "content": " hi there "}, {"role": "assistant", "content": "if it fits"}]
    path = tmp_path / "t.jinja"
    path.write_text(source)
    jinja = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source)
    assert jinja.render(messages=messages) == text
    assert load_template(str(path), load_tokenizer(CL100K)).render_text(messages) == text


@pytest.mark.parametrize("source, what", [
    ("{{ messages[0].content.__class__ }}", "access to attribute '__class__' of 'str' object is unsafe"),
    ("{{ '{0.__class__}'.format(messages[0].content) }}", "access to attribute '__class__' of 'str' object is unsafe"),
    ("{{ messages[0].content.ljust(100000000) }}", "render limit max_length=16000000 exceeded: str.ljust"),
])
def test_sandbox_fast_paths_keep_the_refusals(source, what, tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(source)
    with pytest.raises(TemplateError, match=re.escape(what)):
        load_template(str(path), load_tokenizer(CL100K)).render_text([{"role": "user", "content": "hi"}])
