"""`window`: keep the first messages and as many recent turns as fit.

Compaction happens when the trigger fires (by default: the view is over budget) and cuts the view to
`target_fraction` of the budget (default 0.75), so it is amortized over the following turns.

A turn group is an assistant message together with the tool results answering its calls, or any other
single message. Whole groups are dropped, oldest first, so no tool call or result is ever orphaned.
The turn-group helpers live in `ctxkit.context.compress.turns`, shared with the other strategies.
"""

from __future__ import annotations

from typing import Any, Mapping

from ctxkit.context.compress.base import BaseCompressor, CompressionRequest, require_fraction, require_int
from ctxkit.context.compress.turns import fit_window


class Window(BaseCompressor):
    """Keep `keep_first` messages and the newest turn groups that fit in `target_fraction * budget`."""

    NAME = "window"
    VERSION = 1
    DEFAULTS: Mapping[str, Any] = {"keep_first": 2, "keep_last": 1, "target_fraction": 0.75}
    """`keep_first`: leading messages always kept (system, task; extended to a whole group);
    `keep_last`: newest turn groups always kept (at least 1); `target_fraction`: when compacting, keep as
    many recent turns as fit in `target_fraction * budget`. Below 1.0 leaves room, so the next turns
    append without a compaction: consecutive contexts extend each other (KV-cache reuse, training
    samples merge) and compaction cost is amortized. 1.0 refills the budget at every turn."""

    def check_params(self, p: Mapping[str, Any]) -> None:
        require_int(self.NAME, p, "keep_first", minimum=0)
        require_int(self.NAME, p, "keep_last", minimum=1)
        require_fraction(self.NAME, p, "target_fraction")

    def propose(self, request: CompressionRequest, n_tokens: int):
        p = self.params
        target = int(p["target_fraction"] * request.budget)
        if n_tokens <= target:
            return None
        edits, _, n_after = fit_window(request, request.view, n_tokens, keep_first=p["keep_first"],
                                       keep_last=p["keep_last"], target=target, who=self.spec.name)
        return edits, {"tokens_after": n_after}
