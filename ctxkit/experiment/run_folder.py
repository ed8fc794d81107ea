"""The files of an ablation run folder: `results.jsonl` rows, `run.json`, and the folder's lock.

Both the runner (which writes a run) and the report (which reads one) use this module; neither imports
the other's internals, so `runner -> report -> run_folder` has no cycle.

- `read_rows(dir)` reads `results.jsonl` strictly: every line must be UTF-8 JSON holding a results row (the
  fields the report needs, with their types), and no episode may appear twice; a `ConfigError` names the
  file and line. `resume=True` (what the runner does before it repairs the file) skips a last line cut
  mid-way by a crash and later rows of an episode already seen.
- `append_row(dir, row)` appends one row and fsyncs it.
- `RunLock(dir)` is an exclusive lock on the run folder (`fcntl.flock` on `DIR/.ctxkit-run.lock`): the OS
  releases it when the process exits, however it dies, so a lock left by a killed run never blocks a rerun.
- `open_run_folder(dir)` checks the path, creates the folder, and takes the lock, with typed errors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping
from filelock import FileLock, Timeout

from ctxkit.errors import ConfigError

__all__ = [
    "RESULTS", "RUN_INFO", "LOCK", "ROW_FIELDS", "TIMING_FIELDS", "read_rows", "read_run_info", "append_row",
    "check_row", "RunLock", "check_out_dir", "open_run_folder",
]

RESULTS = "results.jsonl"
"""Results file name inside a run folder."""
RUN_INFO = "run.json"
"""Run description (config fingerprint and the experiment) inside a run folder."""
LOCK = ".ctxkit-run.lock"
"""Lock file inside a run folder (held while `ctxkit ablate` writes the folder)."""

_NUMBER = (int, float)
ROW_FIELDS: Mapping[str, tuple[type, ...]] = {
    "arm": (str,), "task": (str,), "seed": (int,), "episode_id": (str,), "compressor": (dict,),
    "outcome": (str,), "cause": (str,), "completed": (bool,), "discarded": (bool,), "timed_out": (bool,),
    "quality": _NUMBER, "violations": (int,), "steps": (int,), "tool_calls": (int,), "repeated_tool_calls": (int,),
    "prompt_tokens_total": (int,), "peak_context": (int,), "compression_ratio": _NUMBER, "prefix_reuse": _NUMBER,
    "generated_tokens": (int,), "loss_tokens": (int,), "timing": (dict,),
}
"""Fields every results row holds (the report reads them) and their accepted types."""
TIMING_FIELDS: tuple[str, ...] = ("wall_s", "build_s", "generate_s", "prefill_s", "decode_s", "tool_s", "other_s")
"""Numeric fields of a row's `timing`."""


def _type_name(types: tuple[type, ...]) -> str:
    return "a number" if types == _NUMBER else f"{'an' if types[0] is int else 'a'} {types[0].__name__}"


def check_row(row: Any, where: str) -> dict[str, Any]:
    """`row` if it is a results row (see `ROW_FIELDS`), else a `ConfigError` prefixed with `where`."""
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: not a ctxkit results row (a JSON {type(row).__name__}, expected an object)")
    missing = [k for k in ROW_FIELDS if k not in row]
    if missing:
        raise ConfigError(f"{where}: not a ctxkit results row: missing field(s) {missing}")
    for key, types in ROW_FIELDS.items():
        value = row[key]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise ConfigError(f"{where}: field {key!r} is {value!r}; expected {_type_name(types)}")
    for key in TIMING_FIELDS:
        value = row["timing"].get(key)
        if not isinstance(value, _NUMBER) or isinstance(value, bool):
            raise ConfigError(f"{where}: field 'timing.{key}' is {value!r}; expected a number")
    if "name" not in row["compressor"]:
        raise ConfigError(f"{where}: field 'compressor' has no 'name'")
    return row


def read_rows(out_dir: str | Path, *, resume: bool = False) -> list[dict[str, Any]]:
    """Rows of `out_dir/results.jsonl` ([] when the file is missing), checked line by line.

    A line that is not UTF-8 JSON, a JSON value that is not a results row, a last line cut mid-way (no
    final newline) and an episode id seen on an earlier line are `ConfigError`s naming the file and line.
    With `resume` (reading a run to repair it) a cut last line and repeated episodes are skipped instead."""
    path = Path(out_dir) / RESULTS
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return []
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, expected the results file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = check_row(_parse(line, f"{path}:{i}"), f"{path}:{i}")
        key = row["episode_id"]
        if key in seen:
            if resume:
                continue
            raise ConfigError(
                f"{path}:{i}: episode {key!r} already has a row on line {seen[key]}; the run folder holds a "
                "duplicate (rerun `ctxkit ablate CONFIG --out DIR` to repair it: resume keeps one row per episode)"
            )
        seen[key] = i
        rows.append(row)
    if torn.strip() and not resume:
        n = len(lines) + 1
        try:
            _parse(torn, f"{path}:{n}")
        except ConfigError:
            raise ConfigError(
                f"{path}:{n}: line cut mid-way (no final newline; a run stopped while writing it); rerun "
                "`ctxkit ablate CONFIG --out DIR` to repair the run folder"
            ) from None
        raise ConfigError(f"{path}:{n}: the last line has no final newline (the file was cut or edited)")
    return rows


def _parse(line: bytes, where: str) -> Any:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text (byte 0x{line[exc.start]:02x} at column {exc.start + 1}); "
                          "not a ctxkit results file?") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not a JSON results row ({exc.msg} at column {exc.colno})") from None


def read_run_info(out_dir: str | Path) -> dict[str, Any] | None:
    """The parsed `run.json` of a run folder (None when missing); `ConfigError` naming the file when unreadable."""
    path = Path(out_dir) / RUN_INFO
    try:
        info = json.loads(path.read_bytes().decode("utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a ctxkit run description (not JSON: {exc})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not isinstance(info, dict):
        raise ConfigError(f"{path}: not a ctxkit run description (a JSON {type(info).__name__}, expected an object)")
    return info


def append_row(out_dir: str | Path, row: Mapping[str, Any]) -> None:
    """Append one row to `out_dir/results.jsonl` and fsync it."""
    with open(Path(out_dir) / RESULTS, "ab") as fh:
        fh.write(json.dumps(row, sort_keys=True).encode() + b"\n")
        fh.flush()
        os.fsync(fh.fileno())


class RunLock:
    """An exclusive, non-blocking lock on a run folder, held from `acquire()` to `release()` (or process exit).

    `fcntl.flock` on `DIR/.ctxkit-run.lock` (filelock's `FileLock` where fcntl is missing): the kernel drops
    the lock when the holder dies, even by SIGKILL, so a stale lock file never blocks a rerun. The file
    holds the holder's pid, for the error message only."""

    def __init__(self, out_dir: str | Path):
        self.path = Path(out_dir) / LOCK
        self._fd: int | None = None
        self._fallback: Any = None

    def acquire(self) -> "RunLock":
        """Take the lock; `ConfigError` when another process holds it or the folder is not writable."""
        try:
            import fcntl  # lazy: POSIX only; the fallback below covers its absence
        except ImportError:  # pragma: no cover - not POSIX
            return self._acquire_filelock()
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(f"{self.path.parent}: cannot write in the run folder: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise ConfigError(
                f"{self.path.parent}: the run folder is in use by another `ctxkit ablate`"
                + (f" (pid {holder})" if holder.isdigit() else "")
                + "; wait for it to finish or use another --out folder"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def _acquire_filelock(self) -> "RunLock":  # pragma: no cover - not POSIX

        lock = FileLock(str(self.path), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise ConfigError(f"{self.path.parent}: the run folder is in use by another `ctxkit ablate`; "
                              "wait for it to finish or use another --out folder") from None
        self._fallback = lock
        return self

    def release(self) -> None:
        """Drop the lock (the file stays; an unlocked file means nothing)."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None
        if self._fallback is not None:  # pragma: no cover - not POSIX
            self._fallback.release()
            self._fallback = None

    def __enter__(self) -> "RunLock":
        return self if self.held else self.acquire()

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._fd is not None or self._fallback is not None

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def check_out_dir(out_dir: str | Path) -> Path:
    """Check, without creating anything, that `out_dir` is a folder or can be created as one (`ConfigError`)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a folder; the run folder (--out) must be a folder")
    parent = _existing_ancestor(out)
    if parent.exists() and not parent.is_dir():
        raise ConfigError(f"{out}: cannot create the run folder (--out): {parent} is a file, not a folder")
    if parent.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{out}: cannot create the run folder (--out): {parent} is not writable")
    return out


def open_run_folder(out_dir: str | Path) -> RunLock:
    """Create the run folder (parents too) and take its lock; typed errors for a file, a read-only place, a
    folder in use. The caller releases the returned lock (or uses it as a context manager)."""
    out = check_out_dir(out_dir)
    parent = _existing_ancestor(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{out}: cannot create the run folder (--out) in {parent}: {exc.strerror or exc}") from None
    return RunLock(out).acquire()
