"""`ctxkit ablate` and `ctxkit report` on bad input, two runs on one folder, and Ctrl-C, as a user meets them:
the real command in a subprocess, one `ctxkit: error:` line and exit 2, no traceback, nothing half-written."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import missing_fixture
from experiment_configs import tiny_toml, write_config
from ctxkit.experiment.config import load_config
from ctxkit.experiment.run_folder import LOCK, RunLock, read_rows
from ctxkit.experiment.runner import run_experiment

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
CLI = [sys.executable, "-m", "ctxkit.cli.parser"]
HANG_GUARD_S = 300  # a subprocess that runs this long is stuck; not a timing assertion


def _ctxkit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=HANG_GUARD_S)


def _snapshot(root: Path) -> list[tuple[str, bytes | None]]:
    return sorted((p.relative_to(root).as_posix(), None if p.is_dir() else p.read_bytes()) for p in root.rglob("*"))


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished one-episode run folder (results.jsonl, run.json, the log), without report."""
    tmp = tmp_path_factory.mktemp("finished")
    out = tmp / "run"
    run_experiment(load_config(write_config(tmp, tiny_toml())), out, progress=False, report=False)
    return out


def _run_copy(tmp: Path, finished: Path) -> Path:
    run = tmp / "run"
    shutil.copytree(finished, run)
    return run


def _first_row(finished: Path) -> bytes:
    return (finished / "results.jsonl").read_bytes()


# Each case sets up files under tmp and returns (argv, text the error line must contain).
def _out_is_a_file(tmp, finished):
    (tmp / "out.txt").write_text("not a folder\n")
    return ["ablate", str(write_config(tmp, tiny_toml())), "--out", str(tmp / "out.txt")], \
        f"{tmp / 'out.txt'}: exists and is not a folder"


def _out_under_a_file(tmp, finished):
    (tmp / "plain").write_text("x")
    return ["ablate", str(write_config(tmp, tiny_toml())), "--out", str(tmp / "plain" / "run")], \
        f"{tmp / 'plain' / 'run'}: cannot create the run folder (--out): {tmp / 'plain'} is a file, not a folder"


def _out_in_proc(tmp, finished):  # read-only for root too
    return ["ablate", str(write_config(tmp, tiny_toml())), "--out", "/proc/ctxkit-test-run/run"], \
        "/proc/ctxkit-test-run/run: cannot create the run folder (--out) in /proc:"


def _binary_config(tmp, finished):
    (tmp / "exp.toml").write_bytes(b'name = "x"\n\x89PNG\r\n\x1a\n\x00\xff\xfe')
    return ["ablate", str(tmp / "exp.toml"), "--out", str(tmp / "run")], \
        f"{tmp / 'exp.toml'}:2: not a TOML config: not UTF-8 text (byte 0x89 at offset 11"


def _config_is_a_folder(tmp, finished):
    (tmp / "configs").mkdir()
    return ["ablate", str(tmp / "configs"), "--out", str(tmp / "run")], \
        f"{tmp / 'configs'}: is a folder; expected an experiment config file (.toml)"


def _ray_unreachable(tmp, finished):
    return ["ablate", str(write_config(tmp, tiny_toml())), "--out", str(tmp / "run"), "--executor", "ray",
            "--address", "127.0.0.1:1"], "Ray address '127.0.0.1:1': no Ray cluster reachable there"


def _needle_pool(tmp, finished, extra=()):
    cfg = write_config(tmp, tiny_toml(n_files=500))
    return ["ablate", str(cfg), "--out", str(tmp / "run"), *extra], \
        f"{cfg}: task 'needle-recall': n_files must be in [3, 100] (each file but the last logs a distinct vault number"


def _needle_pool_validate_only(tmp, finished):
    return _needle_pool(tmp, finished, ("--validate-only",))


def _folder_in_use(tmp, finished):
    run = _run_copy(tmp, finished)
    lock = RunLock(run).acquire()  # a real flock, held by this test process until the module is unloaded
    _HELD.append(lock)
    return ["ablate", str(write_config(tmp, tiny_toml())), "--out", str(run)], \
        f"{run}: the run folder is in use by another `ctxkit ablate` (pid {os.getpid()})"


_HELD: list[RunLock] = []


def _resume_over_a_foreign_row(tmp, finished):
    run = _run_copy(tmp, finished)
    (run / "results.jsonl").write_bytes(b'["not", "a", "row"]\n' + _first_row(finished))
    return ["ablate", str(write_config(tmp, tiny_toml())), "--out", str(run)], \
        f"{run / 'results.jsonl'}:1: not a ctxkit results row (a JSON list, expected an object)"


def _report_foreign_row(tmp, finished):
    run = _run_copy(tmp, finished)
    (run / "results.jsonl").write_bytes(_first_row(finished) + b'{"id": 7, "text": "hello"}\n')
    return ["report", str(run)], f"{run / 'results.jsonl'}:2: not a ctxkit results row: missing field(s) ['arm'"


def _report_wrong_type(tmp, finished):
    run = _run_copy(tmp, finished)
    row = json.loads(_first_row(finished))
    (run / "results.jsonl").write_text(json.dumps({**row, "quality": "high"}) + "\n")
    return ["report", str(run)], f"{run / 'results.jsonl'}:1: field 'quality' is 'high'; expected a number"


def _report_binary(tmp, finished):
    run = _run_copy(tmp, finished)
    (run / "results.jsonl").write_bytes(b"\x1f\x8b\x08\x00\xff\x00binary\n")
    return ["report", str(run)], f"{run / 'results.jsonl'}:1: not UTF-8 text (byte 0x8b at column 2)"


def _report_cut_line(tmp, finished):
    run = _run_copy(tmp, finished)
    first = _first_row(finished)
    (run / "results.jsonl").write_bytes(first + first[:40])
    return ["report", str(run)], f"{run / 'results.jsonl'}:2: line cut mid-way"


def _report_duplicate(tmp, finished):
    run = _run_copy(tmp, finished)
    first = _first_row(finished)
    (run / "results.jsonl").write_bytes(first + first)
    return ["report", str(run)], \
        f"{run / 'results.jsonl'}:2: episode 'window+pins/needle-recall-0' already has a row on line 1"


def _report_target_is_a_folder(tmp, finished):  # a place the report cannot be written, whoever runs it
    run = _run_copy(tmp, finished)
    (run / "report.md").mkdir()
    return ["report", str(run)], f"{run / 'report.md'}: is a folder; cannot write the report there"


CASES = {
    "ablate --out is a file": _out_is_a_file,
    "ablate --out under a file": _out_under_a_file,
    "ablate --out in /proc": _out_in_proc,
    "ablate binary config": _binary_config,
    "ablate config is a folder": _config_is_a_folder,
    "ablate ray address unreachable": _ray_unreachable,
    "ablate needle-recall n_files over the pool": _needle_pool,
    "ablate --validate-only needle-recall n_files over the pool": _needle_pool_validate_only,
    "ablate run folder in use": _folder_in_use,
    "ablate resume over a foreign row": _resume_over_a_foreign_row,
    "report foreign row": _report_foreign_row,
    "report wrong field type": _report_wrong_type,
    "report binary content": _report_binary,
    "report line cut mid-way": _report_cut_line,
    "report duplicate episode": _report_duplicate,
    "report target is a folder": _report_target_is_a_folder,
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_error_line_exit_2_and_nothing_written(case, tmp_path, finished):
    if case == "ablate --out in /proc" and not Path("/proc/self").exists():
        pytest.skip("no /proc on this system")
    argv, expected = CASES[case](tmp_path, finished)
    before = _snapshot(tmp_path)
    proc = _ctxkit(*argv)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctxkit: error: "), proc.stderr
    assert expected in lines[0], lines[0]
    assert proc.stdout == ""
    assert _snapshot(tmp_path) == before  # no partial output: not a folder, a row, a plot or a temporary
    assert not Path("/proc/ctxkit-test-run").exists()


def _without_root_override() -> list[str]:
    """A command prefix under which permission bits hold even for root (tests here run as root): util-linux
    `setpriv` drops the capabilities that let root write anywhere from the child's bounding set."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        missing_fixture("util-linux `setpriv` (to drop root's permission override in a child)")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_report_into_a_read_only_folder(tmp_path, finished):
    run = _run_copy(tmp_path, finished)
    before = _snapshot(run)
    run.chmod(0o555)
    try:
        proc = subprocess.run([*_without_root_override(), *CLI, "report", str(run)], cwd=REPO, env=ENV,
                              capture_output=True, text=True, timeout=HANG_GUARD_S)
    finally:
        run.chmod(0o755)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"ctxkit: error: {run}: cannot write the report: ") and proc.stderr.count("\n") == 1
    assert _snapshot(run) == before and not (run / "report.md").exists()


def _rows_on_disk(out: Path) -> int:
    path = out / "results.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _start(cfg: Path, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "ablate", str(cfg), "--out", str(out), "--no-progress", *extra], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # a suite started in the background (`cmd &`) hands SIGINT down ignored, and Python
                            # then installs no Ctrl-C handler: give the run the default a terminal would
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for_rows(proc: subprocess.Popen, out: Path, n: int) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while _rows_on_disk(out) < n:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no results row: the run is stuck"
        time.sleep(0.02)


def _episode_ids(out: Path) -> list[str]:
    return [json.loads(line)["episode_id"] for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_keeps_finished_episodes_and_a_rerun_resumes(tmp_path, workers):
    cfg = write_config(tmp_path, tiny_toml(seeds="[0, 1, 2, 3, 4, 5, 6, 7]"))
    out = tmp_path / "run"
    proc = _start(cfg, out, "--workers", str(workers))
    try:
        _wait_for_rows(proc, out, 1)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group, workers included
        stdout, stderr = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    kept = _rows_on_disk(out)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and stdout == ""
    assert stderr == f"ctxkit: interrupted; {kept} finished episode{'s' if kept != 1 else ''} kept in {out}, rerun to resume\n"
    assert 1 <= kept < 8, "the run finished before it could be interrupted"
    assert not (out / "report.md").exists()

    proc = _ctxkit("ablate", str(cfg), "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"8 episodes: {8 - kept} run, {kept} reused")
    ids = _episode_ids(out)
    assert sorted(ids) == sorted(f"window+pins/needle-recall-{s}" for s in range(8))  # each once
    assert len(read_rows(out)) == 8


def test_a_second_ablate_on_the_same_folder_is_refused_and_rows_stay_unique(tmp_path):
    cfg = write_config(tmp_path, tiny_toml(seeds="[0, 1, 2, 3, 4, 5]"))
    out = tmp_path / "run"
    first = _start(cfg, out)
    try:
        _wait_for_rows(first, out, 1)
        os.killpg(first.pid, signal.SIGSTOP)  # paused mid-run, holding its lock, so the second surely meets it
        try:
            second = _ctxkit("ablate", str(cfg), "--out", str(out), "--no-progress")
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        stdout, stderr = first.communicate(timeout=HANG_GUARD_S)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert second.returncode == 2 and second.stdout == "" and "Traceback" not in second.stderr
    assert second.stderr == (f"ctxkit: error: {out}: the run folder is in use by another `ctxkit ablate` (pid {first.pid}); "
                             "wait for it to finish or use another --out folder\n")
    assert first.returncode == 0, stderr
    ids = _episode_ids(out)
    assert sorted(ids) == sorted(f"window+pins/needle-recall-{s}" for s in range(6))
    # released on exit: the next run takes the lock and reuses everything
    again = _ctxkit("ablate", str(cfg), "--out", str(out), "--no-progress")
    assert again.returncode == 0 and again.stdout.startswith("6 episodes: 0 run, 6 reused"), again.stderr


def test_a_lock_left_by_a_killed_run_does_not_block_a_rerun(tmp_path):
    cfg = write_config(tmp_path, tiny_toml(seeds="[0, 1, 2, 3, 4, 5]"))
    out = tmp_path / "run"
    proc = _start(cfg, out)
    try:
        _wait_for_rows(proc, out, 1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert (out / LOCK).read_text() == str(proc.pid)  # the stale lock file is still there, holding a dead pid
    again = _ctxkit("ablate", str(cfg), "--out", str(out), "--no-progress")
    assert again.returncode == 0, again.stderr
    assert sorted(_episode_ids(out)) == sorted(f"window+pins/needle-recall-{s}" for s in range(6))


def test_a_run_with_duplicate_rows_is_repaired_by_a_rerun(tmp_path, finished):
    run = _run_copy(tmp_path, finished)
    first = _first_row(finished)
    (run / "results.jsonl").write_bytes(first + first)
    summary = run_experiment(load_config(write_config(tmp_path, tiny_toml())), run, progress=False, report=False)
    assert (summary.reused, summary.ran) == (1, 0)
    assert (run / "results.jsonl").read_bytes() == first


def test_sigterm_stops_the_workers_with_the_run(tmp_path):
    """`kill PID` (SIGTERM to the parent alone) stops the run as Ctrl-C does: no worker is left running
    episodes into the folder, the finished ones are kept, and a rerun resumes."""
    cfg = write_config(tmp_path, tiny_toml(seeds="[0, 1, 2, 3, 4, 5, 6, 7]"))
    out = tmp_path / "run"
    proc = _start(cfg, out, "--workers", "2")
    try:
        _wait_for_rows(proc, out, 1)
        proc.send_signal(signal.SIGTERM)  # the parent only, as `kill` or `pkill -f "ctxkit ablate"` does
        _, stderr = proc.communicate(timeout=HANG_GUARD_S)
        deadline = time.monotonic() + HANG_GUARD_S
        while True:  # every process of the run's group is gone: the workers stopped with their parent
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, "a worker outlived the run it belongs to"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    kept = _rows_on_disk(out)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    assert 1 <= kept < 8 and len(set(_episode_ids(out))) == kept
    rerun = _ctxkit("ablate", str(cfg), "--out", str(out), "--no-progress")
    assert rerun.returncode == 0 and rerun.stdout.startswith(f"8 episodes: {8 - kept} run, {kept} reused"), rerun.stderr
