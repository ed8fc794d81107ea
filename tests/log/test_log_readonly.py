"""A lock is taken only to write: reading a log (export, replay, samples, audit, resume, verify, even of a
file that is not a log) leaves its folder exactly as it was, with no `<file>.lock` beside it, and works in a
read-only folder. Tests run as root, for whom chmod does not stop writes, so the folder's listing is also
compared directly."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tokenizer_dir
from rollout_driver import Driver
from ctxkit.context.builder import ContextBuilder
from ctxkit.cli.parser import main
from ctxkit.errors import LogFormatError
from ctxkit.events import Message
from ctxkit.log.event_log import EventLog, export_conversation, export_messages, read_events, read_header, repair, verify

N_TURNS = 4


def listing(folder: Path) -> list[tuple[str, int]]:
    """Every entry under `folder` (recursively) with its size, sorted."""
    return sorted((str(p.relative_to(folder)), p.stat().st_size if p.is_file() else -1) for p in folder.rglob("*"))


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    """A finished stateful episode (a snapshot store beside the log) and a text file that is not a log, in
    a folder made read-only (0o555, files 0o444); restored afterwards so pytest can clean up."""
    root = tmp_path_factory.mktemp("ro")
    folder, work = root / "run", root / "work"
    folder.mkdir()
    work.mkdir()
    builder = ContextBuilder(str(tokenizer_dir("qwen2.5-instruct")), compressor="window", params={"keep_last": 2},
                             budget=520)
    with EventLog.create(folder / "ep.jsonl", episode_id="ep-ro") as log:
        Driver(n_turns=N_TURNS, episode_id="ep-ro", workdir=work).run(log, builder)
    (folder / "notes.txt").write_text("not a log\n")
    (folder / "ep.jsonl.lock").unlink(missing_ok=True)  # the writer's lock: gone, as after a copy of the run
    before = listing(folder)
    assert not any(name.endswith(".lock") for name, _ in before)
    paths = [p for p in folder.rglob("*")] + [folder]
    modes = {p: p.stat().st_mode for p in paths}
    for p in sorted(paths, key=lambda p: -len(p.parts)):
        os.chmod(p, 0o555 if p.is_dir() else 0o444)
    yield folder, before
    for p, mode in modes.items():
        os.chmod(p, stat.S_IMODE(mode))


def assert_untouched(folder: Path, before) -> None:
    after = listing(folder)
    assert after == before, f"new or changed entries: {sorted(set(after) - set(before))}"
    assert not list(folder.rglob("*.lock"))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o555


def test_library_reads_take_no_lock(frozen):
    folder, before = frozen
    log = folder / "ep.jsonl"
    events = read_events(log)
    assert len(events) > 3 * N_TURNS and read_header(log)["episode_id"] == "ep-ro"
    assert verify(log).ok
    report = repair(log)  # nothing to repair: nothing written, no lock taken
    assert report.removed_bytes == 0 and not report.completed_line and report.n_events == len(events)
    assert export_messages(events)[0] == {"role": "system", "content": events[1].content}
    assert export_conversation(events)["tools"]
    assert_untouched(folder, before)


def test_opening_and_refreshing_a_log_takes_no_lock(frozen):
    folder, before = frozen
    log = EventLog.open(folder / "ep.jsonl")
    try:
        assert log.refresh() == read_events(folder / "ep.jsonl")
    finally:
        log.close()
    assert_untouched(folder, before)


def test_replay_samples_audit_resume_take_no_lock(frozen, tmp_path):
    from ctxkit.training.preflight import audit
    from ctxkit.training.context_replay import replay, resume, verify_log
    from ctxkit.training.episode_samples import samples

    folder, before = frozen
    log = folder / "ep.jsonl"
    assert verify_log(str(log)).n_ok == N_TURNS
    assert replay(str(log), 0).ok
    rows = samples(str(log))
    assert sum(r.n_sampled for r in rows) > 0
    report = audit([str(folder)])
    assert report.ok and report.paths == (str(log),) and report.skipped == ()  # only .jsonl files are candidates
    state = resume(str(log), targets={"workdir": tmp_path / "restored"})
    assert state.repaired is None and state.ended is not None
    assert (tmp_path / "restored" / "notes.txt").read_text().count("\n") == N_TURNS - 1
    assert_untouched(folder, before)


def test_verify_of_a_file_that_is_not_a_log_takes_no_lock(frozen):
    folder, before = frozen
    notes = folder / "notes.txt"
    report = verify(notes)
    assert not report.ok and report.problems[0].code == "json"
    with pytest.raises(LogFormatError, match=r"notes.txt:1: invalid JSON"):
        read_events(notes)
    with pytest.raises(LogFormatError, match=r"notes.txt:1: invalid JSON"):
        repair(notes)
    with pytest.raises(LogFormatError, match="no such log file"):
        read_events(folder / "missing.jsonl")
    assert_untouched(folder, before)


def test_cli_reads_take_no_lock(frozen, tmp_path, capsys):
    folder, before = frozen
    log = str(folder / "ep.jsonl")
    assert main(["export", log, "--compact"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["role"] == "system"
    assert main(["replay", log, "--verify"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"{N_TURNS}/{N_TURNS} steps verify: ok")
    assert main(["samples", str(folder), "-o", str(tmp_path / "s.jsonl")]) == 0
    assert (tmp_path / "s.jsonl").is_file()
    assert main(["audit", str(folder), "--json"]) == 0
    capsys.readouterr()
    assert main(["log", "verify", log]) == 0
    assert main(["log", "verify", str(folder / "notes.txt")]) == 1
    assert main(["log", "verify", str(folder / "notes.txt"), "--repair"]) == 1
    capsys.readouterr()
    assert_untouched(folder, before)


def test_cli_in_a_subprocess_takes_no_lock(frozen):
    folder, before = frozen
    for args, code in ((["log", "verify", str(folder / "ep.jsonl")], 0), (["export", str(folder / "ep.jsonl")], 0),
                       (["log", "verify", str(folder / "notes.txt")], 1)):
        proc = subprocess.run([sys.executable, "-m", "ctxkit.cli.parser", *args], capture_output=True, text=True)
        assert proc.returncode == code, proc.stderr
    assert_untouched(folder, before)


def test_writing_takes_the_lock_and_reading_after_it_still_works(tmp_path):
    path = tmp_path / "ep.jsonl"
    log = EventLog.create(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep.jsonl"]  # creating writes no lock file
    log.append(Message(role="user", content="hi"))  # appending does
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep.jsonl", "ep.jsonl.lock"]
    assert [e.id for e in read_events(path)] == ["e0-934f2f62"]
    log.close()


def test_a_reader_waits_for_a_line_in_flight(tmp_path):
    # A writer holds the lock while its line is half written: the reader sees a tail without a newline,
    # waits on the lock, and reads the finished line instead of reporting it torn.
    import threading

    from filelock import FileLock

    import shutil
    import threading

    from filelock import FileLock

    path, other = tmp_path / "ep.jsonl", tmp_path / "other.jsonl"
    with EventLog.create(path) as log:
        log.append(Message(role="user", content="one"))
    shutil.copyfile(path, other)
    with EventLog.open(other) as log:
        log.append(Message(role="user", content="two"))
    line = other.read_bytes()[path.stat().st_size:]
    lock = FileLock(str(path) + ".lock")
    lock.acquire()
    with open(path, "ab") as fh:
        fh.write(line[:10])
    got: list = []
    reader = threading.Thread(target=lambda: got.append(read_events(path)))
    reader.start()
    reader.join(timeout=0.5)  # let it reach the lock (a broken reader fails with TornLineError meanwhile)
    with open(path, "ab") as fh:
        fh.write(line[10:])
    lock.release()
    reader.join()
    assert [e.content for e in got[0]] == ["one", "two"]
