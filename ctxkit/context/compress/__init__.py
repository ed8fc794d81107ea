"""Compressors: the registry of compaction strategies.

`COMPRESSORS` is the explicit registry (name -> `"module:Class"`), imported lazily so heavy
dependencies (sentence-transformers, faiss, torch) load only when that strategy is used. Nothing
registers itself by import side effect. Each class exposes `NAME`, `VERSION`, `DEFAULTS` and is built
with keyword parameters; `make_compressor` validates them.

Names and versions. Every compressor records a versioned name (`<name>-v<N>`) in the log, and any
recorded name can be made again: `window-v1`, `mask-observations-v1`, `mask-then-window-v1`, ...

- An un-suffixed name always means the version it named when it was first released (version 1), so a
  config or log that names it never changes meaning under it. `mask-observations`,
  `truncate-tool-output` and `summarize` are therefore version 1: each does its own compression and
  then, with its default `fallback="window"`, drops the oldest turns itself (`ctxkit.context.compress.with_window_fallback`).
- `<name>-v2` names a later version explicitly. `mask-observations-v2`, `truncate-tool-output-v2` and
  `summarize-v2` do one thing only and have no `fallback`: alone they may leave a view over budget (the
  builder then raises `BudgetError`).
- `mask-observations-v3` and `truncate-tool-output-v3` (`ctxkit.context.compress.sized_in_context`) are version 2 with sizes
  counted in context: read off the builder's render of the view instead of encoding each output again
  (the placeholder's count and the truncation marker's may differ by a token from version 2's).
  `mask-then-window-v2` and `truncate-then-window-v2` follow them with `window`.
- `retrieve-v2` keeps fewer than `keep_last` newest turn groups (down to one) when they do not fit, where
  `retrieve` (version 1) fails the build.
- Presets compose one thing with `window` as an explicit pipeline (`ctxkit.context.compress.presets`):
  `mask-then-window`, `truncate-then-window`, `summarize-then-window`. With the same parameters they
  give the same views as the version-1 strategies; prefer them (or a `pipeline` of your own) in new
  configs.

`fits_budget` on a compressor says whether it alone brings an over-budget view within the budget.
"""

from __future__ import annotations

from typing import Any, Mapping

from ctxkit.context.compress.base import (
    CompressionRequest,
    Compressor,
    CompressorSpec,
    split_versioned,
    versioned,
)
from ctxkit.errors import ConfigError
from ctxkit.registry import load_registered

COMPRESSORS: dict[str, str] = {
    "keep-all": "ctxkit.context.compress.keep_all:KeepAll",
    "window": "ctxkit.context.compress.window:Window",
    "mask-observations": "ctxkit.context.compress.with_window_fallback:MaskObservationsV1",
    "mask-observations-v2": "ctxkit.context.compress.mask_observations:MaskObservations",
    "truncate-tool-output": "ctxkit.context.compress.with_window_fallback:TruncateToolOutputV1",
    "truncate-tool-output-v2": "ctxkit.context.compress.truncate_tool_output:TruncateToolOutput",
    "mask-observations-v3": "ctxkit.context.compress.sized_in_context:MaskObservationsV3",
    "truncate-tool-output-v3": "ctxkit.context.compress.sized_in_context:TruncateToolOutputV3",
    "summarize": "ctxkit.context.compress.with_window_fallback:SummarizeV1",
    "summarize-v2": "ctxkit.context.compress.summarize:Summarize",
    "retrieve": "ctxkit.context.compress.retrieve:Retrieve",
    "retrieve-v2": "ctxkit.context.compress.retrieve:RetrieveV2",
    "pipeline": "ctxkit.context.compress.pipeline:Pipeline",
    "mask-then-window": "ctxkit.context.compress.presets:MaskThenWindow",
    "truncate-then-window": "ctxkit.context.compress.presets:TruncateThenWindow",
    "summarize-then-window": "ctxkit.context.compress.presets:SummarizeThenWindow",
    "mask-then-window-v2": "ctxkit.context.compress.presets:MaskThenWindowV2",
    "truncate-then-window-v2": "ctxkit.context.compress.presets:TruncateThenWindowV2",
}
"""Registry name -> `"module:Class"`. An un-suffixed name is version 1 of its strategy; `<name>-v<N>`
entries are later versions; `<name>-v<N>` for a version registered un-suffixed resolves to that entry."""

__all__ = [
    "COMPRESSORS",
    "CompressionRequest",
    "Compressor",
    "CompressorSpec",
    "compressor_class",
    "compressor_defaults",
    "make_compressor",
    "versioned_name",
]


def compressor_class(name: str) -> type:
    """The class registered under `name`, or the one whose versioned name is `name` (e.g. `window-v1`,
    `mask-observations-v2`). `ConfigError` naming the registered names, or the known versions of that
    strategy, otherwise."""
    if not isinstance(name, str):
        raise ConfigError(f"compressor name {name!r} is not a string; registered compressors: {sorted(COMPRESSORS)}")
    if name in COMPRESSORS:
        return load_registered(COMPRESSORS, name, "compressor")
    base, version = split_versioned(name)
    if version is None or base not in COMPRESSORS:
        raise ConfigError(f"unknown compressor {name!r}; registered compressors: {sorted(COMPRESSORS)}")
    cls = load_registered(COMPRESSORS, base, "compressor")
    if version != cls.VERSION:
        known = [f"{base}-v{cls.VERSION}"] + sorted(n for n in COMPRESSORS if split_versioned(n)[0] == base and n != base)
        raise ConfigError(f"compressor {name!r}: this ctxkit has no version {version} of {base!r}; known versions: {known}")
    return cls


def versioned_name(name: str) -> str:
    """The versioned name a compressor registered (or versioned) as `name` records: `"window"` ->
    `"window-v1"`, `"mask-observations-v2"` -> `"mask-observations-v2"`."""
    cls = compressor_class(name)
    return versioned(cls.NAME, cls.VERSION)


def make_compressor(name_or_spec: str | CompressorSpec | Mapping[str, Any] | Compressor, **params: Any) -> Compressor:
    """A compressor from a registry name (optionally versioned), a `CompressorSpec`, a `{"name", "params"}`
    dict, or an existing instance (returned as is). Keyword `params` override the spec's."""
    if isinstance(name_or_spec, CompressorSpec):
        name, base_params = name_or_spec.name, dict(name_or_spec.params)
    elif isinstance(name_or_spec, Mapping):
        if "name" not in name_or_spec:
            raise ConfigError(f"compressor spec {dict(name_or_spec)!r} has no 'name'")
        name, base_params = name_or_spec["name"], dict(name_or_spec.get("params") or {})
    elif isinstance(name_or_spec, str):
        name, base_params = name_or_spec, {}
    elif hasattr(name_or_spec, "compact") and hasattr(name_or_spec, "spec"):
        if params:
            raise ConfigError("parameters cannot be given together with a compressor instance")
        return name_or_spec  # type: ignore[return-value]
    else:
        raise ConfigError(f"cannot make a compressor from {name_or_spec!r}")
    cls = compressor_class(name)
    return cls(**{**base_params, **params})


def compressor_defaults() -> dict[str, dict[str, Any]]:
    """Registry name -> default parameters (every parameter the compressor accepts, common ones included)."""
    out: dict[str, dict[str, Any]] = {}
    for name in COMPRESSORS:
        cls = compressor_class(name)
        defaults = cls.all_defaults() if hasattr(cls, "all_defaults") else dict(cls.DEFAULTS)
        out[name] = dict(defaults)
    return out
