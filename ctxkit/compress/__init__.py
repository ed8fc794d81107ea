"""Compressors: the registry of compaction strategies (L2).

`COMPRESSORS` is the explicit registry (name -> `"module:Class"`), imported lazily so heavy
dependencies (sentence-transformers, faiss, torch) load only when that strategy is used. Nothing
registers itself by import side effect. Each class exposes `NAME`, `VERSION`, `DEFAULTS` and is built
with keyword parameters; `make_compressor` validates them.
"""

from __future__ import annotations

from typing import Any, Mapping

from ctxkit.compress.base import (
    CompressionRequest,
    Compressor,
    CompressorSpec,
    split_versioned,
)
from ctxkit.errors import ConfigError
from ctxkit.registry import load_registered

COMPRESSORS: dict[str, str] = {
    "keep-all": "ctxkit.compress.keep_all:KeepAll",
    "window": "ctxkit.compress.window:Window",
    "mask-observations": "ctxkit.compress.mask_observations:MaskObservations",
    "truncate-tool-output": "ctxkit.compress.truncate_tool_output:TruncateToolOutput",
    "summarize": "ctxkit.compress.summarize:Summarize",
    "retrieve": "ctxkit.compress.retrieve:Retrieve",
    "pipeline": "ctxkit.compress.pipeline:Pipeline",
}
"""Registry name -> `"module:Class"`."""

__all__ = [
    "COMPRESSORS",
    "CompressionRequest",
    "Compressor",
    "CompressorSpec",
    "compressor_class",
    "compressor_defaults",
    "make_compressor",
]


def compressor_class(name: str) -> type:
    """The class registered under `name` (a versioned name such as `window-v1` is accepted and checked)."""
    base, version = split_versioned(name)
    if name in COMPRESSORS:
        base, version = name, None
    if base not in COMPRESSORS:
        raise ConfigError(f"unknown compressor {name!r}; registered compressors: {sorted(COMPRESSORS)}")
    cls = load_registered(COMPRESSORS, base, "compressor")
    if version is not None and version != cls.VERSION:
        raise ConfigError(f"compressor {name!r}: this ctxkit has {base}-v{cls.VERSION}, not version {version}")
    return cls


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
