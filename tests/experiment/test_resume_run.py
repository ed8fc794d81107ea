"""Killing a run midway and rerunning it gives the same results as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiment_configs import small_toml, strip_timing, write_config
from ctxkit.errors import ConfigError
from ctxkit.experiment.config import load_config
from ctxkit.experiment.runner import read_rows, run_experiment

REPO = Path(__file__).resolve().parents[2]


def _count_rows(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
def test_sigkill_midway_then_rerun_matches_an_uninterrupted_run(tmp_path):
    cfg_path = write_config(tmp_path, small_toml(seeds="[0, 1, 2]"))
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "ctxkit.cli.parser", "ablate", str(cfg_path), "--out", str(out), "--no-progress"],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 300
    try:
        while _count_rows(out / "results.jsonl") < 3:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.time() < deadline, "no rows after 300 s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    rows_at_kill = read_rows(out)
    assert 3 <= len(rows_at_kill) < 12, "the run finished before it could be killed"

    summary = run_experiment(load_config(cfg_path), out, progress=False)
    assert summary.total == 12 and summary.reused >= 3 and summary.reused + summary.ran == 12
    resumed = read_rows(out)
    assert len(resumed) == 12 and len({r["episode_id"] for r in resumed}) == 12
    # finished rows were kept as they were
    kept = {r["episode_id"]: r for r in resumed}
    for r in rows_at_kill:
        assert kept[r["episode_id"]] == r

    clean = tmp_path / "clean"
    run_experiment(load_config(cfg_path), clean, progress=False, report=False)
    assert strip_timing(resumed) == strip_timing(read_rows(clean))
    # every log of the resumed run is complete; set-aside partial logs are not in episodes/*.jsonl
    from ctxkit.log.event_log import verify

    logs = sorted((out / "episodes").rglob("*.jsonl"))
    assert len(logs) == 12 and all(verify(p).ok for p in logs)


def test_partial_log_and_torn_row_are_set_aside_and_rerun(tmp_path):
    cfg = load_config(write_config(tmp_path, small_toml(seeds="[0]")))
    out = tmp_path / "run"
    run_experiment(cfg, out, progress=False, report=False)
    complete = strip_timing(read_rows(out))
    rows = read_rows(out)
    # simulate a crash: the last episode's row is torn and its log cut short
    victim = rows[-1]
    log = out / victim["log"]
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[: len(lines) // 2]) + lines[len(lines) // 2][:10])
    data = (out / "results.jsonl").read_bytes()
    (out / "results.jsonl").write_bytes(data[: data.rindex(b"\n", 0, len(data) - 1) + 1] + b'{"arm": "win')
    summary = run_experiment(cfg, out, progress=False, report=False)
    assert (summary.reused, summary.ran) == (3, 1)
    assert [Path(p).name for p in summary.aborted_logs] == [log.name + ".aborted-1"]
    assert (log.parent / (log.name + ".aborted-1")).exists()
    assert strip_timing(read_rows(out)) == complete
    # a finished run reruns nothing
    again = run_experiment(cfg, out, progress=False, report=False)
    assert (again.reused, again.ran, again.aborted_logs) == (4, 0, ())


def test_a_row_whose_log_was_tampered_with_is_rerun(tmp_path):
    cfg = load_config(write_config(tmp_path, small_toml(seeds="[0]")))
    out = tmp_path / "run"
    run_experiment(cfg, out, progress=False, report=False)
    row = next(r for r in read_rows(out) if r["task"] == "needle-recall")
    log = out / row["log"]
    text = log.read_text()
    assert "logs/00.log" in text
    log.write_text(text.replace("logs/00.log", "logs/01.log", 1))
    summary = run_experiment(cfg, out, progress=False, report=False)
    assert summary.ran == 1 and summary.reused == 3


def test_another_config_in_the_same_folder_is_refused(tmp_path):
    out = tmp_path / "run"
    run_experiment(load_config(write_config(tmp_path, small_toml(seeds="[0]"), "a.toml")), out, progress=False, report=False)
    other = load_config(write_config(tmp_path, small_toml(seeds="[0, 1]"), "b.toml"))
    with pytest.raises(ConfigError, match="holds a run of another config"):
        run_experiment(other, out, progress=False)
    assert json.loads((out / "run.json").read_text())["experiment"]["seeds"] == [0]
