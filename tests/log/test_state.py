"""External state: blob store, directory and JSON snapshots, safe restores against malicious manifests."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkit.errors import ConfigError, StateError
from ctxkit.events import Message, StateSnapshot
from ctxkit.log.event_log import EventLog, read_events
from ctxkit.log.state import (
    BlobStore,
    DirectoryState,
    JsonState,
    latest_snapshots,
    link_stays_inside,
    load_manifest,
    record_snapshot,
    restore_snapshot,
)


def _tree(root: Path) -> dict[str, tuple]:
    """Everything under `root`: path -> ("file", bytes, mode) | ("dir", mode) | ("link", target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            full = Path(dirpath, name)
            rel = full.relative_to(root).as_posix()
            st_ = os.lstat(full)
            if stat.S_ISLNK(st_.st_mode):
                out[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st_.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st_.st_mode))
            elif stat.S_ISREG(st_.st_mode):
                out[rel] = ("file", full.read_bytes(), stat.S_IMODE(st_.st_mode))
            else:
                out[rel] = ("other",)
    return out


def _workdir(root: Path) -> Path:
    root.mkdir()
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "README.md").write_text("héllo\n")
    (root / "src" / "pkg" / "data.bin").write_bytes(bytes(range(256)) * 41 + b"\x00\xff")
    (root / "src" / "pkg" / "big.bin").write_bytes(os.urandom(3 << 20))
    (root / "src" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "src" / "run.sh", 0o755)
    (root / "src" / "ro.txt").write_text("read only")
    os.chmod(root / "src" / "ro.txt", 0o444)
    (root / "src" / "pkg" / "link_up").symlink_to("../run.sh")
    (root / "docs").symlink_to("src/pkg")
    return root


# ------------------------------------------------------------------------------------------- blob store


def test_blob_store_layout_and_verification(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    sha = store.put(b"abc")
    assert sha == hashlib.sha256(b"abc").hexdigest()
    assert store.path_of(sha) == tmp_path / "blobs" / "sha256" / sha[:2] / sha[2:]
    assert store.path_of(sha).read_bytes() == b"abc" and store.get(sha) == b"abc"
    assert store.put(b"abc") == sha  # idempotent
    assert list((tmp_path / "blobs" / "tmp").iterdir()) == []  # temp files are renamed or removed
    store.path_of(sha).write_bytes(b"abd")
    with pytest.raises(StateError, match=rf"thing: blob {sha} does not match its sha256"):
        store.get(sha, what="thing")
    with pytest.raises(StateError, match="is missing"):
        store.get("0" * 64)
    for bad in ["../../etc/passwd", "A" * 64, "0" * 63, None]:
        with pytest.raises(StateError, match="is not a sha256"):
            store.path_of(bad)  # type: ignore[arg-type]


def test_store_for_log(tmp_path):
    log = EventLog.create(tmp_path / "ep.jsonl")
    assert BlobStore.for_log(log).root == tmp_path / "ep.jsonl.blobs"
    assert BlobStore.for_log(tmp_path / "x.jsonl").root == tmp_path / "x.jsonl.blobs"
    with pytest.raises(ConfigError, match="pass store="):
        BlobStore.for_log(object())
    log.close()


def test_put_file_streams_large_files(tmp_path):
    data = os.urandom((5 << 20) + 7)
    (tmp_path / "f").write_bytes(data)
    store = BlobStore(tmp_path / "blobs")
    assert store.put_file(tmp_path / "f") == (hashlib.sha256(data).hexdigest(), len(data))
    assert store.get(hashlib.sha256(data).hexdigest()) == data


# ------------------------------------------------------------------------------------------- directories


def test_directory_round_trip(tmp_path):
    src = _workdir(tmp_path / "work")
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    (src / "escape").symlink_to(outside)
    (src / "escape_rel").symlink_to("../outside.txt")
    os.mkfifo(src / "pipe")
    store = BlobStore(tmp_path / "blobs")
    sha = DirectoryState(src).snapshot(store)
    manifest = load_manifest(store, sha, "directory")
    assert [n["path"] for n in manifest["notes"]] == ["escape", "escape_rel", "pipe"]
    assert {e["path"]: e["type"] for e in manifest["entries"]} == {
        "README.md": "file", "docs": "symlink", "empty": "dir", "src": "dir", "src/pkg": "dir",
        "src/pkg/big.bin": "file", "src/pkg/data.bin": "file", "src/pkg/link_up": "symlink", "src/ro.txt": "file",
        "src/run.sh": "file"}
    readme = next(e for e in manifest["entries"] if e["path"] == "README.md")
    assert readme == {"path": "README.md", "type": "file", "sha256": hashlib.sha256("héllo\n".encode()).hexdigest(),
                      "size": 7, "mode": 0o666 & ~_umask()}

    expected = {k: v for k, v in _tree(src).items() if k not in ("escape", "escape_rel", "pipe")}
    dest = tmp_path / "restored"
    report = DirectoryState(src).restore(store, sha, dest)
    assert _tree(dest) == expected
    assert (report.files, report.dirs, report.links, report.removed) == (5, 3, 2, 0)
    again = load_manifest(store, DirectoryState(dest).snapshot(store), "directory")
    assert again["entries"] == manifest["entries"] and again["notes"] == []


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_restore_makes_target_exactly_equal_and_is_idempotent(tmp_path):
    src = _workdir(tmp_path / "work")
    store = BlobStore(tmp_path / "blobs")
    sha = DirectoryState(src).snapshot(store)
    expected = _tree(src)
    # the tool then edits the folder: changed, added, removed, retyped entries
    (src / "README.md").write_text("changed")
    (src / "new.txt").write_text("new")
    (src / "newdir" / "deep").mkdir(parents=True)
    (src / "newdir" / "deep" / "f").write_text("x")
    os.unlink(src / "src" / "run.sh")
    (src / "src" / "run.sh").mkdir()
    os.unlink(src / "docs")
    (src / "docs").write_text("now a file")
    (src / "empty").rmdir()
    (src / "empty").symlink_to("src")
    (src / "src" / "pkg" / "extra.txt").write_text("x")
    os.chmod(src / "src" / "pkg", 0o500)
    report = DirectoryState(src).restore(store, sha)
    assert _tree(src) == expected
    assert report.removed == 8  # new.txt, newdir/deep/f, newdir/deep, newdir, run.sh dir, docs file, empty link, extra
    second = DirectoryState(src).restore(store, sha)
    assert _tree(src) == expected and second.removed == 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.lists(st.sampled_from(["a", "b", "ü", "c d"]), min_size=1, max_size=3).map("/".join),
                       st.binary(max_size=300), max_size=8))
def test_round_trip_property(tmp_path, files):
    n = len(list(tmp_path.iterdir()))
    src, dest = tmp_path / f"s{n}", tmp_path / f"d{n}"
    src.mkdir()
    for rel, data in sorted(files.items()):
        path = src / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            continue  # a path that is both a file and a folder in the draw
    store = BlobStore(tmp_path / "blobs")
    sha = DirectoryState(src).snapshot(store)
    DirectoryState(dest).restore(store, sha)
    assert _tree(dest) == _tree(src)


# ------------------------------------------------------------------------------------------- malicious manifests


def _manifest(store: BlobStore, entries) -> str:
    return store.put(orjson.dumps({"ctxkit_manifest": 1, "adapter": "directory", "entries": entries, "notes": []}))


def _file(store, path, data=b"pwned", **over):
    return {"path": path, "type": "file", "sha256": store.put(data), "size": len(data), "mode": 0o644, **over}


@pytest.mark.parametrize(
    "make_entries, pattern",
    [
        (lambda s: [_file(s, "../sentinel/evil")], r"entry '\.\./sentinel/evil': '\.\.'"),
        (lambda s: [_file(s, "ok/../../sentinel/evil")], r"'\.\.', '\.' or empty path parts refused"),
        (lambda s: [_file(s, "SENTINEL_ABS")], r"absolute path"),
        (lambda s: [_file(s, "a//b")], r"empty path parts refused"),
        (lambda s: [_file(s, "./a")], r"empty path parts refused"),
        (lambda s: [_file(s, "a\x00b")], r"NUL byte"),
        (lambda s: [{"path": "l", "type": "symlink", "target": "../sentinel"}], r"entry 'l': symlink to '\.\./sentinel' points outside"),
        (lambda s: [{"path": "l", "type": "symlink", "target": "SENTINEL_ABS"}], r"points outside"),
        (lambda s: [{"path": "d", "type": "dir", "mode": 0o755}, {"path": "d/l", "type": "symlink", "target": "../.."}],
         r"entry 'd/l': symlink to '\.\./\.\.' points outside"),
        (lambda s: [{"path": "s", "type": "symlink", "target": "."}, {"path": "l", "type": "symlink", "target": "s/../sentinel"}],
         r"entry 'l': symlink to 's/\.\./sentinel' points outside"),
        (lambda s: [{"path": "l", "type": "symlink", "target": "d"}, {"path": "d", "type": "dir", "mode": 0o755},
                    _file(s, "l/evil")], r"entry 'l/evil': passes through 'l', which is symlink, not a folder"),
        (lambda s: [_file(s, "x/evil")], r"entry 'x/evil': passes through 'x', which is not listed"),
        (lambda s: [_file(s, "a", size=3)], r"entry 'a': size mismatch: the manifest says 3 bytes, the blob has 5"),
        (lambda s: [_file(s, "a", sha256="0" * 64)], r"entry 'a': blob 0{64} is missing"),
        (lambda s: [_file(s, "a", sha256="../../x")], r"is not a sha256"),
        (lambda s: [_file(s, "a", mode=0o4755)], r"entry 'a': bad size 5 or mode 2541"),
        (lambda s: [_file(s, "a"), _file(s, "a")], r"entry 'a': listed twice"),
        (lambda s: [{"path": "a", "type": "fifo"}], r"entry 'a': unknown type 'fifo'"),
    ],
)
def test_malicious_manifests_are_refused_and_write_nothing(tmp_path, make_entries, pattern):
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    store = BlobStore(tmp_path / "blobs")
    entries = orjson.loads(orjson.dumps(make_entries(store)).replace(b"SENTINEL_ABS", str(sentinel / "evil").encode()))
    sha = _manifest(store, entries)
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("untouched")
    before = {p.name for p in tmp_path.iterdir()}
    with pytest.raises(StateError, match=pattern):
        DirectoryState(target).restore(store, sha)
    assert list(sentinel.iterdir()) == []
    assert {p.name for p in tmp_path.iterdir()} == before
    assert _tree(target) == {"keep.txt": ("file", b"untouched", 0o666 & ~_umask())}  # checked before any write


def test_tampered_blob_is_refused_before_writing(tmp_path):
    src = _workdir(tmp_path / "work")
    store = BlobStore(tmp_path / "blobs")
    sha = DirectoryState(src).snapshot(store)
    blob = store.path_of(hashlib.sha256("héllo\n".encode()).hexdigest())
    blob.write_bytes(b"evil!!\n")
    target = tmp_path / "target"
    with pytest.raises(StateError, match=r"entry 'README\.md': blob [0-9a-f]{64} does not match its sha256"):
        DirectoryState(target).restore(store, sha)
    assert not target.exists()  # the manifest and every blob are checked before the target is touched
    store.path_of(sha).write_bytes(store.path_of(sha).read_bytes() + b" ")
    with pytest.raises(StateError, match=rf"manifest {sha[:12]}: blob {sha} does not match"):
        DirectoryState(target).restore(store, sha)


def test_existing_links_in_the_target_are_replaced_not_followed(tmp_path):
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    store = BlobStore(tmp_path / "blobs")
    sha = _manifest(store, [{"path": "a", "type": "dir", "mode": 0o755}, _file(store, "a/x", b"data"),
                            _file(store, "f", b"file")])
    target = tmp_path / "target"
    target.mkdir()
    (target / "a").symlink_to(sentinel)  # a planted link where the snapshot has a folder
    (target / "f").symlink_to(sentinel / "f")  # and where it has a file
    DirectoryState(target).restore(store, sha)
    assert list(sentinel.iterdir()) == []
    assert _tree(target) == {"a": ("dir", 0o755), "a/x": ("file", b"data", 0o644), "f": ("file", b"file", 0o644)}


def test_restore_target_checks(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    sha = _manifest(store, [_file(store, "a")])
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    with pytest.raises(StateError, match="is not a folder \\(or is a symlink\\)"):
        DirectoryState(tmp_path / "linked").restore(store, sha)
    with pytest.raises(StateError, match="its parent folder does not exist"):
        DirectoryState(tmp_path / "no" / "such").restore(store, sha)
    with pytest.raises(StateError, match="made by adapter 'directory', not 'json'"):
        JsonState().restore(store, sha)


def test_link_stays_inside_rules():
    assert link_stays_inside("a", "b") and link_stays_inside("d/l", "../x") and link_stays_inside("d/e/l", "../../x/y")
    assert link_stays_inside("l", "./x") and link_stays_inside("l", "x/./y")
    assert not link_stays_inside("l", "../x") and not link_stays_inside("d/l", "../../x")
    assert not link_stays_inside("l", "/etc") and not link_stays_inside("l", "") and not link_stays_inside("l", "s/../x")


# ------------------------------------------------------------------------------------------- JSON state and the log


def test_json_state_round_trip(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    value = {"cursor": 3, "seen": ["a", "é"], "score": 0.1 + 0.2, "nested": {"x": None, "y": [1.5e-300, -0.0]}}
    sha = JsonState(value).snapshot(store)
    state = JsonState()
    assert state.restore(store, sha) == value and state.value == value
    assert JsonState(dict(reversed(list(value.items())))).snapshot(store) == sha  # canonical: key order ignored
    with pytest.raises(StateError, match=r"json state\.value\.x: nan cannot be stored"):
        JsonState({"x": float("nan")}).snapshot(store)
    with pytest.raises(StateError, match="not JSON-serializable"):
        JsonState({"x": object()}).snapshot(store)


def test_record_and_restore_snapshots_through_the_log(tmp_path):
    work = _workdir(tmp_path / "work")
    expected = _tree(work)
    path = tmp_path / "ep.jsonl"
    with EventLog.create(path) as log:
        first = log.append(Message(role="user", content="edit the file"))
        snap = record_snapshot(log, DirectoryState(work), "workdir", after_event_id=first.id)
        counter = JsonState({"n": 1})
        record_snapshot(log, counter, "counter")
        counter.value = {"n": 2}
        record_snapshot(log, counter, "counter")
        with pytest.raises(ConfigError, match="is not one of"):
            record_snapshot(log, object(), "bad")
    events = read_events(path)
    assert isinstance(events[1], StateSnapshot) and events[1] == snap
    assert (snap.adapter, snap.name, snap.after_event_id) == ("directory", "workdir", first.id)
    assert BlobStore(str(path) + ".blobs").has(snap.manifest_sha256)
    latest = latest_snapshots(events)
    assert sorted(latest) == ["counter", "workdir"] and latest["counter"].seq == 3
    assert latest_snapshots(events, upto_seq=2)["counter"].seq == 2
    store = BlobStore.for_log(path)
    assert restore_snapshot(latest["counter"], store) == {"n": 2}
    assert restore_snapshot(latest_snapshots(events, upto_seq=2)["counter"], store) == {"n": 1}
    restore_snapshot(latest["workdir"], store, tmp_path / "again")
    assert _tree(tmp_path / "again") == expected
    with pytest.raises(ConfigError, match="needs target="):
        restore_snapshot(latest["workdir"], store)


def test_store_inside_the_folder_is_skipped_and_protected(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("a")
    store = BlobStore(work / ".blobs")
    store.put(b"already there")
    sha = DirectoryState(work).snapshot(store)
    manifest = load_manifest(store, sha, "directory")
    assert [e["path"] for e in manifest["entries"]] == ["a.txt"]
    assert manifest["notes"] == [{"path": ".blobs", "note": "the blob store itself; skipped"}]
    with pytest.raises(StateError, match="holds the blob store"):
        DirectoryState(work).restore(store, sha)
    assert store.has(sha)
