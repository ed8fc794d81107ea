"""Arguments shared by the subcommands: integers with a lower bound, checked while parsing, and the
`--tokenizer`/`--template` options, declared once here.

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


def add_render_options(parser: argparse.ArgumentParser, *, purpose: str = "render with", default: str | None = None,
                       required: bool = False) -> None:
    """`--tokenizer` (what to `purpose`: a folder, hub id or `tiktoken:<encoding>`; `default` says what is used
    without it) and `--template` (name-vN or a .jinja path; the tokenizer's own without it)."""
    where = "required" if required else f"default: {default}" if default else "optional"
    parser.add_argument("--tokenizer", metavar="T", default=None, required=required,
                        help=f"tokenizer to {purpose}: a folder, hub id or tiktoken:<encoding> ({where})")
    parser.add_argument("--template", metavar="S", default=None,
                        help="chat template: name-vN or a .jinja path (default: the tokenizer's own)")


def add_recorded_overrides(parser: argparse.ArgumentParser) -> None:
    """`--tokenizer`/`--template` replacing the recorded ones when replaying a log (their ids must match it)."""
    for option in ("tokenizer", "template"):
        parser.add_argument(f"--{option}", metavar="SPEC", default=None,
                            help=f"{option} to replay with instead of the recorded one (its id must match)")
