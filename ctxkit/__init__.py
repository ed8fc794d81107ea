"""ctxkit: context management and compression for agent RL training.

Heavy dependencies (torch, transformers, faiss, sentence-transformers) load only when used, so
`import ctxkit` stays fast. Public names resolve lazily from the module listed in `_PUBLIC` (each also on its package's face:
`ctxkit.log`, `ctxkit.text`, `ctxkit.context`, `ctxkit.training`).
"""

from __future__ import annotations

from ctxkit.registry import lazy_face

__version__ = "0.1.0"

_PUBLIC: dict[str, str] = {
    # L0 (events, errors)
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
    # log/
    "EventLog": "ctxkit.log.event_log",
    "MemoryLog": "ctxkit.log.event_log",
    "iter_events": "ctxkit.log.event_log",
    "read_episodes": "ctxkit.log.importers",
    # text/
    "load_tokenizer": "ctxkit.text.tokenizer.loader",
    "load_template": "ctxkit.text.template.chat_template",
    "check_template": "ctxkit.text.template.check",
    "render": "ctxkit.text.rendering.renderer",
    "IncrementalRenderer": "ctxkit.text.rendering.renderer",
    "RenderedContext": "ctxkit.text.rendering.renderer",
    "context_hash": "ctxkit.text.rendering.renderer",
    "encode_assistant_turn": "ctxkit.text.rendering.renderer",
    # context/
    "View": "ctxkit.context.view",
    "build_view": "ctxkit.context.view",
    "make_compressor": "ctxkit.context.compress",
    "ContextBuilder": "ctxkit.context.builder",
    "check_compressor": "ctxkit.context.compressor_check",
    # training/
    "samples": "ctxkit.training.episode_samples",
    "compressed_samples": "ctxkit.training.episode_samples",
    "add_offline_steps": "ctxkit.training.offline_steps",
    "replay": "ctxkit.training.context_replay",
    "resume": "ctxkit.training.context_replay",
}

__all__ = sorted(_PUBLIC) + ["__version__"]
__getattr__, __dir__ = lazy_face(__name__, _PUBLIC)
