"""Named pipelines: one thing, then `window`.

Each preset is a `pipeline` with fixed stages and flat parameters (the ones its stages take), recorded
under its own versioned name, e.g. `mask-then-window-v1`:

| preset                  | stages                                                        |
|-------------------------|---------------------------------------------------------------|
| `mask-then-window`      | `mask-observations-v2`, then `window` when above `target_fraction * budget` |
| `truncate-then-window`  | `truncate-tool-output-v2`, then `window` when over budget (cut to `target_fraction * budget`) |
| `summarize-then-window` | `summarize-v2`, then `window` when still over budget          |
| `mask-then-window-v2`   | `mask-observations-v3`, then `window` (as `mask-then-window`)  |
| `truncate-then-window-v2` | `truncate-tool-output-v3`, then `window` (as `truncate-then-window`) |

With the same parameters, each gives exactly the views (and token ids) of the version-1 strategy with
its built-in `fallback="window"` (`ctxkit.context.compress.with_window_fallback`); only the recorded `Compaction` differs (the
preset's name, and one `details["stages"]` entry per stage). The preset's `trigger` decides when the
pipeline runs; its stages then run at every such call (their own trigger is `every_turn`, except the
window stage of `truncate-then-window` and `summarize-then-window`, which runs only over budget).
"""

from __future__ import annotations

from typing import Any, Mapping

from ctxkit.context.compress.mask_observations import DEFAULT_PLACEHOLDER
from ctxkit.context.compress.pipeline import Pipeline
from ctxkit.context.compress.summarize import Summarize
from ctxkit.errors import ConfigError
from ctxkit.context.compress import make_compressor


class Preset(Pipeline):
    """A pipeline whose stages are derived from flat parameters (override `stage_specs`)."""

    NAME = ""
    VERSION = 1
    DEFAULTS: Mapping[str, Any] = {}

    def stage_specs(self, p: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """`(registry name, params)` of each stage, from this preset's parameters (override)."""
        raise NotImplementedError

    def check_params(self, p: Mapping[str, Any]) -> None:
        self.stages = []
        for name, params in self.stage_specs(p):
            try:
                self.stages.append(make_compressor(name, **params))
            except ConfigError as exc:
                raise ConfigError(f"{self.NAME}: {exc}") from None


class MaskThenWindow(Preset):
    """`mask-observations-v2`, then `window` (the views of `mask-observations-v1` with `fallback="window"`)."""

    NAME = "mask-then-window"
    DEFAULTS: Mapping[str, Any] = {
        "keep_last": 10,
        "placeholder": DEFAULT_PLACEHOLDER,
        "keep_first": 2,
        "target_fraction": 0.75,
    }
    """`keep_last`, `placeholder`: as `mask-observations-v2`; `target_fraction`: masking shrinks its
    unmasked window, and then `window` drops turns, until the view is at most `target_fraction * budget`;
    `keep_first`: leading messages `window` keeps."""

    def stage_specs(self, p: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        return [
            ("mask-observations-v2", {"trigger": "every_turn", "keep_last": p["keep_last"],
                                      "placeholder": p["placeholder"], "target_fraction": p["target_fraction"]}),
            ("window", {"trigger": "every_turn", "keep_first": p["keep_first"], "keep_last": 1,
                        "target_fraction": p["target_fraction"]}),
        ]


class TruncateThenWindow(Preset):
    """`truncate-tool-output-v2`, then `window` when still over budget (the views of
    `truncate-tool-output-v1` with `fallback="window"`)."""

    NAME = "truncate-then-window"
    DEFAULTS: Mapping[str, Any] = {"max_tokens": 256, "keep": "head_tail", "keep_first": 2, "target_fraction": 0.75}
    """`max_tokens`, `keep`: as `truncate-tool-output-v2`; `keep_first`, `target_fraction`: the `window`
    stage's, which runs only when the capped view is over budget."""

    def stage_specs(self, p: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        return [
            ("truncate-tool-output-v2", {"trigger": "every_turn", "max_tokens": p["max_tokens"], "keep": p["keep"]}),
            ("window", {"trigger": "over_budget", "keep_first": p["keep_first"], "keep_last": 1,
                        "target_fraction": p["target_fraction"]}),
        ]


class MaskThenWindowV2(MaskThenWindow):
    """`mask-then-window-v2`: `mask-observations-v3` (placeholders give in-context counts), then `window`."""

    VERSION = 2

    def stage_specs(self, p: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        (_, mask), window = super().stage_specs(p)
        return [("mask-observations-v3", mask), window]


class TruncateThenWindowV2(TruncateThenWindow):
    """`truncate-then-window-v2`: `truncate-tool-output-v3` (cuts from in-context ids), then `window` when
    still over budget."""

    VERSION = 2

    def stage_specs(self, p: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        (_, truncate), window = super().stage_specs(p)
        return [("truncate-tool-output-v3", truncate), window]


class SummarizeThenWindow(Preset):
    """`summarize-v2`, then `window` when still over budget (the views of `summarize-v1` with
    `fallback="window"`)."""

    NAME = "summarize-then-window"
    DEFAULTS: Mapping[str, Any] = dict(Summarize.DEFAULTS)
    """As `summarize-v2` (`keep_first` is also the `window` stage's)."""

    def __init__(self, **params: Any) -> None:
        given = params.get("summarizer")
        self._summarizer = None if given is None or isinstance(given, str) else given
        if self._summarizer is not None:  # recorded by id; the stage gets the instance
            params = {**params, "summarizer": str(getattr(given, "id", given))}
        super().__init__(**params)

    def stage_specs(self, p: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        summarize = {k: p[k] for k in Summarize.DEFAULTS}
        if self._summarizer is not None:
            summarize["summarizer"] = self._summarizer
        return [
            ("summarize-v2", {"trigger": "every_turn", **summarize}),
            ("window", {"trigger": "over_budget", "keep_first": p["keep_first"], "keep_last": 1,
                        "target_fraction": 1.0}),
        ]
