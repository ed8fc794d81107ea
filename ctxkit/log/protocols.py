"""What both logs offer (`EventLog`, `MemoryLog`), declared once: `ReadableLog` for readers (replay, samples),
`EpisodeLog` for what records to a log (`ContextBuilder.build` appends pins and compactions). Runtime-checkable
protocols: `isinstance(x, EpisodeLog)` tells a log from a plain sequence of events.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Protocol, runtime_checkable

from ctxkit.events import Event

__all__ = ["EpisodeLog", "ReadableLog"]


@runtime_checkable
class ReadableLog(Protocol):
    """What a reader of either log uses (`EventLog`, `MemoryLog`): the events in order, their count and
    iteration over them."""

    def events(self) -> tuple[Event, ...]:
        """Every event recorded so far, in order."""
        ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Event]: ...


@runtime_checkable
class EpisodeLog(ReadableLog, Protocol):
    """A log that also records (`EventLog`, `MemoryLog`): what `ContextBuilder.build` appends pins and
    compactions to. Both stamp events with one sequencer, so the recorded copies are equal."""

    def append(self, event: Event) -> Event:
        """Record one event; return the recorded copy (seq, id and ts filled)."""
        ...

    def extend(self, events: Iterable[Event]) -> list[Event]:
        """Record several events, all or none; return the recorded copies."""
        ...
