"""One episode log as the viewer's JSON data: timeline, per-step contexts from replay, compactions.

Everything shown comes from the log through the code that replays it: each step's context is the
`BuiltContext` of `log_replay.replay_steps` (the rebuilt ids, roles, loss mask and per-token provenance),
each compaction's before/after views are `view.build_view` up to the event before it and up to it. A
step whose replay fails (rebuild error or hash mismatch) carries the reason and no context, so the page
says so at that step instead of showing a plausible context; a setup failure (no recorded tokenizer, an
id mismatch) is reported for the whole episode. A log that cannot be read at all (a torn or non-JSON
line, a broken hash chain) is `failed_episode`: no events, its typed error naming the file and line.

Each step also says why the training sample starting there starts anew (`split`: a reason of
`ctxkit.text.rendering.drift_reasons.DRIFT_REASONS`, None where the step extends the sample before it),
and its context lists the drifts of its sampled turns `[message index, token position, reason]`.

Size: a context is stored as references into a `Pool` of segments (the tokens of one message span, or a
piece of the template scaffold between two spans, cut before each special token, with their per-token
texts and classes), each distinct segment
once for the whole page, so a 200-step episode stores each message's tokens once, not once per step.
Message texts of compaction views go to the pool's string table the same way.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import orjson

from ctxkit.errors import CtxkitError
from ctxkit.events import Compaction, EpisodeEnd, EpisodeStart, Event, event_to_dict
from ctxkit.training.offline_steps import OFFLINE_BUDGET
from ctxkit.context.view import build_view
from ctxkit.edits import edit_to_dict
from ctxkit.text.tokenizer.pieces import token_texts
from ctxkit.text.rendering.drift_reasons import template_default_system
from ctxkit.training.context_replay import load_events, replay_steps, resolve_setup
from ctxkit.training.episode_samples import assemble_samples, compacted_steps, episode_meta

__all__ = ["CLASS_CODES", "Pool", "context_segments", "episode_data", "failed_episode", "token_classes"]

CLASS_CODES: dict[str, str] = {
    "verbatim": "v", "masked": "m", "truncated": "t", "summary": "s", "retrieved": "r", "pinned": "p",
    "scaffold": "S", "generation_prompt": "g",
}
"""Per-token provenance class -> the one-letter code stored in a segment (the page maps it back)."""


@dataclass
class Pool:
    """Distinct segments and strings of a page, each stored once (see the module docstring)."""

    segments: list[dict[str, Any]] = field(default_factory=list)
    """Segment records: `ids`, `t` (per-token texts), `c` (class codes), `l` (loss mask as '0'/'1')."""
    strings: list[str] = field(default_factory=list)
    """Distinct texts (compaction view messages)."""
    messages: list[list[Any]] = field(default_factory=list)
    """Distinct message provenance records `[role, how, event ids]`."""
    _msg_index: dict[tuple, int] = field(default_factory=dict)
    _seg_index: dict[bytes, int] = field(default_factory=dict)
    _str_index: dict[str, int] = field(default_factory=dict)
    _texts: dict[Any, list[str]] = field(default_factory=dict)

    def segment(self, tok: Any, ids: Sequence[int], codes: str, loss: str) -> int:
        """Index of the segment with these ids, classes and loss mask (added when new)."""
        key = hashlib.sha256(orjson.dumps([list(ids), codes, loss])).digest()
        hit = self._seg_index.get(key)
        if hit is None:
            hit = len(self.segments)
            ids_key = tuple(ids)
            texts = self._texts.get(ids_key)
            if texts is None:
                texts = self._texts[ids_key] = token_texts(tok, list(ids))
            self.segments.append({"ids": list(ids), "t": texts, "c": codes, "l": loss})
            self._seg_index[key] = hit
        return hit

    def message(self, role: str, how: str, event_ids: Sequence[str]) -> int:
        """Index of the provenance record `[role, how, event ids]` (added when new)."""
        key = (role, how, tuple(event_ids))
        hit = self._msg_index.get(key)
        if hit is None:
            hit = self._msg_index[key] = len(self.messages)
            self.messages.append([role, how, list(event_ids)])
        return hit

    def string(self, text: str) -> int:
        """Index of `text` in the string table (added when new)."""
        hit = self._str_index.get(text)
        if hit is None:
            hit = self._str_index[text] = len(self.strings)
            self.strings.append(text)
        return hit


def token_classes(ctx: Any) -> list[str]:
    """Per token of a `BuiltContext`: `generation_prompt`, `scaffold` (template text outside a message's own
    text), or the provenance of the message it belongs to (`verbatim`, `masked`, ..., `pinned`)."""
    out = []
    for role, (_, prov) in zip(ctx.rendered.roles, ctx.provenance):
        if role == "generation_prompt":
            out.append("generation_prompt")
        elif role == "scaffold" or prov is None:
            out.append("scaffold")
        else:
            out.append(prov.how)
    return out


def _context(ctx: Any, tok: Any, pool: Pool) -> dict[str, Any]:
    """A rebuilt context as references: `segs` = [[segment, pool message or -1], ...]."""
    classes = token_classes(ctx)
    codes = "".join(CLASS_CODES[c] for c in classes)
    loss = "".join("1" if m else "0" for m in ctx.loss_mask)
    ids = ctx.token_ids
    cuts: list[tuple[int, int, int]] = []
    pos = 0
    for span in sorted(ctx.rendered.spans, key=lambda s: (s.start, s.end)):
        if span.end <= span.start or span.start < pos:
            continue
        if span.start > pos:
            cuts.append((pos, span.start, -1))
        cuts.append((span.start, span.end, span.index))
        pos = span.end
    if pos < len(ids):
        cuts.append((pos, len(ids), -1))
    msgs = [pool.message(m.role, m.provenance.how, m.provenance.event_ids) for m in ctx.view.messages]
    specials = set(tok.special_tokens.values())
    segs = []
    for a, b, m in cuts:
        # scaffold between messages is cut before each special token, so the scaffold of a turn opener is
        # its own segment (shared by every context that has it, and compared on its own in an arm diff)
        starts = [a] + ([k for k in range(a + 1, b) if ids[k] in specials] if m < 0 else []) + [b]
        for x, y in zip(starts, starts[1:]):
            segs.append([pool.segment(tok, ids[x:y], codes[x:y], loss[x:y]), msgs[m] if 0 <= m < len(msgs) else -1])
    pinned = sum(1 for c in classes if c == "pinned")
    drifts = [[d.message_index, d.position, getattr(d, "reason", "unexplained")] for d in ctx.rendered.drifts]
    return {"segs": segs, "n_msgs": len(msgs), "n": ctx.n_tokens, "pinned": pinned, "hash": ctx.hash,
            "loss": loss.count("1"), "pins_checked": list(ctx.pins_checked), "drifts": drifts}


def _view_messages(view: Any, pool: Pool) -> list[list[Any]]:
    """A view's messages as `[pool message, string index, tool calls as text]`."""
    out = []
    for m in view.messages:
        calls = [f"{c.name}({c.arguments_text()})" for c in m.tool_calls]
        out.append([pool.message(m.role, m.provenance.how, m.provenance.event_ids), pool.string(m.content or ""), calls])
    return out


def _compaction(events: Sequence[Event], pos: int, pool: Pool) -> dict[str, Any]:
    """Before/after views of the compaction at `events[pos]`, and what its edits touched."""
    comp = events[pos]
    assert isinstance(comp, Compaction)
    before = build_view(events[:pos])
    after = build_view(events[: pos + 1])
    touched: dict[str, str] = {}
    for edit in comp.edits:
        d = edit_to_dict(edit)
        for eid in d.get("event_ids") or ([d["event_id"]] if d.get("event_id") else []):
            touched.setdefault(eid, edit.kind)
    return {"before": _view_messages(before, pool), "after": _view_messages(after, pool), "touched": touched,
            "compressor": comp.compressor, "details": orjson.loads(orjson.dumps(dict(comp.details), default=str))}


def _jsonable(event: Event) -> dict[str, Any]:
    return orjson.loads(orjson.dumps(event_to_dict(event), default=str))


def failed_episode(path: str | Path, error: Exception, *, label: str | None = None) -> dict[str, Any]:
    """The viewer data of a log that could not be read: every field of `episode_data`, empty, and
    `load_error` = `"<ErrorType>: <message>"` (a `LogFormatError`'s message names the file and line)."""
    return {
        "path": str(path), "label": label or str(path), "episode_id": "", "events": [], "steps": [], "compactions": {},
        "budget": None, "reserved": 0, "setup_error": None, "load_error": f"{type(error).__name__}: {error}",
        "specials": [], "tokenizer": None, "template": None, "task": {}, "sampler": {}, "compressor": None, "end": None,
    }


def episode_data(path: str | Path, pool: Pool, *, tokenizer: Any = None, template: Any = None,
                 label: str | None = None) -> dict[str, Any]:
    """The viewer data of the episode log at `path` (read and chain-verified; a corrupt log raises its
    `LogFormatError`, see `failed_episode`), its contexts and segments added to `pool`."""
    events, episode_id = load_events(str(path))
    start = next((e for e in events if isinstance(e, EpisodeStart)), None)
    end = next((e for e in reversed(events) if isinstance(e, EpisodeEnd)), None)
    desc = dict(start.context) if start is not None else {}
    budget = desc.get("budget") if isinstance(desc.get("budget"), int) else None
    if budget is not None and budget >= OFFLINE_BUDGET:
        budget = None  # an imported trajectory's offline steps: no real budget, shown as "no budget recorded"
    reserved = int(desc.get("reserve_tokens", 0) or 0)
    data: dict[str, Any] = {
        "path": str(path), "label": label or str(path), "episode_id": episode_id or (start.episode_id if start else ""),
        "events": [_jsonable(e) for e in events], "steps": [], "compactions": {}, "budget": budget,
        "reserved": reserved, "setup_error": None, "load_error": None, "specials": [], "tokenizer": None,
        "template": None, "task": dict(start.task) if start is not None else {},
        "sampler": dict(start.sampler) if start is not None else {}, "compressor": desc.get("compressor"),
        "end": None if end is None else {"outcome": end.outcome, "cause": end.cause, "reward": end.reward,
                                         "reward_kind": end.reward_kind},
    }
    for pos, e in enumerate(events):
        if isinstance(e, Compaction):
            try:
                data["compactions"][e.id] = _compaction(events, pos, pool)
            except CtxkitError as exc:
                data["compactions"][e.id] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        tok, tpl, warnings = resolve_setup(events, tokenizer=tokenizer, template=template)
    except CtxkitError as exc:
        data["setup_error"] = f"{type(exc).__name__}: {exc}"
        return data
    data.update(tokenizer=tok.id, template=tpl.id, warnings=list(warnings),
                specials=sorted(set(tok.special_tokens.values())))

    prev: dict[str, Any] | None = None
    replayed = list(replay_steps(events, tokenizer=tok, template=tpl))
    splits = _split_reasons(events, [r for r in replayed if r.ok and r.context is not None], tok, tpl)
    for r in replayed:
        step = r.step
        rec: dict[str, Any] = {
            "index": r.index, "seq": step.seq, "id": step.id, "ok": r.ok, "expected_hash": r.expected_hash,
            "problem": None if r.ok else r.describe(),
            "sampled": {"ids": list(step.token_ids), "t": token_texts(tok, list(step.token_ids)),
                        "lp": None if step.logprobs is None else list(step.logprobs)},
            "logprob_kind": step.logprob_kind, "sampling": dict(step.sampling), "timings": dict(step.timings),
            "finish_reason": step.finish_reason, "policy_version": step.policy_version,
            "split": splits.get(step.seq),
        }
        if r.ok and r.context is not None:
            rec["context"] = _context(r.context, tok, pool)
            _share_prefix(rec["context"], prev)
            prev = rec["context"]
        data["steps"].append(rec)
    for rec in data["steps"]:
        rec.get("context", {}).pop("_full", None)
    return data


def _split_reasons(events: Sequence[Event], ok: list, tok: Any, tpl: Any) -> dict[Any, str]:
    """Step seq -> why the training sample starting at that step starts anew (`TrainingSample.split_reason`),
    from the samples of the steps that replay (the episode's first sample is no split)."""
    rows = assemble_samples([(r.step, r.token_ids, r.got_hash) for r in ok], episode_meta(events), tokenizer=tok,
                            compacted=compacted_steps(events), default_system=template_default_system(tpl))
    return {s.step_seqs[0]: s.split_reason for s in rows if s.split_reason}


def _share_prefix(ctx: dict[str, Any], prev: dict[str, Any] | None) -> None:
    """Store `ctx["segs"]` as `keep` (the number of leading references equal to the previous replayed
    step's, the page takes them from there) and `add` (the rest): contexts that extend each other cost
    only their new references."""
    segs = ctx.pop("segs")
    full = prev.get("_full", []) if prev is not None else []
    keep = 0
    while keep < min(len(segs), len(full)) and segs[keep] == full[keep]:
        keep += 1
    ctx["keep"], ctx["add"], ctx["_full"] = keep, segs[keep:], segs


def context_segments(steps: list[dict[str, Any]], index: int) -> list[list[int]]:
    """The full `[segment, message]` references of step `index`'s context, rebuilt from `keep`/`add`
    (the way the page does it)."""
    full: list[list[int]] = []
    for rec in steps[: index + 1]:
        if "context" in rec:
            full = full[: rec["context"]["keep"]] + rec["context"]["add"]
    return full

