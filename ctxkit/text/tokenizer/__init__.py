"""Tokenizers: one `Tokenizer` face over Hugging Face tokenizer folders and tiktoken encodings, read offline.

Modules: `loader` (Tokenizer, load_tokenizer), `hf_files` (a tokenizer folder through `tokenizers` alone),
`tiktoken_files` (tiktoken rank files with ChatML specials), `pieces` (each token's text in context).
"""

from __future__ import annotations

from ctxkit.registry import lazy_face

_EXPORTS: dict[str, str] = {
    "Tokenizer": "ctxkit.text.tokenizer.loader",
    "load_tokenizer": "ctxkit.text.tokenizer.loader",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
