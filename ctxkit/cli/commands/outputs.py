"""Output files of the subcommands: checked up front, written whole or not at all.

`check_output(path, option)` refuses, before any work is done, an output that is a folder (or is
spelled as one, `out/`) or that lies under a regular file, and, with `force=False`, one that exists: the one
overwrite rule of every subcommand that writes a file (`samples -o`, `import -o/--out-dir`, `mismatch
--json/--plot`): an existing output is refused with a `ConfigError` naming it and `--force` unless the
command was given `--force` (`FORCE_HELP`). `atomic_output(path, option)` gives a temporary
path in the same folder (same suffix, so writers that pick a format by suffix still do) and renames it
into place only when the block succeeds; on any failure the temporary file is removed and an `OSError`
becomes a `ConfigError` naming the option, the path and the reason.
"""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ctxkit.errors import ConfigError


FORCE_HELP = "replace output files that already exist (without it an existing output is refused)"
"""Help text of every subcommand's `--force`."""


def add_force(parser) -> None:
    """Add the `--force` flag of the overwrite rule to a subcommand's parser."""
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)


def refuse_existing(path: str | os.PathLike, option: str, force: bool) -> None:
    """The overwrite rule: a `ConfigError` naming `option`, `path` and `--force` when `path` exists and
    `force` is off."""
    if not force and os.path.lexists(path):
        raise ConfigError(f"{option} {shown(path)}: already exists; pass --force to replace it, or choose a new file")


def check_output(path: str | os.PathLike, option: str, *, probe: bool = False, force: bool | None = None) -> Path:
    """`path` as a `Path` if it can name a new output file; else a `ConfigError` naming `option`.

    With `probe`, a file is created and removed beside `path` (when its folder exists), so an unwritable
    place fails here, before any work is done, rather than after it. With `force` given (True or False),
    the overwrite rule applies too (`refuse_existing`): False refuses an existing file."""
    text = os.fspath(path)
    out = Path(text)
    if text.endswith(("/", os.sep)) or out.is_dir():
        raise ConfigError(f"{option} {text}: is a folder; expected a file path")
    if force is not None:
        refuse_existing(out, option, force)
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{option} {text}: {parent} is a file, not a folder")
            break
    if probe and out.parent.is_dir():
        tmp = _temp_beside(out)
        try:
            with open(tmp, "xb"):
                pass
            tmp.unlink()
        except OSError as exc:
            raise os_error(option, path, exc) from None
    return out


def shown(path: str | os.PathLike) -> str:
    """`path` as printable text: a file name that is not UTF-8 (surrogate-escaped bytes) shows its bytes as
    `\\xNN` instead of failing to print."""
    return safe_text(os.fspath(path))


def safe_text(value):
    """`value` with every string (in nested dicts, lists and tuples too) made valid UTF-8: the surrogate-escaped
    bytes of a non-UTF-8 file name become `\\xNN` text, so it can be recorded in JSON (a log, a samples file)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            try:
                return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            except UnicodeEncodeError:  # a lone surrogate that is no escaped byte
                return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {safe_text(k): safe_text(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(safe_text(v) for v in value)
    return value


def os_error(option: str, path: str | os.PathLike, exc: OSError) -> ConfigError:
    """A `ConfigError` for an `OSError` met while writing `option`'s output `path`."""
    reason = exc.strerror or type(exc).__name__
    return ConfigError(f"{option} {os.fspath(path)}: cannot write: {reason}")


def _temp_beside(out: Path) -> Path:
    """A fresh hidden name in `out`'s folder, keeping `out`'s suffix."""
    return out.with_name(f".{out.stem}.{secrets.token_hex(4)}.tmp{out.suffix}")


@contextmanager
def atomic_output(path: str | os.PathLike, option: str, *, replace: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `path`; move it to `path` when the block succeeds, remove it (and a
    `<temp>.lock` a log writer left) when the block fails. The folder is created when missing. With
    `replace=False` an existing `path` is refused rather than replaced. An `OSError` from the block (keep
    only the writing in it) or the move is reported as a `ConfigError` naming `option` and `path`."""
    out = check_output(path, option)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(option, path, exc) from None
    tmp = _temp_beside(out)
    try:
        yield tmp
        if replace:
            os.replace(tmp, out)
        else:
            _move_no_replace(tmp, out, option)
    except OSError as exc:
        raise os_error(option, path, exc) from None
    finally:
        for leftover in (tmp, Path(f"{tmp}.lock")):
            try:
                leftover.unlink(missing_ok=True)
            except OSError:
                pass


def _move_no_replace(tmp: Path, out: Path, option: str) -> None:
    """Rename `tmp` to `out` unless `out` exists (a hard link where the filesystem has them)."""
    try:
        os.link(tmp, out)
    except FileExistsError:
        raise ConfigError(f"{option} {shown(out)}: already exists; pass --force to replace it, or choose a new file") from None
    except (PermissionError, NotImplementedError):  # no hard links here
        if out.exists():
            raise ConfigError(f"{option} {shown(out)}: already exists; pass --force to replace it, or choose a new file") from None
        os.replace(tmp, out)
