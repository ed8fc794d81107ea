"""OpenAI/HF chat files (`{"messages", "tools"?, "pins"?}` or a bare message list): one episode, read by
`conversation.import_conversation` unchanged.

No `EpisodeEnd` is added: a conversation file records no end and may be continued (built, stepped).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from ctxkit.log.conversation import import_conversation
from ctxkit.errors import ImportFormatError, MessageFormatError
from ctxkit.log.importers.common import ImportedEpisode, Importer, SourceInfo


def matches(obj: Any) -> bool:
    """A dict with a "messages" list (and no other format's keys), or a list of role-bearing dicts."""
    if isinstance(obj, Mapping):
        return isinstance(obj.get("messages"), list) and not {"history", "traj", "trajectory"} & set(obj)
    return isinstance(obj, list) and bool(obj) and all(isinstance(m, Mapping) and "role" in m for m in obj)


def read(obj: Any, path: str, tools: Sequence[Any] | None = None) -> list[ImportedEpisode]:
    """The file's one episode; `tools` (from `--tools`) replace the file's own when given."""
    if tools is not None:
        obj = {**obj, "tools": list(tools)} if isinstance(obj, Mapping) else {"messages": obj, "tools": list(tools)}
    try:
        events = import_conversation(obj)
    except MessageFormatError as exc:
        raise ImportFormatError(str(exc), path=path) from None
    source = SourceInfo(path=path, format="openai", entry_id="", index=0)
    start = events[0]
    events[0] = dataclasses.replace(start, metadata={**start.metadata, "import": source.to_dict()})
    return [ImportedEpisode(entry_id="", events=tuple(events), source=source)]


IMPORTER = Importer(name="openai", description='OpenAI/HF chat: {"messages", "tools"?, "pins"?} or a bare message list',
                    matches=matches, read=read)
"""The `openai` entry of `IMPORTERS`."""
