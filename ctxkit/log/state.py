"""External state: a content-addressed blob store beside the log, and adapters that snapshot and restore.

`BlobStore(root)` keeps blobs by sha256 under `<root>/sha256/ab/cdef...`, written atomically (temp file +
rename) and verified on every read. The default store of a log is `<log path>.blobs/`.

An adapter snapshots a piece of state into the store and returns the sha256 of a *manifest* blob; the log
refers to it with a `StateSnapshot` event (`record_snapshot`). `DirectoryState` covers a working folder
(regular files with size and mode, folders, symlinks that stay inside); `JsonState` any JSON-able value.

Restores are safe: a manifest is checked in full before anything is written. Paths must be relative,
without `.`/`..`/empty parts, and never pass through a symlink; link targets must stay inside; every blob
must match its hash and recorded size. Writes never follow a link, so nothing outside the target changes.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import orjson

from ctxkit.errors import ConfigError, StateError
from ctxkit.events import Event, StateSnapshot

MANIFEST_VERSION = 1
"""Version written in every manifest as `ctxkit_manifest`."""
_SHA = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


class BlobStore:
    """Content-addressed blobs by sha256 under `<root>/sha256/ab/cdef...`."""

    def __init__(self, root) -> None:
        self.root: Path = Path(root)
        """The store's folder (created on first write)."""

    @classmethod
    def for_log(cls, log) -> "BlobStore":
        """The default store of a log: `<log path>.blobs/` (`log` is an `EventLog` or a path)."""
        path = getattr(log, "path", log)
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(f"{type(log).__name__} has no file path; pass store=BlobStore(folder)")
        return cls(str(path) + ".blobs")

    def path_of(self, sha: str) -> Path:
        """Where the blob `sha` lives (`StateError` when `sha` is not 64 lowercase hex digits)."""
        if not isinstance(sha, str) or not _SHA.fullmatch(sha):
            raise StateError(f"{sha!r} is not a sha256 (64 lowercase hex digits)")
        return self.root / "sha256" / sha[:2] / sha[2:]

    def has(self, sha: str) -> bool:
        """True when the blob is stored (not verified)."""
        return self.path_of(sha).is_file()

    def put(self, data: bytes) -> str:
        """Store bytes; returns their sha256. Storing the same bytes twice is a no-op."""
        sha = hashlib.sha256(data).hexdigest()
        if not self.has(sha):
            self._commit(sha, lambda fh: fh.write(data))
        return sha

    def put_file(self, path) -> tuple[str, int]:
        """Store a file's content, streamed; returns `(sha256, size)`."""
        digest, size, tmp = hashlib.sha256(), 0, self._tmp()
        try:
            with open(path, "rb") as src, open(tmp, "xb") as dst:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)
                    size += len(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            sha = digest.hexdigest()
            final = self.path_of(sha)
            final.parent.mkdir(parents=True, exist_ok=True)
            if not final.exists():
                os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        return sha, size

    def get(self, sha: str, *, what: str = "blob") -> bytes:
        """The verified bytes of a blob; a missing or altered blob is a `StateError` naming `what`."""
        path = self.path_of(sha)
        try:
            data = path.read_bytes()
        except OSError:
            raise StateError(f"{what}: blob {sha} is missing from {self.root}") from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise StateError(f"{what}: blob {sha} does not match its sha256 (altered on disk)")
        return data

    def verify_blob(self, sha: str, size: int | None = None, *, what: str = "blob") -> None:
        """Check a blob's hash (and size) by streaming it; `StateError` naming `what` when it is wrong."""
        digest, n = hashlib.sha256(), 0
        try:
            with open(self.path_of(sha), "rb") as fh:
                while chunk := fh.read(_CHUNK):
                    digest.update(chunk)
                    n += len(chunk)
        except OSError:
            raise StateError(f"{what}: blob {sha} is missing from {self.root}") from None
        if digest.hexdigest() != sha:
            raise StateError(f"{what}: blob {sha} does not match its sha256 (altered on disk)")
        if size is not None and n != size:
            raise StateError(f"{what}: size mismatch: the manifest says {size} bytes, the blob has {n}")

    def _tmp(self) -> Path:
        tmp_dir = self.root / "tmp"
        tmp_dir.mkdir(parents=True, exist_ok=True)
        return tmp_dir / f"{os.getpid()}-{os.urandom(6).hex()}"

    def _commit(self, sha: str, write) -> None:
        tmp = self._tmp()
        try:
            with open(tmp, "xb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            final = self.path_of(sha)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)


def _dump_manifest(obj: Any, what: str) -> bytes:
    try:
        data = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:
        raise StateError(f"{what}: not JSON-serializable: {exc}") from None
    _check_finite(obj, what)
    return data


def _check_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise StateError(f"{where}: {value!r} cannot be stored (JSON has no NaN/inf)")
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_finite(item, f"{where}[{i}]")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")


def load_manifest(store: BlobStore, sha: str, adapter: str) -> dict[str, Any]:
    """A verified, parsed manifest of the given adapter kind (`StateError` otherwise)."""
    data = store.get(sha, what=f"manifest {sha[:12]}")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise StateError(f"manifest {sha[:12]}: invalid JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("ctxkit_manifest") != MANIFEST_VERSION:
        raise StateError(f"manifest {sha[:12]}: not a ctxkit manifest of version {MANIFEST_VERSION}")
    if obj.get("adapter") != adapter:
        raise StateError(f"manifest {sha[:12]}: made by adapter {obj.get('adapter')!r}, not {adapter!r}")
    return obj


# ---------------------------------------------------------------------------------------------- paths


def _check_rel_path(rel: Any) -> tuple[str, ...]:
    """The parts of a safe relative posix path, or `StateError`."""
    if not isinstance(rel, str) or not rel:
        raise StateError(f"entry path {rel!r}: not a non-empty string")
    if rel.startswith("/") or "\x00" in rel:
        raise StateError(f"entry {rel!r}: absolute path (or NUL byte) refused")
    parts = tuple(rel.split("/"))
    if any(p in ("", ".", "..") for p in parts):
        raise StateError(f"entry {rel!r}: '..', '.' or empty path parts refused (the path must stay inside)")
    return parts


def link_stays_inside(link_rel: str, target: str) -> bool:
    """True when symlink `link_rel` (relative to the root) pointing at `target` resolves inside the root,
    whatever other inside links it passes: relative, `..` only as leading parts, no deeper than the link."""
    if not target or target.startswith("/") or "\x00" in target:
        return False
    parts = [p for p in target.split("/") if p not in ("", ".")]
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    if ".." in parts[ups:]:
        return False
    return ups <= len(link_rel.split("/")) - 1


# ---------------------------------------------------------------------------------------------- adapters


@dataclass(frozen=True)
class RestoreReport:
    """What a directory restore did."""

    target: str
    """The folder restored."""
    files: int
    """Regular files written."""
    dirs: int
    """Folders in the snapshot."""
    links: int
    """Symlinks created."""
    removed: int
    """Entries removed because the snapshot does not have them (or has another kind there)."""


class DirectoryState:
    """Snapshots and restores a working folder: regular files (content, size, mode), folders, and
    symlinks that stay inside. Links pointing outside, and other file types, are skipped with a note."""

    adapter = "directory"

    def __init__(self, path) -> None:
        self.path: Path = Path(path)
        """The folder this adapter snapshots (and restores by default)."""

    def snapshot(self, store: BlobStore) -> str:
        """Store every file's content and a manifest; returns the manifest's sha256."""
        root = self.path
        if not root.is_dir() or root.is_symlink():
            raise StateError(f"{root}: not a folder (or is a symlink); cannot snapshot it")
        entries, notes = [], []
        store_root = os.path.realpath(store.root)
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            for name in sorted(dirnames + filenames):
                full = os.path.join(dirpath, name)
                rel = Path(full).relative_to(root).as_posix()
                st = os.lstat(full)
                if os.path.realpath(full) == store_root:
                    dirnames[:] = [d for d in dirnames if d != name]
                    notes.append({"path": rel, "note": "the blob store itself; skipped"})
                elif stat.S_ISLNK(st.st_mode):
                    target = os.readlink(full)
                    if link_stays_inside(rel, target):
                        entries.append({"path": rel, "type": "symlink", "target": target})
                    else:
                        notes.append({"path": rel, "note": f"symlink to {target!r} points outside; skipped"})
                elif stat.S_ISDIR(st.st_mode):
                    entries.append({"path": rel, "type": "dir", "mode": stat.S_IMODE(st.st_mode) & 0o777})
                elif stat.S_ISREG(st.st_mode):
                    sha, size = store.put_file(full)
                    entries.append({"path": rel, "type": "file", "sha256": sha, "size": size,
                                    "mode": stat.S_IMODE(st.st_mode) & 0o777})
                else:
                    notes.append({"path": rel, "note": "not a regular file, folder or symlink; skipped"})
        entries.sort(key=lambda e: e["path"])
        manifest = {"ctxkit_manifest": MANIFEST_VERSION, "adapter": self.adapter, "entries": entries, "notes": notes}
        return store.put(_dump_manifest(manifest, f"snapshot of {root}"))

    def restore(self, store: BlobStore, manifest_sha: str, target=None) -> RestoreReport:
        """Make `target` (default: this adapter's folder) exactly equal to the snapshot: extra entries are
        removed. The manifest and every blob are checked before anything is written."""
        target = Path(self.path if target is None else target)
        entries = _checked_entries(load_manifest(store, manifest_sha, self.adapter), store)
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            raise StateError(f"restore target {target} is not a folder (or is a symlink)")
        if not target.parent.is_dir():
            raise StateError(f"restore target {target}: its parent folder does not exist")
        store_root = os.path.realpath(store.root)
        if (store_root + os.sep).startswith(os.path.realpath(target) + os.sep):
            raise StateError(f"restore target {target} holds the blob store {store.root}; restoring would delete it")
        target.mkdir(exist_ok=True)
        removed = _remove_extras(target, entries)
        real_root = os.path.realpath(target)
        counts = {"file": 0, "dir": 0, "symlink": 0}
        for rel, entry in sorted(entries.items()):
            dest = os.path.join(target, rel)
            parent = os.path.dirname(os.path.join(real_root, rel))
            if os.path.realpath(os.path.dirname(dest)) != parent:
                raise StateError(f"entry {rel!r}: its folder resolves outside {target} (a link on the way); refused")
            counts[entry["type"]] += 1
            if entry["type"] == "dir":
                if not os.path.isdir(dest) or os.path.islink(dest):
                    os.mkdir(dest, 0o700)
                os.chmod(dest, 0o700)  # writable while filling; the recorded mode is set at the end
            elif entry["type"] == "symlink":
                if os.path.lexists(dest):
                    os.unlink(dest)
                os.symlink(entry["target"], dest)
            else:
                _write_file(store, entry, dest, rel)
        for rel, entry in sorted(entries.items(), reverse=True):  # folder modes last, deepest first
            if entry["type"] == "dir":
                os.chmod(os.path.join(target, rel), entry["mode"])
        return RestoreReport(str(target), counts["file"], counts["dir"], counts["symlink"], removed)


def _checked_entries(manifest: Mapping[str, Any], store: BlobStore) -> dict[str, dict[str, Any]]:
    entries = manifest.get("entries")
    if not isinstance(entries, list):
        raise StateError("manifest: 'entries' is not a list")
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise StateError(f"manifest entry {entry!r}: not an object")
        rel = entry.get("path")
        _check_rel_path(rel)
        if rel in out:
            raise StateError(f"entry {rel!r}: listed twice")
        kind = entry.get("type")
        if kind == "file":
            size, mode = entry.get("size"), entry.get("mode")
            if type(size) is not int or size < 0 or type(mode) is not int or not 0 <= mode <= 0o777:
                raise StateError(f"entry {rel!r}: bad size {size!r} or mode {mode!r}")
            store.verify_blob(entry.get("sha256"), size, what=f"entry {rel!r}")
        elif kind == "dir":
            if type(entry.get("mode")) is not int or not 0 <= entry["mode"] <= 0o777:
                raise StateError(f"entry {rel!r}: bad mode {entry.get('mode')!r}")
        elif kind == "symlink":
            if not isinstance(entry.get("target"), str) or not link_stays_inside(rel, entry["target"]):
                raise StateError(f"entry {rel!r}: symlink to {entry.get('target')!r} points outside the target; refused")
        else:
            raise StateError(f"entry {rel!r}: unknown type {kind!r} (file, dir or symlink)")
        out[rel] = entry
    for rel in out:  # every parent must be a folder of the snapshot: no path passes through a link or file
        parts = rel.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if out.get(parent, {}).get("type") != "dir":
                what = out[parent]["type"] if parent in out else "not listed"
                raise StateError(f"entry {rel!r}: passes through {parent!r}, which is {what}, not a folder; refused")
    return out


def _remove_extras(target: Path, entries: Mapping[str, Mapping[str, Any]]) -> int:
    """Remove what the snapshot does not have, or has as another kind; never follows links."""
    removed = 0
    for dirpath, dirnames, filenames in os.walk(target, topdown=False, followlinks=False):
        writable = False
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = Path(full).relative_to(target).as_posix()
            st = os.lstat(full)
            want = entries.get(rel)
            if stat.S_ISLNK(st.st_mode):
                keep = want is not None and want["type"] == "symlink" and os.readlink(full) == want["target"]
            elif stat.S_ISDIR(st.st_mode):
                keep = want is not None and want["type"] == "dir"
            else:
                keep = want is not None and want["type"] == "file" and stat.S_ISREG(st.st_mode)
            if keep:
                continue
            if not writable:  # a read-only folder (restored later to its recorded mode) must let us remove
                os.chmod(dirpath, stat.S_IMODE(os.lstat(dirpath).st_mode) | 0o700)
                writable = True
            if stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
                os.chmod(full, 0o700)
                shutil.rmtree(full)
            else:
                os.unlink(full)
            removed += 1
    return removed


def _write_file(store: BlobStore, entry: Mapping[str, Any], dest: str, rel: str) -> None:
    """Write a blob to `dest` via a temp file and rename (so a link at `dest` is replaced, not followed)."""
    tmp = f"{dest}.ctxkit-{os.urandom(4).hex()}.tmp"
    digest, n = hashlib.sha256(), 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with open(store.path_of(entry["sha256"]), "rb") as src, os.fdopen(fd, "wb") as dst:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                n += len(chunk)
                dst.write(chunk)
        if digest.hexdigest() != entry["sha256"] or n != entry["size"]:
            raise StateError(f"entry {rel!r}: blob {entry['sha256']} changed during restore")
        os.chmod(tmp, entry["mode"])
        os.replace(tmp, dest)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


class JsonState:
    """Snapshots and restores any JSON-able value (held in `.value`)."""

    adapter = "json"

    def __init__(self, value: Any = None) -> None:
        self.value: Any = value
        """The current value."""

    def snapshot(self, store: BlobStore) -> str:
        """Store the value in a manifest; returns its sha256 (floats round-trip exactly; NaN/inf refused)."""
        manifest = {"ctxkit_manifest": MANIFEST_VERSION, "adapter": self.adapter, "value": self.value}
        return store.put(_dump_manifest(manifest, "json state"))

    def restore(self, store: BlobStore, manifest_sha: str, target=None) -> Any:
        """Set `.value` to the snapshot's value and return it (`target` is unused)."""
        self.value = load_manifest(store, manifest_sha, self.adapter)["value"]
        return self.value


ADAPTERS: dict[str, type] = {"directory": DirectoryState, "json": JsonState}
"""Adapter name (as recorded in `StateSnapshot.adapter`) -> class."""


def record_snapshot(log, adapter, name: str, *, store: BlobStore | None = None,
                    after_event_id: str | None = None) -> StateSnapshot:
    """Snapshot `adapter` into `store` (default: the log's `<path>.blobs/`) and append a `StateSnapshot`
    event to `log`; returns the recorded event."""
    if getattr(adapter, "adapter", None) not in ADAPTERS:
        raise ConfigError(f"adapter {adapter!r} is not one of {sorted(ADAPTERS)}")
    store = store if store is not None else BlobStore.for_log(log)
    sha = adapter.snapshot(store)
    return log.append(StateSnapshot(adapter=adapter.adapter, name=name, manifest_sha256=sha,
                                    after_event_id=after_event_id))


def latest_snapshots(events: Iterable[Event], upto_seq: int | None = None) -> dict[str, StateSnapshot]:
    """The last `StateSnapshot` per state name, among events with `seq <= upto_seq` (all when None)."""
    out: dict[str, StateSnapshot] = {}
    for event in events:
        if upto_seq is not None and event.seq is not None and event.seq > upto_seq:
            break
        if isinstance(event, StateSnapshot):
            out[event.name] = event
    return out


def restore_snapshot(event: StateSnapshot, store: BlobStore, target=None) -> Any:
    """Restore a recorded snapshot: a directory into `target` (required) -> `RestoreReport`; JSON -> the value."""
    cls = ADAPTERS.get(event.adapter)
    if cls is None:
        raise StateError(f"snapshot {event.id or event.name!r}: unknown adapter {event.adapter!r}")
    if cls is DirectoryState:
        if target is None:
            raise ConfigError(f"snapshot {event.name!r}: a directory restore needs target=")
        return DirectoryState(target).restore(store, event.manifest_sha256)
    return JsonState().restore(store, event.manifest_sha256)
