"""The episode log: append-only, hash-chained, crash-safe JSONL of typed events, and the importers of
other agents' recorded trajectories.

Modules: `event_log` (EventLog, MemoryLog), `protocols` (`ReadableLog`, `EpisodeLog`: what both offer), `file_format` (line format, verify, repair, readers),
`sequencer` (seq and content ids), `locks` (writers' locks), `file_writes` (atomic writes),
`conversation` (OpenAI chats <-> events), `state` (external-state blobs), `importers/`. Imports only the
L0 modules (events, edits, errors, content, registry); `text/` is a sibling it never imports.
"""

from __future__ import annotations

from ctxkit.registry import lazy_face

_EXPORTS: dict[str, str] = {
    "EpisodeLog": "ctxkit.log.protocols",
    "EventLog": "ctxkit.log.event_log",
    "ReadableLog": "ctxkit.log.protocols",
    "MemoryLog": "ctxkit.log.event_log",
    "iter_events": "ctxkit.log.file_format",
    "read_events": "ctxkit.log.file_format",
    "verify": "ctxkit.log.file_format",
    "repair": "ctxkit.log.file_format",
    "VerifyReport": "ctxkit.log.file_format",
    "RepairReport": "ctxkit.log.file_format",
    "import_conversation": "ctxkit.log.conversation",
    "export_messages": "ctxkit.log.conversation",
    "export_conversation": "ctxkit.log.conversation",
    "read_episodes": "ctxkit.log.importers",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
