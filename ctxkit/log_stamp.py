"""The one sequencer of `EventLog` and `MemoryLog` (`stamp`): seq, content ids, checks, recorded copies (Layer L1).

Kept apart from `ctxkit.log` so both logs share it; it is the hot path of an append, so it builds each
event's dict once (`event_dict`, field names cached per class) and its recorded copy without re-running the
checks the event passed when it was made (`recorded_copy`).

L1: imports L0 (`events`, `errors`) and `logfile`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Iterable

import orjson

from ctxkit.errors import ConfigError
from ctxkit.events import EVENT_TYPES, Event, check_vocabulary, event_from_dict, event_to_dict
from ctxkit.logfile import canonical, check_finite

_EVENT_CLASSES = tuple(EVENT_TYPES.values())
__all__ = ["event_dict", "recorded_copy", "stamp"]


def stamp(events: Iterable[Event], first_seq: int, ts: float) -> list[tuple[Event, dict[str, Any], bytes]]:
    """The one sequencer of `EventLog` and `MemoryLog`: check each new event (an event type, `seq` and `id`
    still None, JSON-able and finite), give it `seq` (from `first_seq`), its id (`events.event_id`) and `ts`
    (unless it has one). Returns `(recorded copy, its dict, its JSON line body)` per event; the recorded copy
    is the JSON round trip, exactly what a reader of the file gets back. `ConfigError` names the event."""
    out = []
    for i, event in enumerate(events):
        if not isinstance(event, _EVENT_CLASSES):
            raise ConfigError(f"event {i}: {type(event).__name__} is not an event type {sorted(EVENT_TYPES)}")
        if event.seq is not None or event.id is not None:
            raise ConfigError(f"event {i} ({event.kind}) already has seq={event.seq!r}, id={event.id!r}; "
                              "append events you built (seq and id None), not recorded ones")
        check_vocabulary(event)
        seq = first_seq + len(out)
        where = f"event {seq} ({event.kind})"
        as_dict = event_dict(event)
        timeless = dict(as_dict, seq=None, id=None, ts=None)  # what `events.event_id` hashes
        if "timings" in timeless and event.kind == "step":
            timeless["timings"] = {}
        elif "duration_s" in timeless and event.kind == "tool_result":
            timeless["duration_s"] = None
        try:
            digest = hashlib.sha256(canonical(timeless)).hexdigest()
        except orjson.JSONEncodeError as exc:
            raise ConfigError(f"{where} is not JSON-serializable: {exc}") from None
        as_dict["seq"], as_dict["id"] = seq, f"e{seq}-{digest[:8]}"
        if as_dict["ts"] is None:
            as_dict["ts"] = ts
        try:
            body = orjson.dumps(as_dict)  # the caller's key order (tool schemas render in that order)
        except orjson.JSONEncodeError as exc:
            raise ConfigError(f"{where} is not JSON-serializable: {exc}") from None
        loaded = orjson.loads(body)
        if loaded != as_dict:  # orjson writes NaN/inf as null: the round trip differs (or tuples became lists)
            check_finite(as_dict, where)
        out.append((recorded_copy(event, loaded), as_dict, body))
    return out


def recorded_copy(event: Event, loaded: dict[str, Any]) -> Event:
    """`events.event_from_dict(loaded)`, where `loaded` is the JSON round trip of `event` filled in: the same
    event. When no field needs converting (no non-empty list: tool calls, token ids, content parts), it is
    built without re-running the checks `event` passed when it was made (its values equal `loaded`'s)."""
    for key, value in loaded.items():
        if type(value) is list:
            if value or key == "content":
                return event_from_dict(loaded)
            loaded[key] = ()  # every list-valued field is a tuple field (`events.event_from_dict`)
    if not hasattr(event, "__dict__"):  # pragma: no cover - events are plain frozen dataclasses
        return event_from_dict(loaded)
    copy = object.__new__(type(event))
    copy.__dict__.update(loaded)
    return copy


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def event_dict(event: Event) -> dict[str, Any]:
    """`events.event_to_dict(event)`, computed faster (field names cached per class); the same dict."""
    names = _FIELD_NAMES.get(type(event))
    if names is None:
        names = _FIELD_NAMES[type(event)] = tuple(f.name for f in dataclasses.fields(event))
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(event, name)
        if isinstance(value, tuple):
            if value and (name == "tool_calls" or name == "edits"):
                return event_to_dict(event)
            value = list(value)
        out[name] = value
    return out


# ---------------------------------------------------------------------------------------------- the logs
