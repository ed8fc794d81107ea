"""The records of a view: messages with their provenance, the view, its hash and the pinned block.

`ctxkit.context.view` builds views from the event log and applies compaction edits; this module holds what a view
is made of, so both it and its readers share one definition. The names are importable from `ctxkit.context.view`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, Mapping, Sequence

import orjson

from ctxkit.events import Pin, ToolCall

How = Literal["verbatim", "masked", "truncated", "summary", "retrieved", "pinned"]
HOWS: tuple[str, ...] = ("verbatim", "masked", "truncated", "summary", "retrieved", "pinned")
PINNED_HEADER = "Pinned constraints:"
"""First line of the derived pinned block."""


@dataclass(frozen=True)
class Provenance:
    """Where a view message comes from."""

    how: How
    """`verbatim`, `masked`, `truncated`, `summary`, `retrieved` or `pinned`."""
    event_ids: tuple[str, ...]
    """The events the message stands for (one for verbatim/masked/truncated; every covered one otherwise)."""


@dataclass(frozen=True)
class ViewMessage:
    """One message of a view, with its provenance."""

    role: str
    """`system`, `user`, `assistant` or `tool`."""
    content: str
    """Text content."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls of an assistant message."""
    tool_call_id: str | None = None
    """For a tool message: the call it answers."""
    name: str | None = None
    """Author or tool name."""
    reasoning_content: str | None = None
    """Assistant reasoning text."""
    token_ids: tuple[int, ...] | None = None
    """Sampled ids of a verbatim `Step` (rendered token-in-token-out); None otherwise."""
    provenance: Provenance = Provenance("verbatim", ())
    """Which events the message stands for, and how."""

    def to_chat(self) -> dict[str, Any]:
        """The OpenAI/HF chat dict; carries `"token_ids"` for a sampled assistant turn kept verbatim."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [tc.to_openai() for tc in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.token_ids is not None:
            out["token_ids"] = list(self.token_ids)
        return out

    @cached_property
    def digest(self) -> bytes:
        """sha256 of the canonical JSON (sorted keys) of `to_chat()` plus the provenance (computed once)."""
        d = self.to_chat()
        d["provenance"] = [self.provenance.how, list(self.provenance.event_ids)]
        return hashlib.sha256(orjson.dumps(d, option=orjson.OPT_SORT_KEYS, default=_jsonable)).digest()


@dataclass(frozen=True)
class View:
    """What the policy sees at one decision point."""

    messages: tuple[ViewMessage, ...]
    """Messages in order, pinned block included."""
    tools: tuple[Mapping[str, Any], ...]
    """Tool schemas from `EpisodeStart`."""
    active_pins: tuple[Pin, ...]
    """The `Pin` events active at this point, in the order they were recorded."""
    upto_seq: int | None
    """Seq of the last event included (None for an empty log)."""
    hash: str
    """sha256 over a canonical JSON of the messages (with provenance), tools and active pin ids."""

    def chat(self) -> list[dict[str, Any]]:
        """The messages as OpenAI/HF chat dicts (what the renderer takes)."""
        return [m.to_chat() for m in self.messages]


_BLOCKS: dict[tuple, ViewMessage] = {}  # ((pin event id or pin id, text), ...) -> its pinned block


def pinned_block(missing: Sequence[Pin]) -> ViewMessage:
    """The pinned block (`system`, provenance `pinned`) listing the pins `missing`; one object per list of
    pins while kept, so its digest is computed once."""
    key = tuple((p.id or p.pin_id, p.text) for p in missing)
    block = _BLOCKS.get(key)
    if block is None:
        block = ViewMessage(role="system", content=pinned_block_text([p.text for p in missing]),
                            provenance=Provenance("pinned", tuple(p.id or p.pin_id for p in missing)))
        if len(_BLOCKS) >= 256:
            _BLOCKS.clear()
        _BLOCKS[key] = block
    return block


def pinned_block_text(texts: Sequence[str]) -> str:
    """The text of the pinned block listing `texts`."""
    return PINNED_HEADER + "".join(f"\n- {t}" for t in texts)


def view_hash(messages: Sequence[ViewMessage], tools: Sequence[Mapping[str, Any]], pin_ids: Sequence[str]) -> str:
    """sha256 hex over each message's `digest` (canonical JSON with provenance), the tools' canonical JSON
    and the active pin ids."""
    h = hashlib.sha256(b"ctxkit-view-v1")
    h.update(b"".join([m.digest for m in messages]))
    h.update(tools_digest(tuple(tools)))
    h.update(orjson.dumps(list(pin_ids)))
    return h.hexdigest()


_TOOLS_DIGESTS: dict[int, tuple[Any, bytes]] = {}


def tools_digest(tools: tuple[Mapping[str, Any], ...]) -> bytes:
    """sha256 of the canonical JSON (sorted keys) of tool schemas; kept per tuple object (a view's tools)."""
    hit = _TOOLS_DIGESTS.get(id(tools))
    if hit is not None and hit[0] is tools:
        return hit[1]
    digest = hashlib.sha256(orjson.dumps([dict(t) for t in tools], option=orjson.OPT_SORT_KEYS, default=_jsonable)).digest()
    if len(_TOOLS_DIGESTS) > 64:
        _TOOLS_DIGESTS.clear()
    _TOOLS_DIGESTS[id(tools)] = (tools, digest)
    return digest


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"not JSON-able: {type(obj).__name__}")
