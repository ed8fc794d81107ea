"""`mask-observations-v2`: replace old tool outputs with a short placeholder, and nothing else.

Tool outputs outside the newest `keep_last` assistant turns are replaced by a placeholder naming the
event id and the output's original size in tokens ("The Complexity Trap", 2025, kept a 10-turn window).
The raw output stays in the log. If the masked view is still above `target_fraction * budget`, the
window of unmasked turns shrinks (halving down to the newest turn). Masking alone may leave the view
over budget: this version drops no turns. Follow it with `window` (the `mask-then-window` preset) to
guarantee the budget.

Version 1 (the un-suffixed registry name `mask-observations`, `ctxkit.context.compress.with_window_fallback`) also drops the
oldest turn groups itself when masking is not enough (`fallback="window"`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from ctxkit.context.compress.base import BaseCompressor, CompressionRequest, require_fraction, require_int
from ctxkit.context.compress.turns import SizeEstimate, base_messages
from ctxkit.edits import MaskEdit
from ctxkit.errors import ConfigError
from ctxkit.events import ToolResult, content_text
from ctxkit.context.view import View, ViewMessage, apply_edits

DEFAULT_PLACEHOLDER = "[tool output {event_id} masked: {n_tokens} tokens]"


class MaskObservations(BaseCompressor):
    """Mask tool outputs older than the newest `keep_last` assistant turns (version 2: masking only)."""

    NAME = "mask-observations"
    VERSION = 2
    FITS_BUDGET = False
    DEFAULTS: Mapping[str, Any] = {
        "keep_last": 10,
        "placeholder": DEFAULT_PLACEHOLDER,
        "target_fraction": 0.75,
    }
    """`keep_last`: assistant turns whose tool outputs stay unmasked; `placeholder`: format string with
    `{event_id}`, `{n_tokens}` and `{name}`; `target_fraction`: if masking beyond `keep_last` leaves the
    view above `target_fraction * budget`, fewer turns stay unmasked (halving down to 1)."""

    def check_params(self, p: Mapping[str, Any]) -> None:
        require_int(self.NAME, p, "keep_last", minimum=0)
        require_fraction(self.NAME, p, "target_fraction")
        ph = p["placeholder"]
        try:
            if not isinstance(ph, str):
                raise TypeError
            ph.format(event_id="e0", n_tokens=0, name="tool")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ConfigError(
                f"{self.NAME}: parameter 'placeholder' {ph!r} is not a format string over "
                f"{{event_id}}, {{n_tokens}}, {{name}} ({exc!r})"
            ) from None

    def propose(self, request: CompressionRequest, n_tokens: int):
        edits, details, _, size = self.mask(request, n_tokens)
        details["tokens_after"] = size
        return edits, details

    def mask(self, request: CompressionRequest, n_tokens: int) -> tuple[list[MaskEdit], dict[str, Any], View, int]:
        """`(edits, details, masked view, its measured size)`: mask beyond `keep_last` turns, halving the
        unmasked window until the view is at most `target_fraction * budget` (or one turn is left).

        A candidate estimated not to fit is skipped without building its view: on a view without pins
        its estimate comes from the masked messages alone (`SizeEstimate.replaced_exceeds`, the same decision
        `estimate_size` gives); only the candidates measured, and the one returned, are built."""
        p = self.params
        view = request.view
        originals = _tool_results(request)
        keeps = [p["keep_last"]]
        while keeps[-1] > 1:
            keeps.append(keeps[-1] // 2)
        estimate = SizeEstimate(request.tokenizer, view, n_tokens)
        plain = not view.active_pins and _single_targets(view)  # replacements alone give the candidate
        edits: list[MaskEdit] = []
        candidate: View | None = view
        size = n_tokens
        used_keep = p["keep_last"]
        target = int(p["target_fraction"] * request.budget)
        count = self.output_counter(request)
        for i, keep in enumerate(keeps):
            changes = mask_changes(request, view, keep, p["placeholder"], originals, count)
            edits = [edit for _, edit in changes]
            used_keep = keep
            candidate = None
            # measure exactly only a candidate estimated to fit (or the last one)
            if i < len(keeps) - 1:
                if count is not None:
                    over = estimate_over(request.tokenizer, n_tokens, changes, count, target)
                elif plain:
                    over = estimate.replaced_exceeds([(m, edit.text) for m, edit in changes], target)
                else:
                    candidate = apply_edits(view, edits, where=self.spec.name) if edits else view
                    over = estimate.of_exceeds(candidate, target)
                if over:
                    continue
            if candidate is None:
                candidate = apply_edits(view, edits, where=self.spec.name) if edits else view
            size = request.measure(candidate)
            if size <= target:
                break
        if candidate is None:  # not reached: the last candidate is always measured
            candidate = apply_edits(view, edits, where=self.spec.name) if edits else view
        return edits, {"masked": len(edits), "keep_last_used": used_keep}, candidate, size


    def output_counter(self, request: CompressionRequest) -> Callable[[ViewMessage], int] | None:
        """The `{n_tokens}` of a masked message, or None for the original output's own token count
        (versions 1 and 2; version 3 overrides it with the tokens the message occupies in the render)."""
        return None


def estimate_over(tokenizer: Any, n_tokens: int, changes: Sequence[tuple[ViewMessage, MaskEdit]],
                  count: Callable[[ViewMessage], int], target: int) -> bool:
    """Whether the view of `n_tokens` tokens, each message of `changes` counted as `count(m)` tokens and
    replaced by its placeholder, is estimated above `target` (version 3: scaffold and boundary merges are
    not estimated; the candidate chosen is measured)."""
    return n_tokens + sum(tokenizer.count(edit.text) - count(m) for m, edit in changes) > target


def _tool_results(request: CompressionRequest) -> dict[str, ToolResult]:
    return {e.id: e for e in request.events if isinstance(e, ToolResult) and e.id}


def mask_edits(
    request: CompressionRequest,
    view: View,
    keep_last: int,
    placeholder: str,
    originals: Mapping[str, ToolResult],
) -> list[MaskEdit]:
    """Mask edits for every unmasked tool message outside the newest `keep_last` assistant turns."""
    return [edit for _, edit in mask_changes(request, view, keep_last, placeholder, originals)]


def mask_changes(
    request: CompressionRequest,
    view: View,
    keep_last: int,
    placeholder: str,
    originals: Mapping[str, ToolResult],
    count: Callable[[ViewMessage], int] | None = None,
) -> list[tuple[ViewMessage, MaskEdit]]:
    """`(message, its mask edit)` for every unmasked tool message outside the newest `keep_last` assistant
    turns, in view order (`mask_edits` without the messages). The placeholder's `{n_tokens}` is `count(m)`
    when given (version 3: the tokens `m` occupies in the render), else the original output's own count."""
    msgs = base_messages(view)
    assistant_at = [i for i, m in enumerate(msgs) if m.role == "assistant"]
    cutoff = assistant_at[-keep_last] if 0 < keep_last <= len(assistant_at) else (len(msgs) if keep_last == 0 else 0)
    out: list[tuple[ViewMessage, MaskEdit]] = []
    for m in msgs[:cutoff]:
        if m.role != "tool" or m.provenance.how not in ("verbatim", "truncated"):
            continue
        eid = m.provenance.event_ids[0]
        if count is not None:
            n = count(m)
        else:
            original = originals.get(eid)
            n = request.tokenizer.count(content_text(original.content) if original is not None else m.content)
        out.append((m, MaskEdit(eid, placeholder.format(event_id=eid, n_tokens=n, name=m.name or "tool"))))
    return out


def _single_targets(view: View) -> bool:
    """Whether `view` has no pinned block and no event stands behind two of its messages, so a mask edit
    naming a message's event replaces that message itself (`ctxkit.context.view` replaces the first message of
    the event) and nothing else changes."""
    seen: set[str] = set()
    for m in view.messages:
        if m.provenance.how == "pinned":
            return False
        for eid in m.provenance.event_ids:
            if eid in seen:
                return False
            seen.add(eid)
    return True
