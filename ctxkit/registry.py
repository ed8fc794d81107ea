"""Lazy registries: explicit dicts of `name -> "module:Class"`, imported only when a name is used, and the
lazy faces of the packages (`lazy_face`).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping

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


def lazy_face(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for a package face: each public name (`name -> defining module`) is
    imported from its module on first use and then kept on the package, so importing a package or any
    module inside it never loads the rest of it."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
