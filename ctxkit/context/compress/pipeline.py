"""`pipeline`: run several compressors in order, each on the view the previous ones produced.

The pipeline's own trigger gates the whole run; then each stage keeps its own trigger. The pipeline's
compaction carries the concatenation of the stages' edits (so one event records the whole decision) and
each stage's details.

Version-1 stages (`mask-observations`, `truncate-tool-output`, `summarize`, which carry a built-in window
`fallback`): a stage other than the last gets `fallback="none"` unless its params set it, so later
stages get their turn before turns are dropped. Version-2 stages do one thing and have no fallback: put
a `window` stage last to guarantee the budget (as the presets in `ctxkit.context.compress.presets` do).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ctxkit.context.compress.base import BaseCompressor, CompressionRequest
from ctxkit.edits import Edit
from ctxkit.errors import ConfigError
from ctxkit.events import Compaction
from ctxkit.context.view import apply_edits
from ctxkit.context.compress import compressor_class, make_compressor

DEFAULT_STAGES: tuple[Mapping[str, Any], ...] = (
    {"name": "truncate-tool-output", "params": {}},
    {"name": "mask-observations", "params": {}},
)
"""The default `stages` (version-1 strategies: recorded specs name them, so the default keeps its meaning)."""


class Pipeline(BaseCompressor):
    """Compose compressors: `stages=[{"name": ..., "params": {...}}, ...]`, applied in order."""

    NAME = "pipeline"
    VERSION = 1
    DEFAULTS: Mapping[str, Any] = {"stages": [dict(s) for s in DEFAULT_STAGES]}
    """`stages`: the compressors to run, each `{"name": registry name, "params": {...}}`."""

    def check_params(self, p: Mapping[str, Any]) -> None:
        stages = p["stages"]
        if not isinstance(stages, (list, tuple)) or not stages:
            raise ConfigError(f"{self.NAME}: parameter 'stages' must be a non-empty list of {{'name', 'params'}}")

        self.stages = []
        for i, st in enumerate(stages):
            if isinstance(st, str):
                st = {"name": st}
            if not isinstance(st, Mapping) or "name" not in st or set(st) - {"name", "params"}:
                raise ConfigError(f"{self.NAME}: stage {i} is {st!r}; expected {{'name': str, 'params': {{...}}}}")
            params = dict(st.get("params") or {})
            try:
                cls = compressor_class(st["name"])
                if i < len(stages) - 1 and "fallback" in getattr(cls, "DEFAULTS", {}) and "fallback" not in params:
                    params["fallback"] = "none"  # only the last stage falls back to dropping turns
                self.stages.append(make_compressor(st["name"], **params))
            except ConfigError as exc:
                raise ConfigError(f"{self.NAME}: stage {i}: {exc}") from None

    @property
    def fits_budget(self) -> bool:
        """True when some stage alone brings the view within the budget."""
        return any(getattr(stage, "fits_budget", True) for stage in self.stages)

    def compact(self, request: CompressionRequest) -> Compaction | None:
        fire, n = self.triggered(request)
        if not fire:
            return None
        edits: list[Edit] = []
        stage_details: list[dict[str, Any]] = []
        overflow = False
        for stage in self.stages:
            c = stage.compact(request)
            if c is None:
                continue
            edits.extend(c.edits)
            stage_details.append({"compressor": c.compressor, "details": dict(c.details)})
            overflow = overflow or bool(c.details.get("overflow"))
            if c.edits:
                request = dataclasses.replace(request, view=apply_edits(request.view, c.edits, where=c.compressor))
        if not edits and not overflow:
            return None
        details: dict[str, Any] = {"tokens_before": n, "stages": stage_details}
        if overflow:
            details["overflow"] = True
        return Compaction(compressor=self.spec.name, params=dict(self.spec.params), edits=tuple(edits), details=details)
