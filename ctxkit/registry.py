"""Lazy registries: explicit dicts of `name -> "module:Class"`, imported only when a name is used.

L0: imports nothing from ctxkit but `errors`.
"""

from __future__ import annotations

import importlib
from typing import Mapping

from ctxkit.errors import ConfigError


def load_registered(registry: Mapping[str, str], name: str, what: str) -> type:
    """The class registered under `name` in `registry`.

    `ConfigError` naming the registered names when `name` is unknown, and naming the target when its
    module (or one of its optional dependencies) cannot be imported or lacks the class. `what` is the
    kind of thing, e.g. "compressor", for the messages.
    """
    target = registry.get(name)
    if target is None:
        raise ConfigError(f"unknown {what} {name!r}; registered {what}s: {sorted(registry)}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what} {name!r} is registered as {target} but cannot be imported: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"{what} {name!r} is registered as {target}, but {module_name} has no {attr}") from None
