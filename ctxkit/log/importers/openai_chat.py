"""OpenAI/HF chat files (`{"messages", "tools"?, "pins"?}` or a bare message list): one episode, read by
`conversation.import_conversation` unchanged.

A chat file records no end, so the import states one: `truncated`, cause `source_ended`, `unscored`: the
conversation stops in the file for a reason it does not say (it may have been cut, or still be going), and
nothing scored it. Stating it keeps `ctxkit audit` from reading the missing reward as a silent 0; building
and stepping ignore the end, so an imported conversation can still be continued.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from ctxkit.log.conversation import import_conversation
from ctxkit.errors import ImportFormatError, MessageFormatError
from ctxkit.events import EpisodeEnd
from ctxkit.log.importers.common import ImportedEpisode, Importer, SourceInfo, ending


def matches(obj: Any) -> bool:
    """A dict with a "messages" list (and no other format's keys), or a list of role-bearing dicts."""
    if isinstance(obj, Mapping):
        return isinstance(obj.get("messages"), list) and not {"history", "traj", "trajectory", "trajectory_format"} & set(obj)
    return isinstance(obj, list) and bool(obj) and all(isinstance(m, Mapping) and "role" in m for m in obj)


def read_entry(obj: Any, source: SourceInfo, tools: Sequence[Any] | None = None, document: Any = None) -> ImportedEpisode:
    """The file's one episode; `tools` (from `--tools`) replace the file's own when given."""
    if tools is not None:
        obj = {**obj, "tools": list(tools)} if isinstance(obj, Mapping) else {"messages": obj, "tools": list(tools)}
    try:
        events = import_conversation(obj)
    except MessageFormatError as exc:
        raise ImportFormatError(str(exc), path=source.path) from None
    start = events[0]
    events[0] = dataclasses.replace(start, metadata={**start.metadata, "import": source.to_dict()})
    end = ending()
    events.append(EpisodeEnd(outcome=end.outcome, cause=end.cause, reward=None, reward_kind=end.reward_kind))  # type: ignore[arg-type]
    return ImportedEpisode(entry_id="", events=tuple(events), source=source)


IMPORTER = Importer(name="openai", description='OpenAI/HF chat: {"messages", "tools"?, "pins"?} or a bare message list',
                    matches=matches, entries=lambda doc: [doc],
                    entry_problem=lambda doc: None if matches(doc) else "not a chat object or message list",
                    entry_id=lambda doc, index: "", read_entry=read_entry)
"""The `openai` entry of `IMPORTERS`."""
