"""Argument types shared by the subcommands: integers with a lower bound, checked while parsing.

A bad value becomes the parser's one-line `ctxkit: error:` naming the option (see `ctxkit.cli.parser.CliParser`).
"""

from __future__ import annotations

import argparse
from typing import Callable


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type=` accepting integers `>= minimum` (the error names the bound and the value)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


non_negative_int = int_at_least(0)
"""argparse type: an integer >= 0 (e.g. `--max-tokens`)."""

positive_int = int_at_least(1)
"""argparse type: an integer >= 1 (e.g. `--turns`, `--repeats`, `--budget`)."""
