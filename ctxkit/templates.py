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
    variables: Mapping[str, str] = field(default_factory=dict)
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
        import jinja2

        compiled = _compile(self.source, self.sha256, self.name)
        chat = normalize_messages(messages)
        tool_schemas = _plain(list(tools), "tools") if tools is not None else None
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
        return {k: v for k, v in hf.special_tokens_map.items() if isinstance(v, str)}
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


# ---------------------------------------------------------------------------------------- check


@dataclass(frozen=True)
class TemplateReport:
    """What `check_template` found about a template rendered through one tokenizer."""

    template_id: str
    """Id of the checked template."""
    tokenizer_id: str
    """Id of the tokenizer it was rendered through."""
    prefix_preserving: bool
    """Each context an agent sees (the render before an assistant turn, with the generation prompt) is a
    prefix of the render of every longer history, so consecutive steps extend each other."""
    message_prefix_preserving: bool
    """Stricter: the render of n messages is a prefix of the render of n+1, for every message."""
    failed_transitions: tuple[str, ...]
    """Role transitions `a->b` at which a prefix check failed."""
    supports_tools: bool
    """The tool schemas and tool calls show up in the render."""
    supports_reasoning: bool
    """An assistant turn's `reasoning_content` shows up in the render (when it is the last turn)."""
    end_of_turn: str | None
    """Special-token text that closes an assistant turn (`<|im_end|>`, `</s>`), None if none."""
    generation_prompt: str
    """Text `add_generation_prompt=True` appends (empty if the template ignores it)."""
    bos_token: str | None
    """BOS token the render starts with, if any."""
    bos_duplication_risk: bool
    """The render already starts with BOS while the tokenizer would add BOS when encoding with special
    tokens: tokenizing the text with `add_special_tokens=True` would double it."""
    generation_markers: bool
    """The text holds `{% generation %}` markers (ctxkit does not need them)."""
    default_system_prompt: str | None
    """System text the template inserts when the conversation has no system message."""
    notes: tuple[str, ...] = ()
    """Anything that failed while probing (e.g. the template rejects a probe)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        from dataclasses import asdict

        return asdict(self)


def probe_conversation(tools: bool = True, reasoning: bool = True) -> tuple[list[dict], list[dict] | None]:
    """A small conversation covering every role transition, tool calls (two in one turn) and reasoning.

    Tool-call ids are 9 characters (Mistral's rule) and user/assistant turns alternate."""
    tool_schemas = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            },
        }
    ]
    msgs: list[dict] = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "Summarize a.txt and b.txt."},
    ]
    if tools:
        msgs += [
            {
                "role": "assistant",
                "content": "",
                **({"reasoning_content": "I should read both files."} if reasoning else {}),
                "tool_calls": [
                    {"id": "call00001", "type": "function", "function": {"name": "read_file", "arguments": {"path": "a.txt"}}},
                    {"id": "call00002", "type": "function", "function": {"name": "read_file", "arguments": {"path": "b.txt"}}},
                ],
            },
            {"role": "tool", "tool_call_id": "call00001", "content": "alpha"},
            {"role": "tool", "tool_call_id": "call00002", "content": "beta"},
        ]
    msgs += [
        {"role": "assistant", "content": "a.txt says alpha, b.txt says beta.",
         **({"reasoning_content": "Both read."} if reasoning else {})},
        {"role": "user", "content": "Thanks. Anything else?"},
        {"role": "assistant", "content": "No."},
    ]
    return msgs, (tool_schemas if tools else None)


def check_template(tokenizer, template: ChatTemplate | str | None = None) -> TemplateReport:
    """Probe a template: prefix preservation per role transition, tool support, end-of-turn, BOS risk, ..."""
    template = load_template(template, tokenizer)
    notes: list[str] = []
    eos = getattr(tokenizer, "eos_token", None)
    bos = getattr(tokenizer, "bos_token", None)
    specials = getattr(tokenizer, "special_tokens", {}) or {}

    def render(msgs, tools=None, agp=False):
        return template.render_text(msgs, tools=tools, add_generation_prompt=agp)

    # Which probe the template accepts: with tools, then without.
    msgs, tools = probe_conversation(tools=True)
    supports_tools = False
    try:
        full = render(msgs, tools)
        schema_name = tools[0]["function"]["name"]
        supports_tools = schema_name in render(msgs[:2], tools) and "b.txt" in full
    except TemplateError as exc:
        notes.append(f"tool probe rejected: {exc}")
    if not supports_tools:
        msgs, tools = probe_conversation(tools=False)
        full = render(msgs, tools)

    failed: list[str] = []
    decision_ok = True
    message_ok = True
    for n in range(1, len(msgs)):
        nxt = msgs[n]["role"]
        transition = f"{msgs[n - 1]['role']}->{nxt}"
        longer = render(msgs[: n + 1], tools)
        plain = render(msgs[:n], tools)
        if not longer.startswith(plain):
            message_ok = False
            failed.append(transition)
        if nxt == "assistant":
            ctx = render(msgs[:n], tools, agp=True)
            if not all(render(msgs[:m], tools).startswith(ctx) for m in range(n + 1, len(msgs) + 1)):
                decision_ok = False
                failed.append(f"{transition} (generation prompt)")

    base = render(msgs[:2], tools)
    generation_prompt = ""
    with_prompt = render(msgs[:2], tools, agp=True)
    if with_prompt.startswith(base):
        generation_prompt = with_prompt[len(base) :]
    else:
        notes.append("add_generation_prompt does not extend the render")

    # End of turn: the special token closing the last assistant turn.
    end_of_turn = None
    last = render(msgs, tools)
    before = render(msgs[:-1], tools, agp=True)
    turn = last[len(before) :] if last.startswith(before) else last
    turn_marker = msgs[-1]["content"]
    tail = turn[turn.rfind(turn_marker) + len(turn_marker) :] if turn_marker in turn else turn
    for piece, is_special in tokenizer.split_special(tail):
        if is_special:
            end_of_turn = piece
            break
    if end_of_turn is None and eos and eos in tail:
        end_of_turn = eos

    supports_reasoning = False
    reasoning_at = next((i for i, m in enumerate(msgs) if m.get("reasoning_content") == "Both read."), None)
    if reasoning_at is not None:
        supports_reasoning = "Both read." in render(msgs[: reasoning_at + 1], tools)

    default_system = None
    user_text = msgs[1]["content"]
    bare = render(msgs[1:2], None)
    head = bare.split(user_text)[0] if user_text in bare else ""
    for piece, is_special in tokenizer.split_special(head):
        text = piece.strip()
        if text.startswith("system\n"):
            text = text[len("system\n") :].strip()
        if not is_special and text and text not in ("system", "user", "assistant"):
            default_system = text
            break

    starts_with_bos = bool(bos) and full.startswith(bos)
    adds_bos = False
    hf = getattr(tokenizer, "hf", None)
    if hf is not None and bos and bos in specials:
        try:
            adds_bos = hf("x", add_special_tokens=True)["input_ids"][:1] == [specials[bos]]
        except Exception:  # pragma: no cover - backend quirks
            adds_bos = False
    return TemplateReport(
        template_id=template.id,
        tokenizer_id=getattr(tokenizer, "id", str(tokenizer)),
        prefix_preserving=decision_ok,
        message_prefix_preserving=message_ok,
        failed_transitions=tuple(failed),
        supports_tools=supports_tools,
        supports_reasoning=supports_reasoning,
        end_of_turn=end_of_turn,
        generation_prompt=generation_prompt,
        bos_token=bos if starts_with_bos else None,
        bos_duplication_risk=starts_with_bos and adds_bos,
        generation_markers=template.has_generation_markers,
        default_system_prompt=default_system,
        notes=tuple(notes),
    )
