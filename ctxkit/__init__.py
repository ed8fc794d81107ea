"""ctxkit: context management and compression for agent RL training.

Heavy dependencies (torch, transformers, faiss, sentence-transformers) load only when used, so
`import ctxkit` stays fast. Public names resolve lazily from the module listed in `_PUBLIC`.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC: dict[str, str] = {
    # L0
    "CtxkitError": "ctxkit.errors",
    "SCHEMA_VERSION": "ctxkit.events",
    "EpisodeStart": "ctxkit.events",
    "Message": "ctxkit.events",
    "Step": "ctxkit.events",
    "ToolCall": "ctxkit.events",
    "ToolResult": "ctxkit.events",
    "Pin": "ctxkit.events",
    "Unpin": "ctxkit.events",
    "Compaction": "ctxkit.events",
    "StateSnapshot": "ctxkit.events",
    "EpisodeEnd": "ctxkit.events",
    # L1
    "EventLog": "ctxkit.log",
    "load_tokenizer": "ctxkit.tokenizers",
    "load_template": "ctxkit.templates",
    "check_template": "ctxkit.template_check",
    # L2
    "View": "ctxkit.view",
    "build_view": "ctxkit.view",
    "ContextBuilder": "ctxkit.builder",
    "check_compressor": "ctxkit.compress.check",
    "make_compressor": "ctxkit.compress",
    # L3
    "render": "ctxkit.render",
    "IncrementalRenderer": "ctxkit.render",
    "RenderedContext": "ctxkit.render",
    "context_hash": "ctxkit.render",
    "encode_assistant_turn": "ctxkit.render",
    "samples": "ctxkit.samples",
    "replay": "ctxkit.replay",
    "resume": "ctxkit.replay",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'ctxkit' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    # `samples` and `replay` name both a module and its main function: the module is callable and
    # forwards to the function, so `import ctxkit.replay as m` and `ctxkit.replay(log, step=k)` both work.
    value = loaded if module == f"ctxkit.{name}" else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
