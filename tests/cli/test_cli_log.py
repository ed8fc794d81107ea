"""`ctxkit log verify`, `ctxkit import`, `ctxkit export` through `ctxkit.cli.parser.main` and the installed entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ctxkit.cli.parser import main
from ctxkit.events import Message
from ctxkit.log.event_log import EventLog, read_events, verify

CONVERSATION = {
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Files in /tmp? "}, {"type": "text", "text": "ünïcode ✓"}]},
        {"role": "assistant", "content": None, "reasoning_content": "use ls",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \"/tmp\"}"}},
                        {"id": "call_2", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \"/\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "ls", "content": "a.txt\nb.txt"},
        {"role": "tool", "tool_call_id": "call_2", "content": "tmp\nusr"},
        {"role": "assistant", "content": "a.txt, b.txt", "weight": 0},
    ],
    "tools": [{"type": "function", "function": {"name": "ls", "description": "list a folder",
                                                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}],
    "pins": ["Never delete files.", {"pin_id": "style", "text": "Answer in one line."}],
}


def _write(path, obj):
    path.write_text(json.dumps(obj, ensure_ascii=False))
    return path


def test_import_then_export_round_trips(tmp_path, capsys):
    src = _write(tmp_path / "conv.json", CONVERSATION)
    log = tmp_path / "ep.jsonl"
    assert main(["import", str(src), "-o", str(log), "--episode-id", "demo-1"]) == 0
    assert f"wrote 10 events to {log} (episode demo-1)" in capsys.readouterr().out
    events = read_events(log)
    assert [e.kind for e in events] == ["episode_start", "pin", "pin"] + ["message"] * 6 + ["episode_end"]
    assert (events[-1].outcome, events[-1].cause, events[-1].reward, events[-1].reward_kind) == \
        ("truncated", "source_ended", None, "unscored")  # a chat file records no end: stated, not left to a default
    assert events[0].episode_id == "demo-1" and EventLog.open(log).header["episode_id"] == "demo-1"

    assert main(["export", str(log)]) == 0
    assert json.loads(capsys.readouterr().out) == CONVERSATION["messages"]
    assert main(["export", str(log), "--with-tools", "--compact"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out) == CONVERSATION
    assert main(["log", "verify", str(log)]) == 0
    assert capsys.readouterr().out == f"ok: {log}: 10 events, hash chain intact\n"


def test_import_bare_list_and_errors(tmp_path, capsys):
    src = _write(tmp_path / "bare.json", CONVERSATION["messages"][:2])
    assert main(["import", str(src), "-o", str(tmp_path / "a.jsonl")]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / "a.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out) == CONVERSATION["messages"][:2]

    assert main(["import", str(src), "-o", str(tmp_path / "a.jsonl")]) == 2
    assert "already exists" in capsys.readouterr().err

    bad = _write(tmp_path / "bad.json", [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "zz", "content": "y"}])
    assert main(["import", str(bad), "-o", str(tmp_path / "b.jsonl")]) == 2
    assert capsys.readouterr().err == (f"ctxkit: error: {bad}: messages[1]: tool message answers tool_call_id 'zz', "
                                       "which no earlier assistant message called (orphaned result)\n")
    assert not (tmp_path / "b.jsonl").exists()

    broken = tmp_path / "broken.json"
    broken.write_text('[{"role": "user",\n "content": }]')
    assert main(["import", str(broken), "-o", str(tmp_path / "c.jsonl")]) == 2
    assert f"ctxkit: error: {broken}:2: invalid JSON" in capsys.readouterr().err


def test_verify_exit_codes_and_repair(tmp_path, capsys):
    log = tmp_path / "ep.jsonl"
    with EventLog.create(log) as handle:
        handle.extend(Message(role="user", content=str(i)) for i in range(3))
    intact = log.read_bytes()
    with open(log, "ab") as fh:
        fh.write(b'{"content":"4","ext')
    assert main(["log", "verify", str(log)]) == 1
    assert f"{log}:5: [torn] last line is incomplete (19 bytes" in capsys.readouterr().out
    assert main(["log", "verify", str(log), "--repair"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [f"repaired: removed a torn last line of 19 bytes (kept in {log}.torn)",
                                f"ok: {log}: 3 events, hash chain intact"]
    assert log.read_bytes() == intact and verify(log).ok
    assert main(["log", "verify", str(log), "--repair"]) == 0  # nothing left to repair


def test_verify_json_report(tmp_path, capsys):
    log = tmp_path / "ep.jsonl"
    with EventLog.create(log) as handle:
        handle.extend(Message(role="user", content=f"m{i}") for i in range(4))
    lines = log.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b'"m2"', b'"M2"')
    log.write_bytes(b"\n".join(lines))
    assert main(["log", "verify", str(log), "--repair", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["ok"], report["n_events"], report["torn_tail"], report["repair"]) == (False, 4, False, None)
    assert [(p["line"], p["code"]) for p in report["problems"]] == [(4, "hash")]


def test_missing_file_is_an_error(tmp_path, capsys):
    assert main(["log", "verify", str(tmp_path / "none.jsonl")]) == 2
    assert "no such log file" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "none.jsonl")]) == 2
    assert list(tmp_path.iterdir()) == []  # no stray lock file for a log that is not there


@pytest.mark.parametrize("argv", [["log", "--help"], ["log", "verify", "--help"], ["import", "--help"], ["export", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0 and "usage: ctxkit" in capsys.readouterr().out


def test_entry_point_subprocess(tmp_path):
    log = tmp_path / "ep.jsonl"
    EventLog.create(log).close()
    log.write_bytes(log.read_bytes()[:-1])  # the header lost its newline only
    cmd = [sys.executable, "-m", "ctxkit.cli.parser", "log", "verify", str(log)]
    assert subprocess.run(cmd, capture_output=True).returncode == 1
    done = subprocess.run(cmd + ["--repair"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("repaired: completed the last line")
