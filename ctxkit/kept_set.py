"""The sampler's kept set of one step: which tokens each sampled position could have been drawn from.

A sampler with top-k / top-p / min-p (or greedy decoding) draws each token from a kept subset of the
vocabulary (the support of the processed distribution). `KeptSet` records it per sampled position: its
size always, and its ids when it holds at most `ids_limit` tokens (a wider support is recorded by size
only, so a log does not carry a vocabulary per token). It rides on `ctxkit.events.Step.kept_set` (None when
the engine did not give it), so `ctxkit mismatch` can tell a token outside the support apart from numerics.

`kept_set_to_dict` / `kept_set_from_dict` are its on-disk shape (a JSON object, lists for tuples); a
malformed object is an `EventFormatError` naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from ctxkit.errors import EventFormatError

__all__ = ["IDS_LIMIT", "KeptSet", "kept_set_from_dict", "kept_set_to_dict"]

IDS_LIMIT = 64
"""Default most ids recorded per position: a wider support is recorded by its size only."""


def _bad(name: str, value: Any, allowed: str) -> EventFormatError:
    return EventFormatError("step", f"kept_set.{name}", value, (allowed,))


@dataclass(frozen=True)
class KeptSet:
    """Per sampled position of a step: the size of the sampler's kept support, and its ids when small."""

    sizes: tuple[int, ...]
    """Tokens in the kept support at each sampled position, aligned with `Step.token_ids` (each >= 1)."""
    ids: tuple[tuple[int, ...] | None, ...]
    """Per position, the kept ids in increasing order when there are at most `ids_limit`, else None."""
    ids_limit: int = IDS_LIMIT
    """Most ids recorded at one position."""
    top_k: int | None = None
    """The top-k the sampler used (None: not given; 0: off)."""
    top_p: float | None = None
    """The top-p the sampler used (None: not given; 1: off)."""
    min_p: float | None = None
    """The min-p the sampler used (None: not given; 0: off)."""
    source: str = "exact"
    """How it was obtained: `exact` (computed from the distribution sampled, e.g. the transformers agent) or
    an engine's name for what it reported."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple(self.sizes))
        object.__setattr__(self, "ids", tuple(None if x is None else tuple(x) for x in self.ids))
        if len(self.ids) != len(self.sizes):
            raise _bad("ids", f"{len(self.ids)} entries", f"one per size ({len(self.sizes)})")
        for i, (size, ids) in enumerate(zip(self.sizes, self.ids)):
            if type(size) is not int or size < 1:
                raise _bad(f"sizes[{i}]", size, "an integer >= 1")
            if ids is not None and len(ids) != size:
                raise _bad(f"ids[{i}]", f"{len(ids)} ids", f"exactly sizes[{i}] = {size} ids")
            if ids is not None and any(type(t) is not int for t in ids):
                raise _bad(f"ids[{i}]", ids, "integer token ids")
        if type(self.ids_limit) is not int or self.ids_limit < 0:
            raise _bad("ids_limit", self.ids_limit, "an integer >= 0")
        if self.top_k is not None and (type(self.top_k) is not int or self.top_k < 0):
            raise _bad("top_k", self.top_k, "an integer >= 0 or None")
        for name in ("top_p", "min_p"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise _bad(name, value, "a finite number or None")
        if not isinstance(self.source, str) or not self.source:
            raise _bad("source", self.source, "a non-empty string")

    def __len__(self) -> int:
        return len(self.sizes)

    def holds(self, index: int, token_id: int) -> bool | None:
        """Whether position `index`'s support holds `token_id`: None when its ids were not recorded."""
        ids = self.ids[index]
        return None if ids is None else int(token_id) in ids


def kept_set_to_dict(kept: KeptSet) -> dict[str, Any]:
    """The JSON-able object of a `KeptSet` (lists for tuples)."""
    return {"sizes": list(kept.sizes), "ids": [None if x is None else list(x) for x in kept.ids],
            "ids_limit": kept.ids_limit, "top_k": kept.top_k, "top_p": kept.top_p, "min_p": kept.min_p,
            "source": kept.source}


def kept_set_from_dict(data: Any) -> KeptSet:
    """The `KeptSet` of `kept_set_to_dict` output (a `KeptSet` is returned as is); `EventFormatError` when malformed."""
    if isinstance(data, KeptSet):
        return data
    if not isinstance(data, Mapping):
        raise _bad("", type(data).__name__, "an object")
    known = {"sizes", "ids", "ids_limit", "top_k", "top_p", "min_p", "source"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise _bad(unknown[0], data[unknown[0]], f"one of the fields {sorted(known)}")
    for name in ("sizes", "ids"):
        if not isinstance(data.get(name), (list, tuple)):
            raise _bad(name, data.get(name), "a list")
    ids = data["ids"]
    if any(x is not None and not isinstance(x, (list, tuple)) for x in ids):
        raise _bad("ids", ids, "a list of id lists or nulls")
    rest = {k: data[k] for k in ("ids_limit", "top_k", "top_p", "min_p", "source") if k in data}
    return KeptSet(sizes=tuple(data["sizes"]), ids=tuple(ids), **rest)
