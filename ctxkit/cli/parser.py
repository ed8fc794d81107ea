"""`ctxkit` command line: parses arguments and calls the library (thin).

Each subcommand lives in `ctxkit/cli/commands/<name>.py` exposing `register(subparsers)` which adds its
parser and sets `func` (a callable taking the parsed args and returning an exit code). `COMMANDS` is
the explicit registry; modules import lazily so `ctxkit --help` stays fast.

Every failure on bad input is one line on stderr, `ctxkit: error: <what and where>`, and exit status 2:
usage errors (`CliParser`), every `CtxkitError`, and an `OSError` a command lets through (permission,
is-a-folder, no space left), named by its path. Ctrl-C prints `ctxkit: interrupted` and exits 130 (a
command that wants to say more raises a `CtxkitError` or handles `KeyboardInterrupt` itself).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from ctxkit.errors import ConfigError, CtxkitError

COMMANDS: dict[str, str] = {
    "render": "ctxkit.cli.commands.render_cmd",
    "inspect": "ctxkit.cli.commands.render_cmd",
    "template": "ctxkit.cli.commands.template_cmd",
    "log": "ctxkit.cli.commands.log_cmd",
    "import": "ctxkit.cli.commands.log_cmd",
    "export": "ctxkit.cli.commands.log_cmd",
    "bench": "ctxkit.cli.commands.bench_cmd",
    "compressors": "ctxkit.cli.commands.build_cmd",
    "build": "ctxkit.cli.commands.build_cmd",
    "replay": "ctxkit.cli.commands.replay_cmd",
    "samples": "ctxkit.cli.commands.replay_cmd",
    "audit": "ctxkit.cli.commands.audit_cmd",
    "ablate": "ctxkit.cli.commands.ablate_cmd",
    "report": "ctxkit.cli.commands.ablate_cmd",
    "view": "ctxkit.cli.commands.view_cmd",
    "mismatch": "ctxkit.cli.commands.mismatch_cmd",
    "train": "ctxkit.cli.commands.train_cmd",
    "serve": "ctxkit.cli.commands.serve_cmd",
}
"""Subcommand name -> module providing `register_<name>(subparsers)`."""


EXIT_ERROR = 2
"""Exit status of a run stopped by bad input (any `ctxkit: error:` line)."""
EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT)."""


class CliParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are `ConfigError`s, so they print as one `ctxkit: error:`
    line with exit status 2 like every other error (subcommand parsers inherit the class)."""

    def error(self, message: str):  # type: ignore[override]
        """Raise a `ConfigError` `<subcommand>: <message>`; `main` prints it as the error line."""
        where = self.prog.partition(" ")[2]
        raise ConfigError(f"{where + ': ' if where else ''}{message} (see `{self.prog} --help`)")


def os_error_message(exc: OSError) -> str:
    """`<path>: <reason>` for an `OSError` (both paths of a failed rename or link)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    paths = [p for p in (exc.filename, exc.filename2) if p is not None]
    if not paths:  # an unnamed stream: almost always standard output (e.g. `ctxkit export LOG > /dev/full`)
        where = "writing output" if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO) else type(exc).__name__
        return f"{where}: {reason}"
    return " -> ".join(str(p if not isinstance(p, bytes) else p.decode(errors="replace")) for p in paths) + f": {reason}"


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every registered subcommand)."""
    parser = CliParser(prog="ctxkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ctxkit {importlib.import_module('ctxkit').__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        getattr(importlib.import_module(module_name), f"register_{name}")(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `ctxkit` command; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_ERROR
        code = int(args.func(args) or 0)
        _flush_stdout()
        return code
    except CtxkitError as exc:
        return _fail(str(exc))
    except BrokenPipeError:  # e.g. `ctxkit export LOG | head`
        _silence_stdout()
        return 0
    except OSError as exc:  # permission, is-a-folder, no space left: name the path
        return _fail(os_error_message(exc))
    except KeyboardInterrupt:
        print("ctxkit: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _fail(message: str) -> int:
    """Print the one `ctxkit: error:` line (newlines folded) and give the error exit status."""
    print("ctxkit: error: " + " ".join(message.split("\n")).strip(), file=sys.stderr)
    return EXIT_ERROR


def _flush_stdout() -> None:
    """Flush stdout inside `main`, so a full disk or a closed pipe is reported here, naming the stream."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, "standard output") from None


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush after a closed pipe stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
