"""Context: what the policy sees. The view rebuilt from the log, compressors and pins, and the builder that
renders a view into exact ids with every invariant checked.

Modules: `view` and `view_records` (View, ViewMessage, provenance), `pairing`, `pins` and `constraints`,
`compress/` (the compressor registry), `summarizers`, `embeddings`, `embedding_cache`, `models` (LM and
embedder loaders), `render_cache` (views rendered for the builder), `builder` (ContextBuilder, rebuild),
`compressor_check` (check_compressor). Imports `log/`, `text/` and L0.
"""

from __future__ import annotations

from ctxkit.registry import lazy_face

_EXPORTS: dict[str, str] = {
    "View": "ctxkit.context.view_records",
    "ViewMessage": "ctxkit.context.view_records",
    "build_view": "ctxkit.context.view",
    "ContextBuilder": "ctxkit.context.builder",
    "BuiltContext": "ctxkit.context.builder",
    "rebuild": "ctxkit.context.builder",
    "COMPRESSORS": "ctxkit.context.compress",
    "make_compressor": "ctxkit.context.compress",
    "check_compressor": "ctxkit.context.compressor_check",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
