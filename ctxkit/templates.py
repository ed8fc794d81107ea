"""Versioned chat templates, rendered in a sandbox with a pinned clock (L1).

A template is one of:

- the tokenizer's own `chat_template` (`load_template(None, tok)`), versioned by the sha256 of its text
  plus the render options;
- a ctxkit template `name-vN` from the `templates/` folder (package `ctxkit_templates`), whose sha256
  is listed in `manifest.json` and checked on load;
- a path to a `.jinja` file, versioned by its sha256.

Rendering follows `transformers`' `apply_chat_template` exactly (same Jinja environment options,
filters, globals and template variables), except that `strftime_now` returns a fixed, recorded date
so that a render is reproducible. Templates are untrusted code: the environment is an
`ImmutableSandboxedEnvironment` and a sandbox violation is a `TemplateError`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

from ctxkit.errors import TemplateError

RENDER_CLOCK = datetime(2026, 1, 1, 12, 0, 0)
"""The date `strftime_now` reports in every render (recorded in each template's `options`)."""

RENDER_OPTIONS: Mapping[str, Any] = {
    "env": "ImmutableSandboxedEnvironment",
    "trim_blocks": True,
    "lstrip_blocks": True,
    "extensions": ["loopcontrols"],
    "strftime_now": RENDER_CLOCK.isoformat(),
}
"""Render options; part of a tokenizer template's version."""

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_COMPILED: dict[str, Any] = {}
_COMPILED_LOCK = threading.Lock()


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """Accepts `{% generation %}...{% endgeneration %}` (TRL training templates) and renders the body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return RENDER_CLOCK.strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")

    from jinja2.runtime import LoopContext

    dict_names = frozenset(dir(dict))
    loop_names = frozenset(n for n in dir(LoopContext) if not n.startswith("_"))

    class Sandbox(ImmutableSandboxedEnvironment):
        """The sandbox transformers uses, with two fast paths that give the same results: an item of a
        plain dict (what templates receive) and a public attribute of `loop`."""

        def getattr(self, obj, attribute):
            if type(obj) is dict and attribute not in dict_names:
                try:
                    return obj[attribute]
                except (TypeError, LookupError):
                    return self.undefined(obj=obj, name=attribute)
            if type(obj) is LoopContext and attribute in loop_names:
                return getattr(obj, attribute)
            return super().getattr(obj, attribute)

        def unsafe_undefined(self, obj, attribute):
            # Jinja returns an Undefined that renders as "" until used; a template touching Python
            # internals is refused outright instead.
            raise jinja2.exceptions.SecurityError(
                f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
            )

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def _compile(source: str, sha: str, name: str):
    with _COMPILED_LOCK:
        compiled = _COMPILED.get(sha)
    if compiled is not None:
        return compiled
    import jinja2

    try:
        compiled = _environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise TemplateError(f"template {name}: syntax error at line {exc.lineno}: {exc.message}") from exc
    with _COMPILED_LOCK:
        _COMPILED[sha] = compiled
    return compiled


def _plain(value: Any, where: str) -> Any:
    """Rebuild template inputs from plain JSON types, so no rich object reaches the sandbox."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k, where): _plain(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, where) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v, where) for v in value)
    raise TemplateError(f"{where}: value of type {type(value).__name__} cannot be passed to a chat template")


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as `apply_chat_template` gives them to the template: keys whose value is None dropped,
    reasoning aliased under `reasoning_content`/`thinking`."""
    out = []
    for i, message in enumerate(messages):
        msg = {k: v for k, v in _plain(message, f"message {i}").items() if v is not None}
        reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out


@dataclass(frozen=True)
class ChatTemplate:
    """A versioned chat template bound to the special-token variables of one tokenizer."""

    name: str
    """`name-vN` for ctxkit templates, the file stem for a path, `tokenizer` for a tokenizer's own."""
    sha256: str
    """sha256 of the template text (plus the render options for a tokenizer's own template)."""
    source: str
    """The template text."""
    origin: str
    """`"tokenizer"`, `"ctxkit"` or `"file"`."""
    variables: Mapping[str, Any] = field(default_factory=dict)
    """Template variables passed like transformers does (the tokenizer's special tokens: bos_token, ...)."""
    options: Mapping[str, Any] = field(default_factory=lambda: dict(RENDER_OPTIONS))
    """Render options (sandbox, whitespace control, pinned clock)."""

    @property
    def id(self) -> str:
        """`<name>@sha256:<first 16 hex>`."""
        return f"{self.name}@sha256:{self.sha256[:16]}"

    @property
    def has_generation_markers(self) -> bool:
        """Whether the text holds `{% generation %}` blocks (ctxkit never needs them)."""
        return bool(_GENERATION_RE.search(self.source))

    def render_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """Render `messages` (OpenAI dicts) to text, as `apply_chat_template(..., tokenize=False)` would."""
        chat = normalize_messages(messages)
        tool_schemas = _plain(list(tools), "tools") if tools is not None else None
        return self.render_chat(chat, tools=tool_schemas, add_generation_prompt=add_generation_prompt)

    def render_chat(self, chat: list[dict], *, tools: Any = None, add_generation_prompt: bool = False) -> str:
        """Render messages already normalized (`normalize_messages`) with plain tool schemas (or None)."""
        import jinja2

        compiled = _compile(self.source, self.sha256, self.name)
        tool_schemas = tools
        try:
            return compiled.render(
                messages=chat,
                tools=tool_schemas,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.variables,
            )
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(f"template {self.id}: sandbox violation: {exc}") from exc
        except jinja2.exceptions.TemplateError as exc:
            raise TemplateError(f"template {self.id}: {exc}") from exc
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            raise TemplateError(f"template {self.id} failed to render: {type(exc).__name__}: {exc}") from exc


def _manifest() -> tuple[Any, dict[str, Any]]:
    from importlib.resources import files

    root = files("ctxkit_templates")
    try:
        manifest = json.loads(root.joinpath("manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TemplateError(f"cannot read the ctxkit template manifest: {exc}") from exc
    return root, manifest


def available_templates() -> list[str]:
    """Names of the ctxkit templates in the manifest (`name-vN`)."""
    return sorted(_manifest()[1])


def _variables(tokenizer) -> dict[str, str]:
    hf = getattr(tokenizer, "hf", None)
    if hf is not None:
        return _plain(dict(hf.special_tokens_map), "special tokens")  # as apply_chat_template passes them
    out = {}
    if getattr(tokenizer, "bos_token", None):
        out["bos_token"] = tokenizer.bos_token
    if getattr(tokenizer, "eos_token", None):
        out["eos_token"] = tokenizer.eos_token
    return out


def load_template(spec: str | Path | ChatTemplate | None, tokenizer) -> ChatTemplate:
    """Load a template: None (the tokenizer's own), `name-vN` (ctxkit, sha256 checked) or a `.jinja` path."""
    if isinstance(spec, ChatTemplate):
        return spec
    variables = _variables(tokenizer)
    if spec is None:
        source = getattr(tokenizer, "chat_template", None)
        if not source:
            raise TemplateError(
                f"tokenizer {getattr(tokenizer, 'id', tokenizer)!r} has no chat template; "
                f"pass one of {available_templates()} or a .jinja path"
            )
        sha = _sha256(source + "\n" + json.dumps(dict(RENDER_OPTIONS), sort_keys=True))
        template = ChatTemplate(name="tokenizer", sha256=sha, source=source, origin="tokenizer", variables=variables)
    else:
        text = str(spec)
        path = Path(text).expanduser()
        if text.endswith(".jinja") or path.is_file():
            if not path.is_file():
                raise TemplateError(f"template file {text!r} does not exist")
            try:
                source = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise TemplateError(f"cannot read template file {text!r}: {exc}") from exc
            template = ChatTemplate(
                name=path.stem, sha256=_sha256(source), source=source, origin="file", variables=variables
            )
        else:
            root, manifest = _manifest()
            entry = manifest.get(text)
            if entry is None:
                raise TemplateError(f"unknown template {text!r}; available: {sorted(manifest)} (or a .jinja path)")
            source = root.joinpath(entry["file"]).read_text(encoding="utf-8")
            sha = _sha256(source)
            if sha != entry["sha256"]:
                raise TemplateError(
                    f"template {text!r}: sha256 of {entry['file']} is {sha}, manifest says {entry['sha256']}"
                )
            template = ChatTemplate(name=text, sha256=sha, source=source, origin="ctxkit", variables=variables)
    _compile(template.source, template.sha256, template.name)  # syntax errors surface at load time
    return template


_CHECK_NAMES = ("TemplateReport", "check_template", "probe_conversation")


def __getattr__(name: str) -> Any:
    # check_template lives in ctxkit.template_check (which imports this module); it is also reachable
    # here, the documented place, resolved on first use.
    if name in _CHECK_NAMES:
        from ctxkit import template_check

        return getattr(template_check, name)
    raise AttributeError(f"module 'ctxkit.templates' has no attribute {name!r}")

__all__ = [
    "ChatTemplate", "RENDER_CLOCK", "RENDER_OPTIONS", "TemplateReport", "available_templates", "check_template",
    "load_template", "normalize_messages", "probe_conversation",
]
