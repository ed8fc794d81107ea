"""The `ctxkit` command line: `parser` builds the argument parser and dispatches to one module per
subcommand in `commands/` (thin: parse, call the library, print). Imports every layer below.
"""

from __future__ import annotations

from ctxkit.registry import lazy_face

_EXPORTS: dict[str, str] = {
    "main": "ctxkit.cli.parser",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
