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
    "MemoryLog": "ctxkit.log",
    "iter_events": "ctxkit.log",
    "load_tokenizer": "ctxkit.tokenizers",
    "load_template": "ctxkit.templates",
    "read_episodes": "ctxkit.importers",
    "check_template": "ctxkit.template_check",
    # L2
    "View": "ctxkit.view",
    "build_view": "ctxkit.view",
    "make_compressor": "ctxkit.compress",
    # L3
    "ContextBuilder": "ctxkit.builder",
    "check_compressor": "ctxkit.compressor_check",
    "render": "ctxkit.rendering",
    "IncrementalRenderer": "ctxkit.rendering",
    "RenderedContext": "ctxkit.rendering",
    "context_hash": "ctxkit.rendering",
    "encode_assistant_turn": "ctxkit.rendering",
    "samples": "ctxkit.training_samples",
    "compressed_samples": "ctxkit.training_samples",
    "add_offline_steps": "ctxkit.offline_steps",
    "replay": "ctxkit.log_replay",
    "resume": "ctxkit.log_replay",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'ctxkit' has no attribute {name!r}")
    # No public name is also a submodule's name (the modules are `rendering`, `training_samples`,
    # `log_replay`), so importing any submodule never rebinds a public function to a module.
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
