"""`ctxkit compressors` and `ctxkit build` through `ctxkit.cli.parser.main` and a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import tokenizer_dir
from ctxkit.cli.parser import main
from ctxkit.context.compress import COMPRESSORS
from ctxkit.events import EpisodeStart, Message, Step, ToolCall, ToolResult
from ctxkit.log.event_log import EventLog, read_events

CONSTRAINT = "Do not modify the original file."


@pytest.fixture()
def log_path(tmp_path):
    path = tmp_path / "ep.jsonl"
    log = EventLog.create(path)
    log.extend([EpisodeStart(episode_id="cli"), Message(role="system", content="You are careful."),
                Message(role="user", content=f"Fix it. {CONSTRAINT}")])
    for t in range(6):
        log.extend([Step(content=f"Step {t}.", tool_calls=(ToolCall(f"c{t}", "read", "{}"),)),
                    ToolResult(tool_call_id=f"c{t}", content=" ".join(f"w{t}_{i}" for i in range(60)))])
    log.close()
    return path


def test_compressors_json_lists_every_name_with_defaults(capsys):
    assert main(["compressors", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == set(COMPRESSORS)
    assert out["window"] == {"version": "window-v1", "params": {"trigger": "over_budget", "trigger_tokens": 0,
                                                                 "trigger_fraction": 0.8, "keep_first": 2,
                                                                 "keep_last": 1, "target_fraction": 0.75}}
    assert out["mask-observations"]["params"]["keep_last"] == 10
    assert main(["compressors"]) == 0
    assert "mask-observations-v1" in capsys.readouterr().out


def test_build_all_steps_json_does_not_touch_the_log(log_path, capsys):
    before = log_path.read_bytes()
    tok = str(tokenizer_dir("qwen2.5-instruct"))
    rc = main(["build", str(log_path), "--tokenizer", tok, "--compressor", "mask-observations",
               "--param", "keep_last=2", "--budget", "1200", "--all-steps", "--json"])
    assert rc == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["step"] for r in rows] == list(range(7))  # before each of the 6 assistant turns, and the next one
    for r in rows:
        assert r["n_tokens"] == len(r["token_ids"]) <= 1200
        assert len(r["pins_checked"]) == 1 and len(r["view_hash"]) == 64 and len(r["context_hash"]) == 64
    assert any("masked" in [p[0] for p in r["provenance"]] for r in rows)
    assert log_path.read_bytes() == before
    # --step K gives the same object as the K-th of --all-steps
    assert main(["build", str(log_path), "--tokenizer", tok, "--compressor", "mask-observations",
                 "--param", "keep_last=2", "--budget", "1200", "--step", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == rows[4]


def test_build_write_appends_pins_and_compaction(log_path, capsys):
    tok = str(tokenizer_dir("qwen2.5-instruct"))
    n = len(read_events(log_path))
    assert main(["build", str(log_path), "--tokenizer", tok, "--compressor", "window", "--budget", "700", "--write"]) == 0
    kinds = [e.kind for e in read_events(log_path)[n:]]
    assert kinds == ["pin", "compaction"]
    assert "step 0:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--compressor", "shrink"], "unknown compressor 'shrink'; registered compressors: ['keep-all'"),
    (["--compressor", "window", "--param", "keep_lst=1"], "unknown parameter(s) ['keep_lst']"),
    (["--compressor", "window", "--param", "oops"], "--param 'oops': expected KEY=VALUE"),
    (["--compressor", "window", "--step", "99"], "--step 99: the log has 6 assistant turn(s)"),
    (["--compressor", "keep-all", "--budget", "200"], "over the budget of 200 tokens"),
])
def test_build_errors_are_typed_and_named(log_path, capsys, argv, message):
    tok = str(tokenizer_dir("qwen2.5-instruct"))
    base = ["build", str(log_path), "--tokenizer", tok]
    if "--budget" not in argv:
        base += ["--budget", "900"]
    assert main(base + argv) == 2
    assert message in capsys.readouterr().err


def test_build_in_a_subprocess(log_path):
    tok = str(tokenizer_dir("qwen2.5-instruct"))
    proc = subprocess.run([sys.executable, "-m", "ctxkit.cli.parser", "build", str(log_path), "--tokenizer", tok,
                           "--compressor", "window", "--budget", "700"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("step 6: ") and "(budget 700)" in proc.stdout and "1 pin(s) checked" in proc.stdout
