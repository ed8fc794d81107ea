"""`ctxkit replay` and `ctxkit samples` through `ctxkit.cli.parser.main` and one real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_module, tokenizer_dir
from rollout_driver import Driver
from log_tamper import flip, rechain
from ctxkit.context.builder import ContextBuilder
from ctxkit.cli.parser import main
from ctxkit.events import Step
from ctxkit.training.sample_files import read_samples
from ctxkit.log.event_log import EventLog, read_events


@pytest.fixture(scope="module")
def log_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    builder = ContextBuilder(str(tokenizer_dir("qwen2.5-instruct")), compressor="window", params={"keep_last": 2}, budget=520)
    log = EventLog.create(root / "ep.jsonl", episode_id="ep-cli")
    Driver(n_turns=6, episode_id="ep-cli").run(log, builder)
    log.close()
    return root / "ep.jsonl"


def test_verify_ok_and_json(log_path, capsys):
    assert main(["replay", str(log_path), "--verify"]) == 0
    assert capsys.readouterr().out.strip().endswith("6/6 steps verify: ok")
    assert main(["replay", str(log_path), "--verify", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["n_ok"] == 6 and [s["step"] for s in out["steps"]] == list(range(6))


def test_verify_fails_at_the_tampered_step(log_path, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(log_path.read_bytes())
    target = [e for e in read_events(log_path) if e.kind == "tool_result"][3]  # first seen by step 4

    def edit(body):
        for obj in body:
            if obj["id"] == target.id:
                obj["content"] = flip(obj["content"], 0)
        return body

    rechain(bad, edit)
    assert main(["replay", str(bad), "--verify"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("step 4 (seq ")
    assert "context hash mismatch" in out and out.strip().endswith("FAILED")


def test_step_json_gives_the_exact_ids(log_path, capsys):
    steps = [e for e in read_events(log_path) if isinstance(e, Step)]
    assert main(["replay", str(log_path), "--step", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["got_hash"] == steps[2].context_hash and len(out["token_ids"]) == steps[2].context_length


def test_step_shows_the_context_like_inspect(log_path, capsys):
    code = main(["replay", str(log_path), "--step", "-1"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[0].startswith("step 5 (seq ") and ": ok," in out.splitlines()[0]
    assert "notes.txt" in out and "verbatim" in out and "hash " + steps_hash(log_path, -1) in out


def test_bad_arguments(log_path, capsys):
    assert main(["replay", str(log_path), "--step", "9"]) == 2
    assert "the log has 6 step(s)" in capsys.readouterr().err
    assert main(["replay", str(log_path), "--verify", "--template", "chatml-tools-v1"]) == 2
    assert "recorded template id" in capsys.readouterr().err
    assert main(["replay", str(log_path)]) == 2  # --verify or --step is required
    assert capsys.readouterr().err == ("ctxkit: error: replay: one of the arguments --verify --step is required "
                                       "(see `ctxkit replay --help`)\n")


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_samples_command(log_path, tmp_path, capsys, suffix):
    if suffix == ".parquet":
        require_module("pyarrow")
    out = tmp_path / f"s{suffix}"
    assert main(["samples", str(log_path), str(log_path), "-o", str(out)]) == 0
    assert "samples from 2 log(s)" in capsys.readouterr().out
    rows = read_samples(out)
    from ctxkit.training.episode_samples import samples

    once = samples(log_path)
    assert rows == once + once
    assert main(["samples", str(log_path), "-o", str(tmp_path / "s.csv")]) == 2


def test_replay_verify_in_a_subprocess(log_path):
    proc = subprocess.run([sys.executable, "-m", "ctxkit.cli.parser", "replay", str(log_path), "--verify"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "6/6 steps verify: ok" in proc.stdout


def steps_hash(path: Path, k: int) -> str:
    return [e for e in read_events(path) if isinstance(e, Step)][k].context_hash
