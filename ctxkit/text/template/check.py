"""`check_template`: probe a chat template's properties through a tokenizer.

Renders a small probe conversation (every role transition, two tool calls in one turn, reasoning) and
reports prefix preservation, tool support, the end-of-turn token, BOS duplication risk, generation
markers and any default system prompt: the template's `TemplateProfile` (`ctxkit.text.template.profile`,
where the probing lives), as a report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ctxkit.errors import TemplateError
from ctxkit.text.template.profile import probe_conversation, template_profile
from ctxkit.text.template.chat_template import ChatTemplate, load_template


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
        return asdict(self)


def check_template(tokenizer, template: ChatTemplate | str | None = None) -> TemplateReport:
    """Probe a template: prefix preservation per role transition, tool support, end-of-turn, BOS risk, ...

    The facts are the template's `TemplateProfile` (cached); a template that rejects the probe
    conversation is a `TemplateError`."""
    template = load_template(template, tokenizer)
    p = template_profile(tokenizer, template)
    if p.probe_error is not None:
        raise TemplateError(p.probe_error)
    return TemplateReport(
        template_id=p.template_id,
        tokenizer_id=p.tokenizer_id,
        prefix_preserving=p.prefix_preserving,
        message_prefix_preserving=p.message_prefix_preserving,
        failed_transitions=p.failed_transitions,
        supports_tools=p.supports_tools,
        supports_reasoning=p.supports_reasoning,
        end_of_turn=p.end_of_turn,
        generation_prompt=p.generation_prompt,
        bos_token=p.bos_token,
        bos_duplication_risk=p.bos_duplication_risk,
        generation_markers=p.generation_markers,
        default_system_prompt=p.default_system_prompt,
        notes=p.notes,
    )


__all__ = ["TemplateReport", "check_template", "probe_conversation"]
