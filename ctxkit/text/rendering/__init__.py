"""Token-exact rendering: a conversation through a template and tokenizer into ids, a loss mask and
per-token provenance, incrementally as it grows or is cut.

Modules: `renderer` (render, IncrementalRenderer, encode_assistant_turn), `state` (RenderState, the
renderer's one mutable state), `window` (the rendered text: suffix window or whole render), `tokens`
(re-tokenizing after the last stable boundary), `mask` (assistant-turn regions and labels; `turn_find`: where a
turn lies), `output` (RenderedContext, context_hash, output assembly, the `history` modes), `drift_reasons` (the closed vocabulary
of why a sampled turn or a step's context does not extend what came before, and its classifier), `cut`
(cutting back to a prefix), `splice` (re-rendering a changed block), `segments` (per-segment caches). Imports `text/template/`, `text/tokenizer/`,
`text/chat_messages.py`, `text/special_tokens.py` and L0.
"""

from __future__ import annotations

from ctxkit.registry import lazy_face

_EXPORTS: dict[str, str] = {
    "render": "ctxkit.text.rendering.renderer",
    "IncrementalRenderer": "ctxkit.text.rendering.renderer",
    "encode_assistant_turn": "ctxkit.text.rendering.renderer",
    "RenderedContext": "ctxkit.text.rendering.output",
    "context_hash": "ctxkit.text.rendering.output",
    "DRIFT_REASONS": "ctxkit.text.rendering.drift_reasons",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
