"""`keep-all`: no compression. Over budget is an error, or, if asked, a recorded overflow."""

from __future__ import annotations

from typing import Any, Mapping

from ctxkit.context.compress.base import BaseCompressor, CompressionRequest, require_choice
from ctxkit.errors import BudgetError


class KeepAll(BaseCompressor):
    """Keep every message. `on_overflow="error"` (default) raises `BudgetError` naming the sizes;
    `on_overflow="truncate"` records a `Compaction` with no edits and `details["overflow"]`, and the
    builder returns the over-budget context marked `truncated` (the episode should end `truncated`,
    cause `context_budget`)."""

    NAME = "keep-all"
    VERSION = 1
    FITS_BUDGET = False
    DEFAULTS: Mapping[str, Any] = {"on_overflow": "error"}

    def check_params(self, p: Mapping[str, Any]) -> None:
        require_choice(self.NAME, p, "on_overflow", ("error", "truncate"))

    def propose(self, request: CompressionRequest, n_tokens: int):
        if n_tokens <= request.budget:
            return None
        if self.params["on_overflow"] == "error":
            raise BudgetError(
                f"{self.spec.name}: the context is {n_tokens} tokens, over the budget of {request.budget} tokens "
                f"({len(request.view.messages)} messages, nothing dropped); use a compressing strategy, a larger "
                "budget, or on_overflow='truncate' to end the episode as truncated"
            )
        return [], {"overflow": True, "budget": request.budget, "tokens": n_tokens}
