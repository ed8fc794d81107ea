"""`ctxkit` command line: parses arguments and calls the library (L5, thin).

Each subcommand lives in `ctxkit/commands/<name>.py` exposing `register(subparsers)` which adds its
parser and sets `func` (a callable taking the parsed args and returning an exit code). `COMMANDS` is
the explicit registry; modules import lazily so `ctxkit --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ctxkit.errors import CtxkitError

COMMANDS: dict[str, str] = {
    "render": "ctxkit.commands.render_cmd",
    "inspect": "ctxkit.commands.render_cmd",
    "template": "ctxkit.commands.template_cmd",
    "log": "ctxkit.commands.log_cmd",
    "import": "ctxkit.commands.log_cmd",
    "export": "ctxkit.commands.log_cmd",
    "bench": "ctxkit.commands.bench_cmd",
    "compressors": "ctxkit.commands.build_cmd",
    "build": "ctxkit.commands.build_cmd",
    "replay": "ctxkit.commands.replay_cmd",
    "samples": "ctxkit.commands.replay_cmd",
    "audit": "ctxkit.commands.audit_cmd",
    "ablate": "ctxkit.commands.ablate_cmd",
    "report": "ctxkit.commands.ablate_cmd",
}
"""Subcommand name -> module providing `register_<name>(subparsers)`."""


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every registered subcommand)."""
    parser = argparse.ArgumentParser(prog="ctxkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ctxkit {importlib.import_module('ctxkit').__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        getattr(importlib.import_module(module_name), f"register_{name}")(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `ctxkit` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except CtxkitError as exc:
        print(f"ctxkit: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `ctxkit export LOG | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
