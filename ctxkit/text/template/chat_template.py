"""Versioned chat templates, rendered in a sandbox with a pinned clock.

A template is one of:

- the tokenizer's own `chat_template` (`load_template(None, tok)`), versioned by the sha256 of its text
  plus the render options;
- a ctxkit template `name-vN` from the `templates/` folder (package `ctxkit_templates`), whose sha256
  is listed in `manifest.json` and checked on load;
- a path to a `.jinja` file, versioned by its sha256.

Rendering follows `transformers`' `apply_chat_template` exactly (same Jinja environment options,
filters, globals and template variables), except that `strftime_now` returns a fixed, recorded date
so that a render is reproducible: `RENDER_CLOCK` unless `load_template(..., clock=...)` names another
(a template that prints the date, e.g. Llama 3.2's or gpt-oss's, then equals `apply_chat_template` on that
day). The clock is in the template's `options` and, when not the default, in its sha256 and id. Templates are untrusted code: they render in the sandbox of
`ctxkit.text.template.sandbox` under `RenderLimits` (time, output size, string and list sizes, recursion),
and a sandbox violation or a limit hit is a `TemplateError`. What a template does through a tokenizer
(generation prompt, end of turn, prefix preservation, locality) is `ctxkit.text.template.profile`'s.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence
from importlib.resources import files

from ctxkit.errors import TemplateError
from ctxkit.text.template.limits import DEFAULT_LIMITS, RenderLimits
from ctxkit.text.template.sandbox import RENDER_CLOCK, clock_function, compile_template, render_sandboxed

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


def plain_value(value: Any, where: str) -> Any:
    """`value` rebuilt from plain JSON types (str, int, float, bool, None, dict, list, tuple), so no
    rich object reaches the sandbox; anything else is a `TemplateError` naming `where`."""
    kind = type(value)
    if value is None or kind is str or kind is int or kind is float or kind is bool:
        return value
    if kind is dict:  # the common containers first: `isinstance(value, Mapping)` is an ABC check
        return {plain_value(k, where): plain_value(v, where) for k, v in value.items()}
    if kind is list:
        return [plain_value(v, where) for v in value]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_value(k, where): plain_value(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_value(v, where) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_value(v, where) for v in value)
    raise TemplateError(f"{where}: value of type {type(value).__name__} cannot be passed to a chat template")


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as `apply_chat_template` gives them to the template: keys whose value is None dropped,
    reasoning aliased under `reasoning_content`/`thinking`."""
    out = []
    for i, message in enumerate(messages):
        msg = {k: v for k, v in plain_value(message, f"message {i}").items() if v is not None}
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
    limits: RenderLimits = DEFAULT_LIMITS
    """Limits every render runs under (time, output size, string/list sizes, recursion); not part of
    the version, since a render within them gives the same text."""
    clock: datetime = RENDER_CLOCK
    """The date and time `strftime_now` reports (recorded in `options`; part of the version when not
    `RENDER_CLOCK`)."""

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
        tool_schemas = plain_value(list(tools), "tools") if tools is not None else None
        return self.render_chat(chat, tools=tool_schemas, add_generation_prompt=add_generation_prompt)

    def render_chat(self, chat: list[dict], *, tools: Any = None, add_generation_prompt: bool = False) -> str:
        """Render messages already normalized (`normalize_messages`) with plain tool schemas (or None)."""
        compiled = compile_template(self.source, self.sha256, self.name)
        variables = self.render_variables(chat, tools, add_generation_prompt)
        return render_sandboxed(compiled, self.limits, variables, f"template {self.id}")

    def render_variables(self, chat: list[dict], tools: Any, add_generation_prompt: bool) -> dict[str, Any]:
        """The variables a render of `chat` gets (as transformers passes them, with this template's clock)."""
        variables = {"messages": chat, "tools": tools, "documents": None,
                     "add_generation_prompt": add_generation_prompt, **self.variables}
        if self.clock != RENDER_CLOCK:  # a render variable shadows the sandbox's global of the same name
            variables["strftime_now"] = clock_function(self.clock)
        return variables


def template_manifest() -> tuple[Any, dict[str, Any]]:
    """`(root, manifest)`: the folder of ctxkit's versioned templates (package `ctxkit_templates`) and
    its `manifest.json` (`{"name-vN": {"file", "sha256", "description"}}`)."""
    root = files("ctxkit_templates")
    try:
        manifest = json.loads(root.joinpath("manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TemplateError(f"cannot read the ctxkit template manifest: {exc}") from exc
    return root, manifest


def available_templates() -> list[str]:
    """Names of the ctxkit templates in the manifest (`name-vN`)."""
    return sorted(template_manifest()[1])


def _variables(tokenizer) -> dict[str, str]:
    named = getattr(tokenizer, "special_tokens_map", None)  # a ctxkit Tokenizer: no transformers load
    if named is not None:
        return plain_value(dict(named), "special tokens")  # as apply_chat_template passes them
    hf = getattr(tokenizer, "hf", None)
    if hf is not None:
        return plain_value(dict(hf.special_tokens_map), "special tokens")  # as apply_chat_template passes them
    out = {}
    if getattr(tokenizer, "bos_token", None):
        out["bos_token"] = tokenizer.bos_token
    if getattr(tokenizer, "eos_token", None):
        out["eos_token"] = tokenizer.eos_token
    return out


def with_clock(template: ChatTemplate, clock: datetime) -> ChatTemplate:
    """`template` whose `strftime_now` reports `clock`; its sha256 (so its id) covers the clock unless it is
    `RENDER_CLOCK`. A naive or aware `datetime`; anything else is a `TemplateError`."""
    if not isinstance(clock, datetime):
        raise TemplateError(f"template {template.name}: clock must be a datetime, got {type(clock).__name__}")
    if clock == template.clock:
        return template
    base = _base_sha256(template)
    sha = base if clock == RENDER_CLOCK else _sha256(base + "\nclock " + clock.isoformat())
    return replace(template, clock=clock, sha256=sha, options={**template.options, "strftime_now": clock.isoformat()})


def with_kwargs(template: ChatTemplate, kwargs: Mapping[str, Any]) -> ChatTemplate:
    """`template` rendered with extra template variables, as `apply_chat_template(..., **kwargs)` passes them
    (e.g. `{"preserve_thinking": True}`, `{"truncate_history_thinking": False}`, `{"clear_thinking": False}`):
    a distinct template whose name lists them (`tokenizer+preserve_thinking=true`) and whose sha256 covers
    them, so its id differs from the plain template's and a run records which variant it chose. Empty
    `kwargs`: `template` itself. A kwarg that shadows a special-token variable is a `TemplateError`."""
    extra = plain_value(dict(kwargs), "template kwargs")
    if not extra:
        return template
    clash = sorted(set(extra) & set(template.variables))
    if clash or {"messages", "tools", "add_generation_prompt"} & set(extra):
        raise TemplateError(f"template {template.name}: kwargs {clash or sorted(extra)} would shadow a variable "
                            "the renderer passes")
    text = json.dumps(extra, sort_keys=True, ensure_ascii=False)
    label = ",".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(extra.items()))
    return replace(template, name=f"{template.name}+{label}", sha256=_sha256(template.sha256 + "\nkwargs " + text),
                   variables={**template.variables, **extra}, options={**template.options, "kwargs": extra})


def _base_sha256(template: ChatTemplate) -> str:
    """The sha256 `load_template` gives `template` under the default clock."""
    if template.origin == "tokenizer":
        return _sha256(template.source + "\n" + json.dumps(dict(RENDER_OPTIONS), sort_keys=True))
    return _sha256(template.source)


def _is_file(path: Path) -> bool:
    """Whether `path` is a file; False for a name the OS refuses (too long, a NUL: template source, say)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def load_template(spec: str | Path | ChatTemplate | None, tokenizer, *, limits: RenderLimits | None = None,
                  clock: datetime | None = None) -> ChatTemplate:
    """Load a template: None (the tokenizer's own), `name-vN` (ctxkit, sha256 checked) or a `.jinja` path
    (`vendor:<name>` is a vendor renderer, taken by `render` only: a `TemplateError` here).

    `limits` (default `DEFAULT_LIMITS`) bound every render of the template (see `RenderLimits`). `clock`
    (default `RENDER_CLOCK`) is the date `strftime_now` reports, recorded in the template (`with_clock`)."""
    if isinstance(spec, ChatTemplate):
        template = spec if limits is None or limits == spec.limits else replace(spec, limits=limits)
        return template if clock is None else with_clock(template, clock)
    limits = DEFAULT_LIMITS if limits is None else limits
    variables = _variables(tokenizer)
    if spec is None:
        source = getattr(tokenizer, "chat_template", None)
        if not source:
            raise TemplateError(
                f"tokenizer {getattr(tokenizer, 'id', tokenizer)!r} has no chat template; "
                f"pass one of {available_templates()} or a .jinja path"
            )
        sha = _sha256(source + "\n" + json.dumps(dict(RENDER_OPTIONS), sort_keys=True))
        template = ChatTemplate(name="tokenizer", sha256=sha, source=source, origin="tokenizer", variables=variables,
                                limits=limits)
    else:
        text = str(spec)
        if text.startswith("vendor:"):
            raise TemplateError(f"template {text!r} is a vendor renderer, not a chat template: pass it to "
                                "ctxkit.render(messages, tokenizer, template=...) (ctxkit.text.vendor); incremental "
                                "renderers and context builders render chat templates only")
        path = Path(text).expanduser()
        if text.endswith(".jinja") or _is_file(path):
            if not _is_file(path):
                raise TemplateError(f"template file {text!r} does not exist")
            try:
                source = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise TemplateError(f"cannot read template file {text!r}: {exc}") from exc
            template = ChatTemplate(
                name=path.stem, sha256=_sha256(source), source=source, origin="file", variables=variables,
                limits=limits,
            )
        else:
            root, manifest = template_manifest()
            entry = manifest.get(text)
            if entry is None:
                raise TemplateError(f"unknown template {text!r}; available: {sorted(manifest)} (or a .jinja path)")
            source = root.joinpath(entry["file"]).read_text(encoding="utf-8")
            sha = _sha256(source)
            if sha != entry["sha256"]:
                raise TemplateError(
                    f"template {text!r}: sha256 of {entry['file']} is {sha}, manifest says {entry['sha256']}"
                )
            template = ChatTemplate(name=text, sha256=sha, source=source, origin="ctxkit", variables=variables,
                                    limits=limits)
    compile_template(template.source, template.sha256, template.name)  # syntax errors surface at load time
    return template if clock is None else with_clock(template, clock)


__all__ = [
    "ChatTemplate", "DEFAULT_LIMITS", "RENDER_CLOCK", "RENDER_OPTIONS", "RenderLimits", "available_templates",
    "load_template", "normalize_messages", "plain_value", "template_manifest", "with_clock", "with_kwargs",
]
