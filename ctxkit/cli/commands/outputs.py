"""Output files of the subcommands: checked up front, written whole or not at all.

`check_output(path, option)` refuses, before any work is done, an output that is a folder (or is
spelled as one, `out/`) or that lies under a regular file. `atomic_output(path, option)` gives a temporary
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


def check_output(path: str | os.PathLike, option: str, *, probe: bool = False) -> Path:
    """`path` as a `Path` if it can name a new output file; else a `ConfigError` naming `option`.

    With `probe`, a file is created and removed beside `path` (when its folder exists), so an unwritable
    place fails here, before any work is done, rather than after it."""
    text = os.fspath(path)
    out = Path(text)
    if text.endswith(("/", os.sep)) or out.is_dir():
        raise ConfigError(f"{option} {text}: is a folder; expected a file path")
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
        raise ConfigError(f"{option} {out}: already exists; choose a new file") from None
    except (PermissionError, NotImplementedError):  # no hard links here
        if out.exists():
            raise ConfigError(f"{option} {out}: already exists; choose a new file") from None
        os.replace(tmp, out)
