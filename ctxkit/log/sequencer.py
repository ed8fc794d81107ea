"""The one sequencer of `EventLog` and `MemoryLog` (`stamp`): seq, content ids, checks, recorded copies.

Kept apart from `ctxkit.log.event_log` so both logs share it. It is the hot path of an append, so each event class gets
a plan once (`StampPlan`: field order, closed vocabularies, the measured-time field the id leaves out) and an
event of that class is stamped by `stamp_line` with no per-event introspection: its dict is read straight
from the instance, the vocabulary re-check is a set lookup per closed field, and its recorded copy is what a
reader of the file gets back, built without re-running the checks the event passed when it was made. A "flat"
event (every value a str, int, bool, finite float or None, or an empty container) reads back as the same
values, so its copy takes them without parsing its line (fresh empty containers: nothing mutable is shared
with the caller); any other event's copy is built from the JSON round trip of its line. Anything the plan does
not cover (a subclass, tool calls, edits, a forced field) takes the general path. Both give the same bytes,
ids and copies as `events.event_to_dict` / `event_id` / `event_from_dict` (tests/log/test_log_stamp.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, Iterable

import orjson

from ctxkit.errors import ConfigError
from ctxkit.events import (CLOSED_FIELDS, EVENT_TYPES, OMITTED_WHEN_NONE, Event, check_choice, check_vocabulary,
                           event_from_dict, event_to_dict)
from ctxkit.log.file_format import check_finite, json_error

_EVENT_CLASSES = tuple(EVENT_TYPES.values())
_SORT = orjson.OPT_SORT_KEYS
_sha256 = hashlib.sha256
__all__ = ["StampPlan", "event_dict", "plan_for", "recorded_copy", "stamp", "stamp_line", "stamp_lines", "unserializable"]

_MEASURED = {"step": ("timings", {}), "tool_result": ("duration_s", None)}
"""Event kind -> the measured-time field `events.event_id` leaves out, and the value it hashes instead."""

_SEQUENCES = frozenset({"content", "tools", "token_ids", "logprobs", "raw_logprobs", "tool_calls", "edits"})
"""Fields an event declares as tuples (`content` may be a tuple of parts)."""

_PLAIN_SEQUENCES = frozenset({"tools", "token_ids", "logprobs", "raw_logprobs"})
"""Tuple fields a reader builds as `tuple(json list)` (`events.event_from_dict`), with nothing to convert."""


@dataclass(frozen=True, slots=True)
class StampPlan:
    """What stamping an event of one class needs, computed once per class (`plan_for`)."""

    kind: str
    """The class's `kind` tag."""
    names: tuple[str, ...]
    """Field names in declaration order (`omitted` ones left out): the order of the event's dict and of its line."""
    closed: tuple[tuple[str, frozenset, tuple, bool], ...]
    """Closed-vocabulary fields: (name, allowed values, the same as a tuple, None allowed)."""
    sequences: tuple[str, ...]
    """Fields declared as tuples (`content` included): the ones whose value may become a JSON list."""
    measured: tuple[str, Any] | None
    """The measured-time field the id leaves out and the value hashed in its place, if the kind has one."""
    omitted: tuple[str, ...] = ()
    """Fields left out of the dict when None (`events.OMITTED_WHEN_NONE`); set, they take the general path."""


_PLANS: dict[type, StampPlan] = {}


def plan_for(cls: type) -> StampPlan:
    """The (cached) `StampPlan` of an event class from `events.EVENT_TYPES` (or a subclass of one)."""
    plan = _PLANS.get(cls)
    if plan is None:
        kind = cls.__dataclass_fields__["kind"].default
        omitted = OMITTED_WHEN_NONE.get(kind, ())
        names = tuple(f.name for f in dataclasses.fields(cls) if f.name not in omitted)
        plan = StampPlan(kind=kind, names=names, omitted=omitted,
                         closed=tuple((name, frozenset(allowed), allowed, optional)
                                      for name, allowed, optional in CLOSED_FIELDS.get(kind, ())),
                         sequences=tuple(n for n in names if n in _SEQUENCES),
                         measured=_MEASURED.get(kind))
        _PLANS[cls] = plan
    return plan


def stamp(events: Iterable[Event], first_seq: int, ts: float) -> list[tuple[Event, dict[str, Any], bytes]]:
    """The one sequencer of `EventLog` and `MemoryLog`: check each new event (an event type, `seq` and `id`
    still None, closed vocabularies, JSON-able and finite), give it `seq` (from `first_seq`), its id
    (`events.event_id`) and `ts` (unless it has one). Returns `(recorded copy, its dict, its JSON line body)`
    per event; the recorded copy is the JSON round trip, exactly what a reader of the file gets back.
    `ConfigError` (or `EventFormatError` for a forced closed field) names the event."""
    out = []
    for i, event in enumerate(events):
        recorded, as_dict, body, _ = _stamp(event, first_seq + i, ts, i)
        out.append((recorded, as_dict, body))
    return out


def stamp_line(event: Event, seq: int, ts: float, prev: str) -> tuple[Event, bytes, str]:
    """Stamp one event as `stamp` does and chain it after the line hashed `prev`: returns the recorded copy,
    its whole log line (the body, then `prev` and `hash`, and a newline) and its hash (`file_format.line_hash`)."""
    recorded, _, body, canon = _stamp(event, seq, ts, 0, False)
    before = prev.encode()
    digest = _sha256(before + canon).hexdigest()
    return recorded, b"".join((body[:-1], b',"prev":"', before, b'","hash":"', digest.encode(), b'"}\n')), digest


def stamp_lines(events: list, first_seq: int, ts: float, prev: str) -> tuple[list, bytes, str]:
    """`stamp_line` over several events chained one after another: (recorded copies, all their lines as one
    payload, the last line's hash). Nothing is returned unless every event stamps (all or none)."""
    recorded, lines = [], []
    for i, event in enumerate(events):
        copy, _, body, canon = _stamp(event, first_seq + i, ts, i, False)
        before = prev.encode()
        prev = _sha256(before + canon).hexdigest()
        lines.append(b"".join((body[:-1], b',"prev":"', before, b'","hash":"', prev.encode(), b'"}\n')))
        recorded.append(copy)
    return recorded, b"".join(lines), prev


def _stamp(event: Any, seq: int, ts: float, index: int, keep: bool = True) -> tuple[Event, dict[str, Any], bytes, bytes]:
    """(recorded copy, dict, line body in field order, canonical bytes the line hash covers) of one event.
    With `keep` False the caller drops the dict, so a flat event's copy may take it over."""
    cls = type(event)
    plan = _PLANS.get(cls)
    if plan is None:
        if not isinstance(event, _EVENT_CLASSES):
            raise ConfigError(f"event {index}: {cls.__name__} is not an event type {sorted(EVENT_TYPES)}")
        plan = plan_for(cls)  # a subclass of an event type
    as_dict = event.__dict__.copy()
    for name in plan.omitted:  # left out when None (the bytes and id an event without it always had)
        if as_dict.get(name, None) is not None:
            check_vocabulary(event)
            return _stamp_general(event, seq, ts, event_dict(event))
        as_dict.pop(name, None)
    if as_dict["seq"] is not None or as_dict["id"] is not None:
        raise ConfigError(f"event {index} ({event.kind}) already has seq={event.seq!r}, id={event.id!r}; "
                          "append events you built (seq and id None), not recorded ones")
    if as_dict["kind"] != plan.kind or tuple(as_dict) != plan.names:  # a forced kind or field: the general path
        check_vocabulary(event)
        return _stamp_general(event, seq, ts, event_dict(event))
    for name, allowed, values, optional in plan.closed:  # the constructor's check, again (a frozen field can be forced)
        value = as_dict[name]
        if not (type(value) is str and value in allowed) and not (value is None and optional):
            check_choice(plan.kind, name, value, values, optional=optional)
    # One pass over the values: tuples become lists (`event_to_dict`), and the event is "flat" when every value
    # reads back from JSON as itself (a str, int, bool, finite float or None) or as an empty container.
    flat, empty = True, None
    for name, value in as_dict.items():
        kind = type(value)
        if kind is str or value is None or kind is int or kind is bool:
            continue
        if kind is float:
            if value - value != 0.0:  # NaN or an infinity: refused below
                flat = False
            continue
        if isinstance(value, tuple):
            if value and (name == "tool_calls" or name == "edits"):
                return _stamp_general(event, seq, ts, event_to_dict(event))
            as_dict[name] = list(value)
            if value or kind is not tuple or name not in plan.sequences:
                flat = False
                continue
        elif value or (kind is not dict and kind is not list):
            flat = False
            continue
        empty = (name,) if empty is None else (*empty, name)
    measured = plan.measured
    try:
        if measured is not None:  # the id hashes the dict with ts and the measured time blanked
            field, blank = measured
            given_ts, kept = as_dict["ts"], as_dict[field]
            as_dict["ts"], as_dict[field] = None, blank
            timeless = orjson.dumps(as_dict, option=_SORT)
            as_dict[field] = kept
        else:
            given_ts = as_dict["ts"]
            if given_ts is not None:
                as_dict["ts"] = None
            timeless = orjson.dumps(as_dict, option=_SORT)
        as_dict["seq"] = seq
        as_dict["id"] = f"e{seq}-{_sha256(timeless).hexdigest()[:8]}"
        as_dict["ts"] = ts if given_ts is None else given_ts
        body = orjson.dumps(as_dict)  # the line keeps the caller's key order (tool schemas render in that order)
        canon = orjson.dumps(as_dict, option=_SORT)
    except orjson.JSONEncodeError as exc:
        raise unserializable(as_dict, f"event {seq} ({plan.kind})", exc) from None
    if not flat:
        loaded = orjson.loads(body)
        if loaded != as_dict:  # NaN/inf (orjson writes null)
            check_finite(as_dict, f"event {seq} ({plan.kind})")
        return recorded_copy(event, loaded), as_dict, body, canon
    state = as_dict.copy() if keep else as_dict  # a flat event reads back as the same values (fresh empty containers)
    if empty is not None:
        for name in empty:
            state[name] = () if name in plan.sequences else type(state[name])()
    for name in plan.omitted:
        state[name] = None
    copy = object.__new__(cls)
    object.__setattr__(copy, "__dict__", state)
    return copy, as_dict, body, canon


def _fill(as_dict: dict[str, Any], seq: int, ts: float, kind: str, measured: tuple[str, Any] | None) -> tuple[bytes, bytes]:
    """Fill seq, id (`events.event_id`: measured times left out) and ts into `as_dict`, in place; returns its
    line body (field order) and canonical bytes (sorted keys). `ConfigError` when it is not JSON."""
    given_ts = as_dict["ts"]
    try:
        if measured is not None and measured[0] in as_dict:  # hash the dict with the measured time blanked
            name, blank = measured
            value, as_dict[name], as_dict["ts"] = as_dict[name], blank, None
            try:
                timeless = orjson.dumps(as_dict, option=_SORT)
            finally:
                as_dict[name], as_dict["ts"] = value, given_ts
        elif given_ts is None:
            timeless = orjson.dumps(as_dict, option=_SORT)  # seq, id and ts are all None: what the id hashes
        else:
            timeless = orjson.dumps(dict(as_dict, ts=None), option=_SORT)
        as_dict["seq"] = seq
        as_dict["id"] = f"e{seq}-{_sha256(timeless).hexdigest()[:8]}"
        if given_ts is None:
            as_dict["ts"] = ts
        return orjson.dumps(as_dict), orjson.dumps(as_dict, option=_SORT)  # the line keeps the caller's key order
    except orjson.JSONEncodeError as exc:
        raise unserializable(as_dict, f"event {seq} ({kind})", exc) from None


def unserializable(as_dict: dict[str, Any], where: str, exc: Exception) -> ConfigError:
    """`file_format.json_error` for an event dict orjson refused (`exc`), naming the field: text that is not
    UTF-8 by its dotted place (`where: extra.path is not UTF-8 text`), another value by the innermost list
    item or dict value that fails (`where.metadata.tags is not JSON-serializable`)."""
    if "surrogates not allowed" in str(exc):
        return json_error(as_dict, where, exc)
    value: Any = as_dict
    while isinstance(value, (dict, list, tuple)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            try:
                orjson.dumps(item)
            except orjson.JSONEncodeError as inner:
                where, value, exc = (f"{where}.{key}" if isinstance(value, dict) else f"{where}[{key}]"), item, inner
                break
        else:
            break  # no single item fails (e.g. a key that is not a str): the container is the place
    return json_error(value, where, exc)


def _stamp_general(event: Any, seq: int, ts: float, as_dict: dict[str, Any]) -> tuple[Event, dict[str, Any], bytes, bytes]:
    """The general path: an event its class's plan does not cover, its dict already built."""
    body, canon = _fill(as_dict, seq, ts, event.kind, _MEASURED.get(event.kind))
    loaded = orjson.loads(body)
    if loaded != as_dict:  # orjson writes NaN/inf as null: the round trip differs (or tuples became lists)
        check_finite(as_dict, f"event {seq} ({event.kind})")
    return recorded_copy(event, loaded), as_dict, body, canon


def recorded_copy(event: Event, loaded: dict[str, Any]) -> Event:
    """`events.event_from_dict(loaded)`, where `loaded` is the JSON round trip of `event` filled in: the same
    event. When no field needs converting (no non-empty list: tool calls, token ids, content parts), it is
    built without re-running the checks `event` passed when it was made (its values equal `loaded`'s)."""
    for name in OMITTED_WHEN_NONE.get(event.kind, ()):
        if loaded.get(name) is not None:  # a record to rebuild (a `KeptSet`)
            return event_from_dict(loaded)
    for key, value in loaded.items():
        if type(value) is list:
            if key in _PLAIN_SEQUENCES:  # what `events.event_from_dict` does with them
                loaded[key] = tuple(value)
                continue
            if value or key == "content":
                return event_from_dict(loaded)
            loaded[key] = ()  # every list-valued field is a tuple field (`events.event_from_dict`)
    if not hasattr(event, "__dict__"):  # pragma: no cover - events are plain frozen dataclasses
        return event_from_dict(loaded)
    copy = object.__new__(type(event))
    copy.__dict__.update(loaded)
    for name in OMITTED_WHEN_NONE.get(event.kind, ()):
        copy.__dict__.setdefault(name, None)
    return copy


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def event_dict(event: Event) -> dict[str, Any]:
    """`events.event_to_dict(event)`, computed faster (field names cached per class); the same dict."""
    names = _FIELD_NAMES.get(type(event))
    if names is None:
        names = _FIELD_NAMES[type(event)] = tuple(f.name for f in dataclasses.fields(event))
    if any(getattr(event, name) is not None for name in OMITTED_WHEN_NONE.get(event.kind, ())):
        return event_to_dict(event)
    omitted = OMITTED_WHEN_NONE.get(event.kind, ())
    out: dict[str, Any] = {}
    for name in names:
        if name in omitted:
            continue
        value = getattr(event, name)
        if isinstance(value, tuple):
            if value and (name == "tool_calls" or name == "edits"):
                return event_to_dict(event)
            value = list(value)
        out[name] = value
    return out


for _cls in _EVENT_CLASSES:
    plan_for(_cls)
