"""`mask-observations`: replace old tool outputs with a short placeholder (L2).

Tool outputs outside the newest `keep_last` assistant turns are replaced by a placeholder naming the
event id and the output's original size in tokens ("The Complexity Trap", 2025, kept a 10-turn window).
The raw output stays in the log. If the masked view is still over budget, the window of unmasked turns
shrinks (down to the newest turn); if that is still not enough and `fallback="window"`, the oldest turn
groups are dropped as `window` does.
"""

from __future__ import annotations

from typing import Any, Mapping

from ctxkit.compress.base import BaseCompressor, CompressionRequest, require_choice, require_fraction, require_int
from ctxkit.compress.window import base_messages, estimate_size, fit_window
from ctxkit.errors import ConfigError
from ctxkit.events import ToolResult, content_text
from ctxkit.view import View, apply_edits

DEFAULT_PLACEHOLDER = "[tool output {event_id} masked: {n_tokens} tokens]"


class MaskObservations(BaseCompressor):
    """Mask tool outputs older than the newest `keep_last` assistant turns."""

    NAME = "mask-observations"
    VERSION = 1
    DEFAULTS: Mapping[str, Any] = {
        "keep_last": 10,
        "placeholder": DEFAULT_PLACEHOLDER,
        "fallback": "window",
        "keep_first": 2,
        "target_fraction": 0.75,
    }
    """`keep_last`: assistant turns whose tool outputs stay unmasked; `placeholder`: format string with
    `{event_id}`, `{n_tokens}` and `{name}`; `fallback`: `"window"` drops oldest turns when masking is not
    enough, `"none"` leaves it to the builder's budget check; `keep_first`: messages the fallback keeps;
    `target_fraction`: if masking beyond `keep_last` leaves the view above `target_fraction * budget`,
    fewer turns stay unmasked (halving down to 1), then the fallback cuts to that size."""

    def check_params(self, p: Mapping[str, Any]) -> None:
        require_int(self.NAME, p, "keep_last", minimum=0)
        require_int(self.NAME, p, "keep_first", minimum=0)
        require_choice(self.NAME, p, "fallback", ("window", "none"))
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
        p = self.params
        view = request.view
        originals = _tool_results(request)
        keeps = [p["keep_last"]]
        while keeps[-1] > 1:
            keeps.append(keeps[-1] // 2)
        edits: list[dict[str, Any]] = []
        size = n_tokens
        used_keep = p["keep_last"]
        target = int(p["target_fraction"] * request.budget)
        for i, keep in enumerate(keeps):
            edits = mask_edits(request, view, keep, p["placeholder"], originals)
            candidate = apply_edits(view, edits, where=self.spec.name) if edits else view
            used_keep = keep
            # measure exactly only a candidate estimated to fit (or the last one)
            if i < len(keeps) - 1 and estimate_size(request.tokenizer, view, n_tokens, candidate) > target:
                continue
            size = request.measure(candidate)
            if size <= target:
                break
        details: dict[str, Any] = {"masked": sum(1 for e in edits if e["op"] == "mask"), "keep_last_used": used_keep}
        if size > target and p["fallback"] == "window":
            candidate = apply_edits(view, edits, where=self.spec.name) if edits else view
            more, _, size = fit_window(request, candidate, size, keep_first=p["keep_first"], target=target,
                                       who=self.spec.name)
            edits = edits + more
        details["tokens_after"] = size
        return edits, details


def _tool_results(request: CompressionRequest) -> dict[str, ToolResult]:
    return {e.id: e for e in request.events if isinstance(e, ToolResult) and e.id}


def mask_edits(
    request: CompressionRequest,
    view: View,
    keep_last: int,
    placeholder: str,
    originals: Mapping[str, ToolResult],
) -> list[dict[str, Any]]:
    """Mask edits for every unmasked tool message outside the newest `keep_last` assistant turns."""
    msgs = base_messages(view)
    assistant_at = [i for i, m in enumerate(msgs) if m.role == "assistant"]
    cutoff = assistant_at[-keep_last] if 0 < keep_last <= len(assistant_at) else (len(msgs) if keep_last == 0 else 0)
    edits: list[dict[str, Any]] = []
    for m in msgs[:cutoff]:
        if m.role != "tool" or m.provenance.how not in ("verbatim", "truncated"):
            continue
        eid = m.provenance.event_ids[0]
        original = originals.get(eid)
        text = content_text(original.content) if original is not None else m.content
        n = request.tokenizer.count(text)
        edits.append({"op": "mask", "event_id": eid,
                      "text": placeholder.format(event_id=eid, n_tokens=n, name=m.name or "tool")})
    return edits
