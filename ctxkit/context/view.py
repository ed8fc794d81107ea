"""The view: what the policy sees at one decision point, rebuilt purely from the event log.

`build_view(events, upto_seq)` turns chat-shaped events into messages (a `Message` as is, a `Step` as an
assistant message carrying its sampled `token_ids`, a `ToolResult` as a tool message), takes the tools
from `EpisodeStart`, the active pins from `Pin`/`Unpin`, and applies every recorded `Compaction`'s edits
in log order, at the point of the log where the compaction was recorded. It never re-runs a compressor,
so a rebuild from a saved log is exact.

Edits are the typed records of `ctxkit.edits`, applied in order:

- `DropEdit(event_ids)`: remove every message whose provenance names one of the ids.
- `MaskEdit(event_id, text)`: replace the content of the message of that event by a placeholder (which
  names the event id and its original size in tokens). Provenance becomes `masked`.
- `TruncateEdit(event_id, text)`: replace the content by a shortened text. Provenance becomes `truncated`.
- `SummaryEdit(event_ids, text, role)`: remove the messages covering any of the ids and insert one summary
  message (provenance `summary`, naming every covered id) where the first removed message was.
- `RetrievedEdit(event_ids, text, scores, role)`: remove any earlier retrieved block and insert this one
  (provenance `retrieved`) just before the newest turn: the newest user message, or the assistant message
  whose tool calls the trailing tool results answer (or that ends the view with calls still pending), so
  calls and results stay adjacent.

Pairing (`ctxkit.context.pairing.pairing_problems`, importable from here too): a tool result with no call before
it is an orphaned result (refused already when the view is built), a second result for an answered call a
duplicated result, a call followed by a later turn without its result an unanswered call; the calls of
the last assistant message may still be pending (an episode waiting for its tool, or ending with
`submit`): legal, kept in the view.

Edits accumulate: a later compaction edits the view the earlier ones produced. An edit naming an event
that is not in the view at that point is a `LogFormatError` naming the compaction.

Pinned block: after the edits, every active pin whose text is no longer verbatim in some message's
content is listed in one `system` message (provenance `pinned`) right after the leading system
message (or first, when there is none): `"Pinned constraints:\\n- <text>\\n- <text>"`. It is derived,
not recorded, so it always reflects the pins active at that point.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Mapping, Sequence

import orjson

from ctxkit.edits import EDIT_KINDS, EDIT_TYPES, DropEdit, Edit, MaskEdit, SummaryEdit, TruncateEdit
from ctxkit.errors import LogFormatError, ToolPairingError
from ctxkit.events import (
    Compaction,
    EpisodeStart,
    Event,
    Message,
    Pin,
    Step,
    ToolResult,
    Unpin,
    content_text,
)
from ctxkit.context.pairing import PairingProblem, PairingScan, pairing_problems
from ctxkit.context.pairing import find_orphans as find_orphans  # their home is ctxkit.context.pairing; kept importable from here
from ctxkit.context.pairing import pending_calls as pending_calls
from ctxkit.context.view_records import HOWS as HOWS  # their home is ctxkit.context.view_records; kept importable from here
from ctxkit.context.view_records import PINNED_HEADER as PINNED_HEADER
from ctxkit.context.view_records import How as How
from ctxkit.context.view_records import Provenance, View, ViewMessage, pinned_block, tools_digest
from ctxkit.context.view_records import pinned_block_text as pinned_block_text
from ctxkit.context.view_records import view_hash as view_hash

EDIT_OPS: tuple[str, ...] = tuple(EDIT_KINDS)
"""The edit kinds a `Compaction` may carry (`ctxkit.edits.EDIT_KINDS`)."""


# ---------------------------------------------------------------------------------------------- build


def message_of(event: Event) -> ViewMessage | None:
    """The verbatim view message of a chat-shaped event, or None for other events."""
    if isinstance(event, Message):
        return ViewMessage(
            role=event.role,
            content=content_text(event.content),
            tool_calls=event.tool_calls,
            tool_call_id=event.tool_call_id,
            name=event.name,
            reasoning_content=event.reasoning_content,
            provenance=Provenance("verbatim", (event.id or "",)),
        )
    if isinstance(event, Step):
        return ViewMessage(
            role="assistant",
            content=content_text(event.content),
            tool_calls=event.tool_calls,
            reasoning_content=event.reasoning_content,
            token_ids=tuple(event.token_ids) if event.token_ids else None,
            provenance=Provenance("verbatim", (event.id or "",)),
        )
    if isinstance(event, ToolResult):
        return ViewMessage(
            role="tool",
            content=content_text(event.content),
            tool_call_id=event.tool_call_id,
            name=event.name,
            provenance=Provenance("verbatim", (event.id or "",)),
        )
    return None


class ViewState:
    """Incremental form of `build_view`: feed events in log order, read `view()` at any point.

    `build_view` is `ViewState().feed(events).view()`; the builder keeps one and feeds only new events.
    """

    def __init__(self) -> None:
        self.messages: list[ViewMessage] = []
        self.tools: tuple[Mapping[str, Any], ...] = ()
        self.pins: dict[str, Pin] = {}
        self.upto_seq: int | None = None
        self.n_events = 0
        self._call_ids: set[str] = set()
        self._cached: View | None = None
        # Kept across views so a view that only appends messages costs what the new messages cost; all reset
        # when a compaction rewrites `messages` (see `_rewritten`).
        self._pin_scan: dict[str, list] = {}  # pin id -> [text, first message index holding it or None, scanned up to]
        self._hashed: tuple[ViewMessage | None, int, int, Any] | None = None  # (block, at, messages hashed, sha256)
        self._pairing: PairingScan | None = None

    def feed(self, events: Iterable[Event]) -> "ViewState":
        """Apply events in order (each must come after the last one fed)."""
        for event in events:
            self._feed_one(event)
        return self

    def _feed_one(self, event: Event) -> None:
        self._cached = None
        self.n_events += 1
        self.upto_seq = event.seq
        if isinstance(event, EpisodeStart):
            self.tools = tuple(event.tools)
            return
        if isinstance(event, Pin):
            self.pins[event.pin_id] = event
            return
        if isinstance(event, Unpin):
            self.pins.pop(event.pin_id, None)
            return
        if isinstance(event, Compaction):
            self.messages = apply_edits_to_list(self.messages, event.edits, where=_where(event))
            # masks and truncations keep every message's role, calls, call id and event id: the pairing scan holds
            self._rewritten(keep_pairing=all(isinstance(e, (MaskEdit, TruncateEdit)) for e in event.edits))
            return
        msg = message_of(event)
        if msg is None:
            return
        if msg.role == "tool":
            if msg.tool_call_id not in self._call_ids:
                raise ToolPairingError(
                    f"{_where(event)}: tool result answers call id {msg.tool_call_id!r}, "
                    "but no earlier assistant message made that call (orphaned result)",
                    problem="orphaned_result", event=_where(event), call_id=msg.tool_call_id)
        for tc in msg.tool_calls:
            self._call_ids.add(tc.id)
        self.messages.append(msg)

    def view(self) -> View:
        """The view of everything fed so far (pinned block derived, hash computed): equal to
        `make_view(messages, tools, pins, upto_seq)`, at the cost of the messages fed since the last view
        (pins are looked for, and digests hashed, only in those) unless a compaction rewrote the messages."""
        if self._cached is None:
            base = self.messages
            pins = tuple(self.pins.values())
            block = self._pinned_block(pins)
            at = 1 if base and base[0].role == "system" else 0
            msgs = tuple(base) if block is None else (*base[:at], block, *base[at:])
            self._cached = View(messages=msgs, tools=self.tools, active_pins=pins, upto_seq=self.upto_seq,
                                hash=self._view_hash(msgs, block, at, [p.pin_id for p in pins]))
        return self._cached

    def pairing_problems(self, *, allow_pending: bool = True) -> list[PairingProblem]:
        """`pairing_problems(self.view().messages, allow_pending=...)`, scanning only the messages fed since
        the last call (all of them again after a compaction)."""
        view = self.view()
        msgs = self.messages
        if len(view.messages) != len(msgs) and msgs and msgs[0].role == "system" and msgs[0].tool_calls:
            return pairing_problems(view.messages, allow_pending=allow_pending)  # the block would follow calls
        # The pinned block is a message without calls at the start or after a leading system message without
        # calls: no call is open there, so it changes neither the scan's state nor its problems.
        scan = self._pairing
        if scan is None:
            scan = self._pairing = PairingScan()
        if scan.n < len(msgs):
            scan.feed(msgs[scan.n:])
        return scan.result(allow_pending=allow_pending)

    def _rewritten(self, *, keep_pairing: bool = False) -> None:
        """`messages` was replaced (a compaction): what was kept about the old list no longer holds (the
        pairing scan does when `keep_pairing`: the same messages, up to their content)."""
        self._pin_scan = {}
        self._hashed = None
        if not keep_pairing:
            self._pairing = None

    def _pinned_block(self, pins: Sequence[Pin]) -> ViewMessage | None:
        """The pinned block listing the active pins verbatim in no message (as `make_view` derives it); each
        pin's text is looked for only in the messages fed since it was last looked for."""
        base = self.messages
        n = len(base)
        scan = self._pin_scan
        missing: list[Pin] = []
        for p in pins:
            entry = scan.get(p.pin_id)
            if entry is None or entry[0] != p.text:
                entry = scan[p.pin_id] = [p.text, None, 0]
            if entry[1] is None and entry[2] < n:
                text = p.text
                for j in range(entry[2], n):
                    if text in base[j].content:
                        entry[1] = j
                        break
                entry[2] = n
            if entry[1] is None:
                missing.append(p)
        return pinned_block(missing) if missing else None

    def _view_hash(self, msgs: tuple[ViewMessage, ...], block: ViewMessage | None, at: int,
                   pin_ids: Sequence[str]) -> str:
        """`view_hash(msgs, self.tools, pin_ids)`, continued from the messages hashed for the last view when
        `msgs` extends them (same pinned block at the same place)."""
        hashed = self._hashed
        if hashed is not None and hashed[0] is block and hashed[1] == at and hashed[2] <= len(msgs):
            h, done = hashed[3], hashed[2]
        else:
            h, done = hashlib.sha256(b"ctxkit-view-v1"), 0
        if done < len(msgs):
            h.update(b"".join([m.digest for m in msgs[done:]]))
        self._hashed = (block, at, len(msgs), h)
        h = h.copy()
        h.update(tools_digest(tuple(self.tools)))
        h.update(orjson.dumps(list(pin_ids)))
        return h.hexdigest()


def build_view(events: Sequence[Event] | Any, upto_seq: int | None = None) -> View:
    """The view after every event with `seq <= upto_seq` (all events when None). Pure.

    `events` is a sequence of events or anything with an `events()` method (an `EventLog`).
    """
    if hasattr(events, "events") and callable(events.events):
        events = events.events()
    state = ViewState()
    for event in events:
        if upto_seq is not None and event.seq is not None and event.seq > upto_seq:
            break
        state._feed_one(event)
    return state.view()


def make_view(
    messages: Sequence[ViewMessage],
    tools: Sequence[Mapping[str, Any]],
    pins: Sequence[Pin],
    upto_seq: int | None,
) -> View:
    """A `View` from messages without a pinned block: derives the pinned block and the hash."""
    return _view_of([m for m in messages if m.provenance.how != "pinned"], tools, pins, upto_seq)


def _view_of(base: list[ViewMessage], tools: Sequence[Mapping[str, Any]], pins: Sequence[Pin],
             upto_seq: int | None) -> View:
    """`make_view` of messages holding no pinned block (`base` is changed)."""
    missing = [p for p in pins if not any(p.text in m.content for m in base)]
    if missing:
        at = 1 if base and base[0].role == "system" else 0
        base.insert(at, pinned_block(missing))
    msgs = tuple(base)
    return View(messages=msgs, tools=tuple(tools), active_pins=tuple(pins), upto_seq=upto_seq,
                hash=view_hash(msgs, tools, [p.pin_id for p in pins]))


def _where(event: Event) -> str:
    return f"event {event.id} (seq {event.seq}, {getattr(event, 'kind', '?')})"


# ---------------------------------------------------------------------------------------------- edits


def apply_edits(view: View, edits: Sequence[Edit], *, where: str = "edits") -> View:
    """The view after `edits` (what a `Compaction` carrying them would give). Pure.

    Compressors use it to try candidate edits and measure the result.
    """
    hit = _BASE[0]
    if hit is None or hit[0] is not view.messages:  # a compressor tries several candidates on one view
        base = tuple(m for m in view.messages if m.provenance.how != "pinned")
        hit = _BASE[0] = (view.messages, base, {})
    return _view_of(_apply_edits(hit[1], edits, where, hit[2]), view.tools, view.active_pins, view.upto_seq)


_BASE: list[Any] = [None]  # (messages of the last view edited, the same without the pinned block, its _single_index or {})


def apply_edits_to_list(messages: Sequence[ViewMessage], edits: Sequence[Edit], *, where: str) -> list[ViewMessage]:
    """Apply typed edits (`ctxkit.edits`) to a message list (no pinned block); returns a new list.

    `LogFormatError` naming `where` and the edit's index when an edit names an event not in the view, or
    is not a typed edit (read JSON objects with `ctxkit.edits.edit_from_dict`)."""
    return _apply_edits(messages, edits, where, None)


def _apply_edits(messages: Sequence[ViewMessage], edits: Sequence[Edit], where: str,
                 known: dict[str, int] | None) -> list[ViewMessage]:
    """`apply_edits_to_list`; `known`: a dict kept with `messages` to hold their `_single_index` (filled here
    the first time it is needed)."""
    msgs = list(messages)
    index: dict[str, int] | None = None  # event id -> position of its single message (mask/truncate)
    moved = False  # a drop, summary or retrieved edit changed positions: `known` no longer applies
    for i, edit in enumerate(edits):
        if not isinstance(edit, EDIT_TYPES):
            raise LogFormatError(f"{where}: edit {i} is {type(edit).__name__}, not a typed edit; "
                                 f"known kinds: {sorted(EDIT_KINDS)} (read JSON with ctxkit.edits.edit_from_dict)")
        if isinstance(edit, (MaskEdit, TruncateEdit)):
            if index is None:
                if known is not None and not moved:
                    if not known:
                        known.update(_single_index(msgs))
                    index = known
                else:
                    index = _single_index(msgs)
            j = index.get(edit.event_id)
            if j is None:
                raise LogFormatError(f"{where}: edit {i} ({edit.kind!r}): event {edit.event_id!r} is not a single "
                                     "message in the view")
            msgs[j] = _edited(msgs[j], "masked" if isinstance(edit, MaskEdit) else "truncated", edit.text, edit.event_id)
            continue
        here = f"{where}: edit {i} ({edit.kind!r})"
        index, moved = None, True  # drop, summary and retrieved change positions
        if isinstance(edit, DropEdit):
            ids = set(edit.event_ids)
            kept = [m for m in msgs if ids.isdisjoint(m.provenance.event_ids)]
            if len(kept) == len(msgs):
                raise LogFormatError(f"{here}: none of the event ids {sorted(ids)} is in the view")
            msgs = kept
        elif isinstance(edit, SummaryEdit):
            ids = set(edit.event_ids)
            positions = [j for j, m in enumerate(msgs) if not ids.isdisjoint(m.provenance.event_ids)]
            if not positions:
                raise LogFormatError(f"{here}: none of the event ids {sorted(ids)} is in the view")
            summary = ViewMessage(role=edit.role or "user", content=edit.text,
                                  provenance=Provenance("summary", edit.event_ids))
            drop = set(positions)
            msgs = [m for j, m in enumerate(msgs) if j not in drop]
            msgs.insert(positions[0], summary)
        else:  # RetrievedEdit
            msgs = [m for m in msgs if m.provenance.how != "retrieved"]
            block = ViewMessage(role=edit.role or "user", content=edit.text,
                                provenance=Provenance("retrieved", edit.event_ids))
            msgs.insert(newest_turn_start(msgs), block)
    return msgs


# (id(message), how, text, event id) -> (the message, its edited copy)
_EDITED: dict[tuple[int, str, str, str], tuple[ViewMessage, ViewMessage]] = {}


def _edited(m: ViewMessage, how: str, text: str, event_id: str) -> ViewMessage:
    """`m` with `text` as its content, no sampled ids and provenance `how` of `event_id` (its own single
    event). Made once per (message, how, text, event) while kept, so the candidates a compressor tries and the
    view rebuilt from the recorded compaction share the message, and its digest is computed once."""
    key = (id(m), how, text, event_id)
    hit = _EDITED.get(key)
    if hit is not None and hit[0] is m:
        return hit[1]
    out = ViewMessage(m.role, text, m.tool_calls, m.tool_call_id, m.name, m.reasoning_content, None,
                      Provenance(how, (event_id,)))
    if len(_EDITED) >= 2048:  # kept messages hold their text: a few episodes' worth at most
        _EDITED.clear()
    _EDITED[key] = (m, out)  # holds m, so its id is not reused while kept
    return out


def newest_turn_start(messages: Sequence[ViewMessage]) -> int:
    """Index where the newest turn starts: the assistant message whose calls the trailing tool results
    answer or that ends the list with calls still pending (a call stays next to its results), else the
    last user message; `len(messages)` when the view ends with none of these."""
    j = len(messages)
    while j > 0 and messages[j - 1].role == "tool":
        j -= 1
    if j < len(messages):  # trailing tool results: their call is just before them
        return max(j - 1, 0)
    if messages and messages[-1].role == "assistant" and messages[-1].tool_calls:  # pending calls
        return len(messages) - 1
    if messages and messages[-1].role == "user":
        return len(messages) - 1
    return len(messages)


def _single_index(msgs: Sequence[ViewMessage]) -> dict[str, int]:
    """Event id -> position, for messages standing for exactly one event (verbatim, masked, truncated)."""
    provs = [m.provenance for m in msgs]
    # written last to first, so the first message of an event id is the one kept
    return {p.event_ids[0]: j for j, p in zip(range(len(provs) - 1, -1, -1), reversed(provs))
            if len(p.event_ids) == 1 and p.how in _SINGLE}


_SINGLE = frozenset({"verbatim", "masked", "truncated"})
