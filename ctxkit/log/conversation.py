"""OpenAI-format conversations <-> events: `import_conversation`, `export_messages`, `export_conversation`.

A conversation is `{"messages": [...], "tools": [...], "pins": [...]}` (other top-level keys are kept) or a
bare message list. Import validates it (unknown role, tool message answering no earlier call, content outside
the one content rule of `ctxkit.content`: images are refused) and export gives it back unchanged (text parts
stay parts; every renderer flattens them the same way): the round trip is lossless for messages in the OpenAI shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, Union

import orjson

from ctxkit.errors import LogFormatError, MessageFormatError, ToolPairingError
from ctxkit.events import EpisodeStart, Event, Message, Pin, Step, ToolResult, Unpin, message_from_openai, message_to_openai


class HasEvents(Protocol):
    """Anything that lists its events in order, e.g. an `EventLog` or a `MemoryLog` (typed by this protocol
    rather than by importing `ctxkit.log.event_log`, which imports this module: no import cycle)."""

    def events(self) -> Sequence[Event]:
        """Every event, in order."""
        ...


EventSource = Union[HasEvents, Sequence[Event]]
"""A log (`HasEvents`) or a sequence of events."""


def import_conversation(obj: Any, *, episode_id: str = "") -> list[Event]:
    """Events (unrecorded) for an OpenAI-format conversation: `{"messages", "tools"?, "pins"?}` or a bare
    message list. Gives an `EpisodeStart` (tools; other top-level keys kept in its metadata), one `Pin` per
    pin (a string or `{"text", "pin_id"?}`), then one `Message` per message."""
    if isinstance(obj, list):
        messages, tools, pins, extra = obj, [], [], {}
    elif isinstance(obj, Mapping):
        if not isinstance(obj.get("messages"), list):
            raise MessageFormatError('conversation: an object needs a "messages" list')
        messages, tools, pins = obj["messages"], obj.get("tools") or [], obj.get("pins") or []
        extra = {k: v for k, v in obj.items() if k not in ("messages", "tools", "pins")}
    else:
        raise MessageFormatError(f"conversation: expected an object or a list of messages, got {type(obj).__name__}")
    if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
        raise MessageFormatError('conversation: "tools" must be a list of tool schema objects')
    if not isinstance(pins, list):
        raise MessageFormatError('conversation: "pins" must be a list')
    out: list[Event] = [EpisodeStart(episode_id=episode_id, tools=tuple(tools),
                                     metadata={"conversation_extra": extra} if extra else {})]
    seen_pins: set[str] = set()
    for j, pin in enumerate(pins):
        if isinstance(pin, str):
            text, pin_id = pin, f"pin-{j}"
        elif isinstance(pin, Mapping):
            unknown = set(pin) - {"text", "pin_id"}
            if unknown:
                raise MessageFormatError(f"pins[{j}]: unknown key(s) {sorted(unknown)}; a pin is {{'text', 'pin_id'?}}")
            text, pin_id = pin.get("text"), pin.get("pin_id", f"pin-{j}")
        else:
            raise MessageFormatError(f"pins[{j}]: expected a string or an object, got {type(pin).__name__}")
        if not isinstance(text, str) or not text:
            raise MessageFormatError(f"pins[{j}]: the pin text must be a non-empty string")
        if not isinstance(pin_id, str) or not pin_id or pin_id in seen_pins:
            raise MessageFormatError(f"pins[{j}]: pin_id {pin_id!r} is not a new non-empty string")
        seen_pins.add(pin_id)
        out.append(Pin(pin_id=pin_id, text=text, rule="explicit"))
    called: set[str] = set()
    for i, msg in enumerate(messages):
        message = message_from_openai(msg, where=f"messages[{i}]")
        if message.role == "tool" and message.tool_call_id not in called:
            raise ToolPairingError(f"messages[{i}]: tool message answers tool_call_id {message.tool_call_id!r}, "
                                   "which no earlier assistant message called (orphaned result)",
                                   problem="orphaned_result", event=f"messages[{i}]", call_id=message.tool_call_id)
        called.update(tc.id for tc in message.tool_calls)
        out.append(message)
    return out


def _events_of(events: EventSource) -> Sequence[Event]:
    """A log (anything with an `events()` method) or a sequence of events -> the events."""
    method = getattr(events, "events", None)
    return method() if callable(method) else events


def export_messages(events: EventSource) -> list[dict[str, Any]]:
    """The OpenAI message list of a log: every `Message`, `Step` (as assistant) and `ToolResult` (as tool)."""
    return [message_to_openai(e) for e in _events_of(events) if isinstance(e, (Message, Step, ToolResult))]


def export_conversation(events: EventSource) -> dict[str, Any]:
    """`{"messages", "tools", "pins"}` plus the top-level keys an import kept; the inverse of
    `import_conversation`. Pins are those in force at the end: a plain string where re-importing would give
    the same id (`pin-<index>`), else `{"pin_id", "text"}`."""
    events = _events_of(events)
    start = next((e for e in events if isinstance(e, EpisodeStart)), None)
    pins: dict[str, str] = {}
    for e in events:
        if isinstance(e, Pin):
            pins[e.pin_id] = e.text
        elif isinstance(e, Unpin):
            pins.pop(e.pin_id, None)
    out: dict[str, Any] = dict(start.metadata.get("conversation_extra", {})) if start else {}
    out.update(messages=export_messages(events), tools=[dict(t) for t in start.tools] if start else [],
               pins=[v if k == f"pin-{j}" else {"pin_id": k, "text": v} for j, (k, v) in enumerate(pins.items())])
    return out


def load_conversation(path) -> Any:
    """Parse a conversation JSON file; invalid JSON is a `LogFormatError` naming the file, line and column."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LogFormatError(f"cannot read: {exc.strerror}", path=str(path)) from None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise LogFormatError(f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}, byte {exc.pos})",
                             path=str(path), line=exc.lineno) from None
