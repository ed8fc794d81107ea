"""Typed compaction edits: what a `Compaction` event records about how it changed the view.

One frozen dataclass per edit kind, tagged by its `kind`. `ctxkit.context.view` applies them; compressors build
them. On disk (and in `event_to_dict`) an edit is a JSON object whose `"op"` key holds the kind, exactly
the shape logs have always used, so old logs load, replay and keep their event ids and line hashes:

| kind        | JSON                                                                                   |
|-------------|----------------------------------------------------------------------------------------|
| `drop`      | `{"op": "drop", "event_ids": [...]}`                                                   |
| `mask`      | `{"op": "mask", "event_id": id, "text": str}`                                          |
| `truncate`  | `{"op": "truncate", "event_id": id, "text": str}`                                      |
| `summary`   | `{"op": "summary", "event_ids": [...], "text": str, "role": "user"}`                   |
| `retrieved` | `{"op": "retrieved", "event_ids": [...], "text": str, "scores": [...], "role": "user"}` |

Optional fields (`role`, `scores`) that are None are left out of the JSON (a log written without them
reads back to the same bytes). The pinned block is derived from `Pin` events, never recorded as an edit.

Every record validates its fields at construction (`LogFormatError` naming the field), and
`edit_from_dict` names the known kinds for an unknown `op`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, Mapping, Union

from ctxkit.errors import LogFormatError

EDIT_ROLES: tuple[str, ...] = ("user", "assistant", "system")
"""Roles a summary or retrieved block may be rendered as."""


def _ids(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value \
            or not all(isinstance(x, str) and x for x in value):
        raise LogFormatError(f"{what} edit: 'event_ids' is {value!r}; expected a non-empty list of event id strings")
    return tuple(value)


def _str(value: Any, what: str, key: str) -> str:
    if not isinstance(value, str):
        raise LogFormatError(f"{what} edit: {key!r} is {value!r}; expected a string")
    return value


def _role(value: Any, what: str) -> str | None:
    if value is not None and value not in EDIT_ROLES:
        raise LogFormatError(f"{what} edit: 'role' is {value!r}; expected one of {list(EDIT_ROLES)}")
    return value


class _Edit:
    """Shared behaviour of the edit records (not an edit kind itself)."""

    kind: str
    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this edit: `{"op": kind, ...fields}` (None optional fields left out)."""
        out: dict[str, Any] = {"op": self.kind}
        for f in fields(self):  # type: ignore[arg-type]
            if f.name == "kind":
                continue
            value = getattr(self, f.name)
            if value is None and f.name in self.OPTIONAL:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class DropEdit(_Edit):
    """Remove every view message whose provenance names one of `event_ids`."""

    event_ids: tuple[str, ...]
    """The events whose messages leave the view."""
    kind: Literal["drop"] = "drop"

    def __post_init__(self) -> None:
        object.__setattr__(self, "event_ids", _ids(self.event_ids, "drop"))


@dataclass(frozen=True)
class MaskEdit(_Edit):
    """Replace the content of the message of `event_id` by a placeholder; provenance becomes `masked`."""

    event_id: str
    """The event (a tool result) whose output is masked; the raw output stays in the log."""
    text: str
    """The placeholder (names the event id and the original size in tokens)."""
    kind: Literal["mask"] = "mask"

    def __post_init__(self) -> None:
        _str(self.event_id, "mask", "event_id")
        _str(self.text, "mask", "text")


@dataclass(frozen=True)
class TruncateEdit(_Edit):
    """Replace the content of the message of `event_id` by a shortened text; provenance becomes `truncated`."""

    event_id: str
    """The event whose content is shortened."""
    text: str
    """The shortened content (with a marker naming what was cut)."""
    kind: Literal["truncate"] = "truncate"

    def __post_init__(self) -> None:
        _str(self.event_id, "truncate", "event_id")
        _str(self.text, "truncate", "text")


@dataclass(frozen=True)
class SummaryEdit(_Edit):
    """Remove the messages covering any of `event_ids` and insert one summary message where the first was."""

    event_ids: tuple[str, ...]
    """Every event the summary stands for."""
    text: str
    """The summary message's content."""
    role: str | None = None
    """Role of the summary message (None: `user`, and left out of the JSON)."""
    kind: Literal["summary"] = "summary"
    OPTIONAL: ClassVar[tuple[str, ...]] = ("role",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "event_ids", _ids(self.event_ids, "summary"))
        _str(self.text, "summary", "text")
        _role(self.role, "summary")


@dataclass(frozen=True)
class RetrievedEdit(_Edit):
    """Replace any earlier retrieved block by this one, placed just before the newest turn."""

    event_ids: tuple[str, ...]
    """The events whose passages the block lists."""
    text: str
    """The block's content."""
    scores: tuple[float, ...] | None = None
    """Retrieval score of each listed event (recorded, never recomputed); None when not given."""
    role: str | None = None
    """Role of the block message (None: `user`, and left out of the JSON)."""
    kind: Literal["retrieved"] = "retrieved"
    OPTIONAL: ClassVar[tuple[str, ...]] = ("scores", "role")

    def __post_init__(self) -> None:
        object.__setattr__(self, "event_ids", _ids(self.event_ids, "retrieved"))
        _str(self.text, "retrieved", "text")
        _role(self.role, "retrieved")
        if self.scores is not None:
            if isinstance(self.scores, (str, bytes)) or not isinstance(self.scores, (list, tuple)) or not all(
                    isinstance(s, (int, float)) and not isinstance(s, bool) for s in self.scores):
                raise LogFormatError(f"retrieved edit: 'scores' is {self.scores!r}; expected a list of numbers")
            object.__setattr__(self, "scores", tuple(self.scores))


Edit = Union[DropEdit, MaskEdit, TruncateEdit, SummaryEdit, RetrievedEdit]
"""Any compaction edit."""

EDIT_KINDS: dict[str, type] = {
    "drop": DropEdit,
    "mask": MaskEdit,
    "truncate": TruncateEdit,
    "summary": SummaryEdit,
    "retrieved": RetrievedEdit,
}
"""Registry of edit kinds (the JSON `"op"` value -> record class)."""

EDIT_TYPES: tuple[type, ...] = tuple(EDIT_KINDS.values())
"""The edit record classes (for `isinstance` checks)."""


def edit_to_dict(edit: Edit) -> dict[str, Any]:
    """The JSON object of a typed edit (see the module docstring for the shapes)."""
    if not isinstance(edit, EDIT_TYPES):
        raise LogFormatError(f"{edit!r} is not a compaction edit; known kinds: {sorted(EDIT_KINDS)}")
    return edit.to_dict()


def edit_from_dict(data: Any, *, where: str = "edit") -> Edit:
    """The typed edit of a JSON object `{"op": kind, ...}`; a typed edit is returned as is.

    `LogFormatError` naming `where` for an unknown kind (listing the known ones), an unknown or missing
    field, or a field of the wrong type.
    """
    if isinstance(data, EDIT_TYPES):
        return data  # type: ignore[return-value]
    if not isinstance(data, Mapping):
        raise LogFormatError(f"{where}: {data!r} is not an edit object {{'op': kind, ...}}; known kinds: {sorted(EDIT_KINDS)}")
    op = data.get("op")
    cls = EDIT_KINDS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise LogFormatError(f"{where}: unknown edit kind (op) {op!r}; known kinds: {sorted(EDIT_KINDS)}")
    names = [f.name for f in fields(cls) if f.name != "kind"]
    unknown = sorted(set(data) - set(names) - {"op"})
    if unknown:
        raise LogFormatError(f"{where}: unknown field(s) {unknown} for edit kind {op!r}; fields: {names}")
    required = [f.name for f in fields(cls) if f.name != "kind" and f.name not in cls.OPTIONAL]
    missing = [n for n in required if n not in data]
    if missing:
        raise LogFormatError(f"{where}: {op!r} edit has no {missing}")
    try:
        return cls(**{k: v for k, v in data.items() if k != "op"})
    except LogFormatError as exc:
        raise LogFormatError(f"{where}: {exc}") from None
