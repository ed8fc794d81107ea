"""`check_template`: probe a chat template's properties through a tokenizer (L1).

Renders a small probe conversation (every role transition, two tool calls in one turn, reasoning) and
reports prefix preservation, tool support, the end-of-turn token, BOS duplication risk, generation
markers and any default system prompt. `template_markers` condenses what the renderer needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ctxkit.errors import TemplateError
from ctxkit.templates import ChatTemplate, load_template


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


@dataclass(frozen=True)
class TemplateMarkers:
    """What the renderer needs to know about a template (cached per template and tokenizer)."""

    generation_prompt: str
    """Text the generation prompt appends (e.g. `<|im_start|>assistant\\n`); empty if none."""
    end_of_turn: str | None
    """Special-token text closing an assistant turn."""
    end_of_turn_id: int | None
    """Its id."""
    prefix_preserving: bool
    """`TemplateReport.prefix_preserving`."""
    markers: tuple[str, ...]
    """Special tokens inside the generation prompt and end-of-turn text."""


_MARKERS: dict[tuple[str, str], TemplateMarkers] = {}


def template_markers(tok, tpl: ChatTemplate) -> TemplateMarkers:
    """Generation prompt, end-of-turn token and prefix preservation of `tpl` through `tok` (cached)."""
    key = (tpl.sha256, tok.id)
    info = _MARKERS.get(key)
    if info is None:
        try:
            report = check_template(tok, tpl)
            gp, eot, pp = report.generation_prompt, report.end_of_turn, report.prefix_preserving
        except TemplateError:
            gp, eot, pp = "", tok.eos_token, False
        markers = tuple(
            sorted({p for p, special in tok.split_special(gp + (eot or "")) if special})
        )
        info = TemplateMarkers(gp, eot, tok.special_tokens.get(eot) if eot else None, pp, markers)
        _MARKERS[key] = info
    return info


def strings_in(value: Any) -> Iterable[str]:
    """Every string inside a nested dict/list value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from strings_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from strings_in(v)

