"""`summarize-v2`: replace older turns by one summary message from a pluggable summarizer.

When triggered, everything after the first `keep_first` messages and before the newest `keep_last` turn
groups (an assistant message with its tool results, or one other message) is replaced by ONE summary
message (a `SummaryEdit`), so no tool call is split from its results. An earlier summary in
that range is folded into the new one (its text is part of the summarizer's input and its covered ids
are covered again), so the view holds at most one summary.

The number of kept groups is chosen from exact measurements of the view with the covered turns removed:
the most groups that fit with the actual summary (the summarizer runs at most twice per compaction).
If even one kept group plus the summary does not fit, the summary is cut shorter; this version drops no
turns, so the result may still be over budget. Follow it with `window` (the `summarize-then-window`
preset) to guarantee the budget. Version 1 (the un-suffixed registry name `summarize`,
`ctxkit.context.compress.with_window_fallback`) drops old turn groups itself (`fallback="window"`).

The summary text, the summarizer's id and version, the covered event ids and the token counts are all
recorded in the compaction event; replay never runs the summarizer. Summaries are memoized on the
compressor instance by their input, so rebuilding the same log costs no second summarizer call.

Default summarizer: `extractive` (MiniLM sentence centrality: deterministic, no generation, fast on CPU
and in the registry-wide check). `summarizer="lm"` uses the causal LM summarizer (SmolLM2-135M-Instruct
by default, loaded lazily on first use; seconds per summary on CPU). A `Summarizer` instance may be given
as `summarizer` too; the spec then records its id (such a spec cannot be rebuilt by name).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, Mapping

import orjson

from ctxkit.context.compress.base import BaseCompressor, CompressionRequest, require_choice, require_int
from ctxkit.context.compress.turns import base_messages, prefix_groups, turn_groups
from ctxkit.edits import DropEdit, Edit, SummaryEdit
from ctxkit.errors import ConfigError
from ctxkit.context.summarizers import SUMMARIZERS, Summarizer, SummarizerError, make_summarizer
from ctxkit.context.view import View, ViewMessage, apply_edits

SUMMARY_HEADER = "Summary of earlier conversation:"
"""First line of every summary message (stripped again when a summary is itself summarized)."""

SUMMARY_RESERVE_TOKENS = 24
"""Tokens allowed for the header and the message scaffold when estimating a summary's size."""

ROLES = ("user", "assistant", "system")
"""Roles the summary message may take."""


class Summarize(BaseCompressor):
    """Replace older turns by one summary (see the module docstring; version 2: summarizing only)."""

    NAME = "summarize"
    VERSION = 2
    FITS_BUDGET = False
    DEFAULTS: Mapping[str, Any] = {
        "summarizer": "extractive",
        "summarizer_params": {},
        "keep_first": 2,
        "keep_last": 4,
        "max_summary_tokens": 256,
        "role": "user",
    }
    """`summarizer`: a name in `ctxkit.context.summarizers.SUMMARIZERS` (`extractive`, `lm`) or a `Summarizer`;
    `summarizer_params`: keyword parameters of that summarizer (e.g. `{"n_sentences": 8}` or
    `{"model_path": ..., "max_new_tokens": 96}`); `keep_first`: leading messages kept verbatim (extended
    to a whole group); `keep_last`: newest turn groups kept verbatim when they fit (at least 1 always);
    `max_summary_tokens`: the summary body is cut to this many tokens of the context's tokenizer; `role`:
    role of the summary message."""

    def __init__(self, **params: Any) -> None:
        given = params.get("summarizer")
        self._instance: Summarizer | None = None
        if given is not None and not isinstance(given, str):
            if not isinstance(given, Summarizer):
                raise ConfigError(
                    f"{self.NAME}: parameter 'summarizer' is {given!r}; expected one of {sorted(SUMMARIZERS)} "
                    "or an object with `id`, `version` and `summarize(messages)`"
                )
            self._instance = given
            params = {**params, "summarizer": str(given.id)}
        self._memo: OrderedDict[str, str] = OrderedDict()
        super().__init__(**params)

    def check_params(self, p: Mapping[str, Any]) -> None:
        require_int(self.NAME, p, "keep_first", minimum=0)
        require_int(self.NAME, p, "keep_last", minimum=1)
        require_int(self.NAME, p, "max_summary_tokens", minimum=8)
        require_choice(self.NAME, p, "role", ROLES)
        sp = p["summarizer_params"]
        if not isinstance(sp, Mapping):
            raise ConfigError(f"{self.NAME}: parameter 'summarizer_params' is {sp!r}; expected a mapping")
        if self._instance is not None:
            if sp:
                raise ConfigError(f"{self.NAME}: 'summarizer_params' cannot be given with a summarizer instance")
            self.summarizer: Summarizer = self._instance
            return
        if p["summarizer"] not in SUMMARIZERS:
            raise ConfigError(
                f"{self.NAME}: parameter 'summarizer' is {p['summarizer']!r}; registered summarizers: {sorted(SUMMARIZERS)}"
            )
        try:
            self.summarizer = make_summarizer(p["summarizer"], **dict(sp))
        except ConfigError as exc:
            raise ConfigError(f"{self.NAME}: {exc}") from None

    # ----------------------------------------------------------------------------------------- propose

    def propose(self, request: CompressionRequest, n_tokens: int):
        return self.finish(request, *self.summarize_turns(request, n_tokens))

    def finish(self, request: CompressionRequest, edits: list[Edit], details: dict[str, Any], view: View, size: int):
        """What `propose` returns for the summary edits (none when there was nothing new to summarize)."""
        if not edits:
            return None
        details["tokens_after"] = size
        return edits, details

    def summarize_turns(self, request: CompressionRequest, n_tokens: int) -> tuple[list[Edit], dict[str, Any], View, int]:
        """`(edits, details, summarized view, its measured size)`; no edits when nothing new is coverable."""
        p = self.params
        view = request.view
        msgs = base_messages(view)
        groups = turn_groups(msgs)
        first = prefix_groups(groups, p["keep_first"])
        budget = request.budget
        reserve = p["max_summary_tokens"] + SUMMARY_RESERVE_TOKENS

        # Choose how many newest groups stay verbatim, from exact sizes of the view with the older turns
        # removed: the most groups (<= keep_last) that fit with a summary of the actual size; that size is
        # known only after summarizing, so try the most that fit with a tiny summary first, then the most
        # that fit with a full-size one (at most two summarizer calls).
        options: list[tuple[int, list[ViewMessage], int]] = []
        over = n_tokens > budget
        max_keep = min(p["keep_last"], max(1, len(groups) - first))
        for keep in range(max_keep, 0, -1):
            covered = _covered(msgs, groups, first, keep)
            if not covered or _only_summary(covered):  # nothing new to summarize at this split
                if over:
                    continue
                break
            removed = apply_edits(view, [DropEdit(tuple(_ids(covered)))], where=self.spec.name)
            options.append((keep, covered, request.measure(removed)))
            if options[-1][2] + reserve <= budget:
                break
        if not options:
            return [], {"summarized": False}, view, n_tokens
        hopeful = next((o for o in options if o[2] + SUMMARY_RESERVE_TOKENS <= budget), options[-1])
        tries = [hopeful] if hopeful is options[-1] else [hopeful, options[-1]]

        for keep, covered, _ in tries:
            body = self._summary(covered)
            text, edits, cand, size = self._fit_summary(request, view, covered, body, p["max_summary_tokens"])
            if size <= budget:
                break
        details: dict[str, Any] = {
            "summarizer": {"id": self.summarizer.id, "version": self.summarizer.version},
            "covered_messages": len(covered),
            "kept_last_groups": keep,
        }
        if size > budget:  # cut the summary to the room left
            room = p["max_summary_tokens"] - (size - budget) - 4
            if room > 0:
                text, edits, cand, size = self._fit_summary(request, view, covered, body, room)
            details["summary_cut"] = True
        details["summary_tokens"] = request.tokenizer.count(text)
        return edits, details, cand, size

    def _fit_summary(self, request: CompressionRequest, view: View, covered: list[ViewMessage], body: str, limit: int):
        text = SUMMARY_HEADER + "\n" + cut_to_tokens(request.tokenizer, body or "(nothing to summarize)", limit)
        edits: list[Edit] = [SummaryEdit(tuple(_ids(covered)), text, self.params["role"])]
        cand = apply_edits(view, edits, where=self.spec.name)
        return text, edits, cand, request.measure(cand)

    def _summary(self, covered: list[ViewMessage]) -> str:
        """The summarizer's text for `covered` (memoized by input)."""
        chat = []
        for m in covered:
            d = m.to_chat()
            d.pop("token_ids", None)
            if m.provenance.how == "summary" and d["content"].startswith(SUMMARY_HEADER):
                d["content"] = d["content"][len(SUMMARY_HEADER):].lstrip("\n")
            chat.append(d)
        key = hashlib.sha256(
            orjson.dumps([self.summarizer.id, self.summarizer.version, chat], option=orjson.OPT_SORT_KEYS)
        ).hexdigest()
        text = self._memo.get(key)
        if text is None:
            text = self.summarizer.summarize(chat)
            if not isinstance(text, str):
                raise SummarizerError(f"{self.NAME}: summarizer {self.summarizer.id!r} returned {type(text).__name__}, not a string")
            self._memo[key] = text
            while len(self._memo) > 128:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end(key)
        return text.strip()


def _covered(msgs: list[ViewMessage], groups: list[tuple[int, int]], first: int, keep: int) -> list[ViewMessage]:
    """Messages of the groups between the kept prefix and the newest `keep` groups (a retrieved block stays)."""
    end = len(groups) - keep
    if end <= first:
        return []
    out = []
    for s, e in groups[first:end]:
        out.extend(m for m in msgs[s:e] if m.provenance.how != "retrieved")
    return out


def _only_summary(covered: list[ViewMessage]) -> bool:
    """True when the only thing to cover is an earlier summary (nothing new to summarize)."""
    return len(covered) == 1 and covered[0].provenance.how == "summary"


def _ids(messages: list[ViewMessage]) -> list[str]:
    """Every event id the messages stand for, in order, without repeats."""
    seen: dict[str, None] = {}
    for m in messages:
        for i in m.provenance.event_ids:
            seen.setdefault(i, None)
    return list(seen)


def cut_to_tokens(tokenizer: Any, text: str, limit: int) -> str:
    """`text` cut to at most `limit` tokens of `tokenizer` (whole characters; unchanged when it fits)."""
    if limit <= 0:
        return ""
    if tokenizer.count(text) <= limit:
        return text
    cut = tokenizer.decode(tokenizer.encode(text)[:limit]).rstrip("\ufffd")
    while cut and tokenizer.count(cut) > limit:
        cut = cut[:-1]
    return cut.rstrip() + " [..]" if tokenizer.count(cut.rstrip() + " [..]") <= limit else cut
