"""One episode recorded by the gateway: its log (one writer), its builder, and the harness's history.

`GatewayEpisode.ingest` records a request's messages: the new ones as events (`Message`, or `ToolResult`
for tool messages) and, when the harness changed earlier history itself, one `Compaction` by the
compressor `HARNESS_COMPRESSOR` holding the edits (`ctxkit.integrations.gateway.history`), so training
samples split exactly there. Everything is checked before anything is appended (message form, tool-call
pairing, the tools offered): a refused request leaves the log as it was. `context()` builds what the
policy sees with the episode's `ContextBuilder`; `record_step` appends the sampled `Step`; `end` the
typed `EpisodeEnd` and closes the log.

The log is opened with `lock="writer"`: this process is its one writer until the episode ends. Callers
serialize the calls on one episode (`Gateway` holds `busy` while a request runs).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ctxkit.context.builder import BuiltContext, ContextBuilder
from ctxkit.context.pairing import pairing_problems
from ctxkit.context.view import build_view, message_of
from ctxkit.context.view_records import ViewMessage
from ctxkit.edits import DropEdit, SummaryEdit
from ctxkit.errors import GatewayError, LogFormatError, MessageFormatError
from ctxkit.events import Compaction, EpisodeEnd, EpisodeStart, Step
from ctxkit.integrations.gateway.history import (
    apply_history_edits, chain, diff_history, extend_chain, fingerprint, request_events, view_messages)
from ctxkit.log.event_log import EventLog

__all__ = ["GatewayEpisode", "HARNESS_COMPRESSOR", "tools_key", "checked_events"]

HARNESS_COMPRESSOR = "harness-rewrite-v1"
"""`Compaction.compressor` of a change the harness made to its own earlier history."""


def tools_key(tools: Sequence[Mapping[str, Any]]) -> str:
    """Canonical JSON of a tool list (two requests offer the same tools when these are equal)."""
    return json.dumps(list(tools), sort_keys=True, ensure_ascii=False)


def checked_events(messages: Sequence[Any]) -> list:
    """The events of a request's messages (`request_events`), their tool calls and results paired up;
    `GatewayError` 400 naming the message otherwise."""
    try:
        events = request_events(messages)
    except MessageFormatError as exc:
        raise GatewayError(str(exc), status=400, param="messages") from None
    problems = pairing_problems(view_messages(events))
    if problems:
        raise GatewayError(f"messages: {problems[0].text}", status=400, param="messages")
    return events


class GatewayEpisode:
    """An open episode: log, builder, the history as the harness should send it next, activity times."""

    def __init__(self, episode_id: str, path: Path, builder: ContextBuilder, *, tools: Sequence[Mapping[str, Any]],
                 sampler: Mapping[str, Any], metadata: Mapping[str, Any]):
        self.episode_id = episode_id
        """The episode's id (the log's file name without `.jsonl`)."""
        self.builder = builder
        """Builds every context of the episode (template, compressor, pins, budget)."""
        self.tools_key = tools_key(tools)
        """The tools offered, canonical JSON: later requests must offer the same."""
        self.log = EventLog.create(path, episode_id=episode_id, lock="writer", metadata=dict(metadata))
        """The episode's log, held by this process (`lock="writer"`) until `end`."""
        self.log.append(EpisodeStart(episode_id=episode_id, tools=tuple(tools), context=builder.describe(),
                                     sampler=dict(sampler), metadata=dict(metadata)))
        self.history: list[ViewMessage] = []
        """The messages the harness should send next (with their recorded provenance)."""
        self.prefix_digests: list[str] = chain([])
        """`chain` of the history's fingerprints."""
        self.n_steps = 0
        """Steps recorded."""
        self.n_splits = 0
        """Harness compactions recorded."""
        self.last_active = time.monotonic()
        """`time.monotonic()` of the last request's end (the idle timeout counts from it)."""
        self.busy = False
        """True while a request runs on this episode (set and cleared by the `Gateway` under its lock)."""
        self.step_fingerprints: set[str] = set()
        """Fingerprints of the assistant messages the policy sampled here (finds the episode after a rewrite)."""

    @property
    def digest(self) -> str:
        """The digest of the whole history (`prefix_digests[-1]`)."""
        return self.prefix_digests[-1]

    # ------------------------------------------------------------------------------------------- record

    def ingest(self, messages: Sequence[Any], tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Record a request's messages (see the module docstring); what was recorded, for the response."""
        if tools_key(tools) != self.tools_key:
            raise GatewayError(f"episode {self.episode_id}: the request offers other tools than its first request; "
                               "an episode's tools are fixed (start a new episode)", status=400, param="tools")
        events = checked_events(messages)
        request = view_messages(events)
        diff = diff_history(self.history, request)
        recorded_edits = ()
        if diff.edits:
            recorded_edits = self._record_rewrite(diff)
        recorded = self.log.extend(events[diff.new_from:]) if diff.new_from < len(events) else []
        added = [message_of(e) for e in recorded]
        if diff.edits:
            self.history = apply_history_edits(self.history, diff.edits) + added
            self.prefix_digests = chain([fingerprint(m) for m in self.history])
        else:
            self.history += added
            self.prefix_digests += extend_chain(self.prefix_digests[-1], [fingerprint(m) for m in added])
        return {"appended": len(recorded), "rewrite": bool(diff.edits), "fallback": diff.fallback,
                "edits": len(recorded_edits)}

    def _record_rewrite(self, diff) -> tuple:
        """Append the harness compaction; in the policy's view (which a compressor may have edited too) edits
        naming only events already gone from it are left out, and listed in `details["not_in_view"]`."""
        view_ids = {eid for m in build_view(self.log.events()).messages for eid in m.provenance.event_ids}
        edits, skipped = [], []
        for edit in diff.edits:
            ids = edit.event_ids if hasattr(edit, "event_ids") else (edit.event_id,)
            present = tuple(i for i in ids if i in view_ids)
            if not present:
                skipped.append(edit.to_dict())
            elif isinstance(edit, DropEdit):
                edits.append(DropEdit(present))
            elif isinstance(edit, SummaryEdit):
                edits.append(SummaryEdit(present, edit.text, role=edit.role))
            else:
                edits.append(edit)
        # what the harness sent, against what it had been sent: enough to read the rewrite without the requests
        details = {"fallback": diff.fallback, "history_messages": len(self.history), "request_new_from": diff.new_from}
        if skipped:
            details["not_in_view"] = skipped
        if edits:
            try:
                self.log.append(Compaction(compressor=HARNESS_COMPRESSOR, edits=tuple(edits), details=details))
            except LogFormatError as exc:  # pragma: no cover - the edits were checked against the history
                raise GatewayError(f"episode {self.episode_id}: harness compaction refused: {exc}", status=500) from exc
            self.n_splits += 1
        return tuple(edits)

    def context(self) -> BuiltContext:
        """Build the policy's next context (may append pins and a compaction by the builder's compressor)."""
        return self.builder.build(self.log)

    def record_step(self, step: Step) -> Step:
        """Append the sampled step; it joins the history the harness will send back."""
        recorded = self.log.append(step)
        self.n_steps += 1
        message = message_of(recorded)
        self.history.append(message)
        fp = fingerprint(message)
        self.step_fingerprints.add(fp)
        self.prefix_digests += extend_chain(self.prefix_digests[-1], [fp])
        return recorded

    def end(self, end: EpisodeEnd) -> EpisodeEnd:
        """Append the episode's end and close the log."""
        try:
            return self.log.append(end)
        finally:
            self.log.close()

    def step_seed(self) -> int:
        """Sampling seed of the next step when the request gives none: from the episode id and step index."""
        return int(hashlib.sha256(f"{self.episode_id}:{self.n_steps}".encode()).hexdigest()[:8], 16)
