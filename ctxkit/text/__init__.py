"""Text: messages to exact token ids. `tokenizer/` <- `template/` <- `rendering/`, with `chat_messages`
(OpenAI message validation) and `special_tokens` (special-token text inside content) beside them, and
`vendor/` (mistral-common and openai-harmony as second oracles and as `render(..., template="vendor:...")`).

A sibling of `log/`: neither imports the other. This face names the entry points of all three.
"""

from __future__ import annotations

from ctxkit.registry import lazy_face

_EXPORTS: dict[str, str] = {
    "Tokenizer": "ctxkit.text.tokenizer.loader",
    "load_tokenizer": "ctxkit.text.tokenizer.loader",
    "ChatTemplate": "ctxkit.text.template.chat_template",
    "load_template": "ctxkit.text.template.chat_template",
    "check_template": "ctxkit.text.template.check",
    "render": "ctxkit.text.rendering.renderer",
    "IncrementalRenderer": "ctxkit.text.rendering.renderer",
    "encode_assistant_turn": "ctxkit.text.rendering.renderer",
    "RenderedContext": "ctxkit.text.rendering.output",
    "context_hash": "ctxkit.text.rendering.output",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
