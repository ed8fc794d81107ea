"""Version 1 of `mask-observations`, `truncate-tool-output` and `summarize`: each with a built-in window fallback.

In version 1 each of these strategies did two things: its own compression, then (with the default
`fallback="window"`) dropping the oldest turn groups as `window` does when that was not enough. Version 2
does one thing; "then window" is an explicit pipeline (the `mask-then-window`, `truncate-then-window`
and `summarize-then-window` presets, which give the same views as version 1 with its defaults).

Version 1 stays, unchanged in behaviour, under the un-suffixed registry names (and `<name>-v1`), so the
configs and logs that name it keep their meaning: an `EpisodeStart` recorded with
`{"name": "mask-observations-v1", "params": {..., "fallback": "window"}}` still makes the same compressor.
Each class is its version-2 strategy plus the fallback; `fallback="none"` makes it version 2 in all but
name.
"""

from __future__ import annotations

from typing import Any, Mapping

from ctxkit.context.compress.base import CompressionRequest, require_choice, require_fraction, require_int
from ctxkit.context.compress.mask_observations import DEFAULT_PLACEHOLDER, MaskObservations
from ctxkit.context.compress.summarize import Summarize
from ctxkit.context.compress.truncate_tool_output import TruncateToolOutput
from ctxkit.context.compress.turns import fit_window
from ctxkit.edits import Edit
from ctxkit.context.view import View

FALLBACKS: tuple[str, ...] = ("window", "none")
"""Values of the version-1 `fallback` parameter."""


class MaskObservationsV1(MaskObservations):
    """`mask-observations-v1`: mask old tool outputs, then drop the oldest turns if the masked view is
    still above `target_fraction * budget` (`fallback="window"`)."""

    VERSION = 1
    FITS_BUDGET = True
    DEFAULTS: Mapping[str, Any] = {
        "keep_last": 10,
        "placeholder": DEFAULT_PLACEHOLDER,
        "fallback": "window",
        "keep_first": 2,
        "target_fraction": 0.75,
    }
    """As version 2, plus `fallback`: `"window"` drops oldest turns when masking is not enough, `"none"`
    leaves it to the builder's budget check; `keep_first`: messages the fallback keeps."""

    @property
    def fits_budget(self) -> bool:
        """True with the window fallback on."""
        return self.params["fallback"] == "window"

    def check_params(self, p: Mapping[str, Any]) -> None:
        super().check_params(p)
        require_int(self.NAME, p, "keep_first", minimum=0)
        require_choice(self.NAME, p, "fallback", FALLBACKS)

    def propose(self, request: CompressionRequest, n_tokens: int):
        p = self.params
        edits, details, view, size = self.mask(request, n_tokens)
        target = int(p["target_fraction"] * request.budget)
        if size > target and p["fallback"] == "window":
            more, _, size = fit_window(request, view, size, keep_first=p["keep_first"], target=target, who=self.spec.name)
            edits = edits + more
        details["tokens_after"] = size
        return edits, details


class TruncateToolOutputV1(TruncateToolOutput):
    """`truncate-tool-output-v1`: cap tool outputs, then drop the oldest turns if the capped view is still
    over budget (`fallback="window"`, cutting to `target_fraction * budget`)."""

    VERSION = 1
    FITS_BUDGET = True
    DEFAULTS: Mapping[str, Any] = {"max_tokens": 256, "keep": "head_tail", "fallback": "window", "keep_first": 2,
                                   "target_fraction": 0.75}
    """As version 2, plus `fallback`: `"window"` drops oldest turns if capping leaves the view over budget
    (cutting it to `target_fraction * budget`), `"none"` leaves it to the budget check; `keep_first`:
    messages the fallback keeps."""

    @property
    def fits_budget(self) -> bool:
        """True with the window fallback on."""
        return self.params["fallback"] == "window"

    def check_params(self, p: Mapping[str, Any]) -> None:
        super().check_params(p)
        require_choice(self.NAME, p, "fallback", FALLBACKS)
        require_int(self.NAME, p, "keep_first", minimum=0)
        require_fraction(self.NAME, p, "target_fraction")

    def propose(self, request: CompressionRequest, n_tokens: int):
        p = self.params
        edits, details, view, size = self.truncate(request, n_tokens)
        if size > request.budget and p["fallback"] == "window":
            more, _, size = fit_window(request, view, size, keep_first=p["keep_first"],
                                       target=int(p["target_fraction"] * request.budget), who=self.spec.name)
            edits = edits + more
        details["tokens_after"] = size
        return edits, details


class SummarizeV1(Summarize):
    """`summarize-v1`: summarize older turns, then drop old turn groups if the summary is not enough
    (`fallback="window"`)."""

    VERSION = 1
    FITS_BUDGET = True
    DEFAULTS: Mapping[str, Any] = {**Summarize.DEFAULTS, "fallback": "window"}
    """As version 2, plus `fallback`: `"window"` drops old turns when the summary is not enough, `"none"`
    leaves that to a later pipeline stage or the builder's budget check."""

    @property
    def fits_budget(self) -> bool:
        """True with the window fallback on."""
        return self.params["fallback"] == "window"

    def check_params(self, p: Mapping[str, Any]) -> None:
        require_choice(self.NAME, p, "fallback", FALLBACKS)
        super().check_params(p)

    def finish(self, request: CompressionRequest, edits: list[Edit], details: dict[str, Any], view: View, size: int):
        edits = list(edits)
        if size > request.budget and self.params["fallback"] == "window":
            more, _, size = fit_window(request, view, size, keep_first=self.params["keep_first"], who=self.spec.name)
            if more:
                details["dropped_event_ids"] = list(more[0].event_ids)
            edits += more
        return super().finish(request, edits, details, view, size)
