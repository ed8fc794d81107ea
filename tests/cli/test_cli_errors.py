"""Bad input to the CLI, each case in a real subprocess: exit 2, exactly one `ctxkit: error:` line on
stderr naming what and where, no traceback, and no partial output left behind.

The cases share one folder of inputs built once (in-process, with the library). Read-only places for
root: a path under a regular file, `/proc` and `/sys` (where even root cannot create files), and an
immutable log (`chattr +i`; a plain `chmod` when not root). `ablate`/`report` cases live with the
experiment tests; untrusted templates with the template tests.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, missing_fixture, shared_path

TOKENIZER = ["--tokenizer", "tiktoken:cl100k_base", "--template", "chatml-tools-v1"]
CONVERSATION = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def without(module: str) -> str:
    """`python -c` code running the CLI with `module` unimportable, as on an install without its extra."""
    return f"import sys; sys.modules[{module!r}] = None; from ctxkit.cli.parser import main; sys.exit(main(sys.argv[1:]))"


def _env() -> dict[str, str]:
    return dict(os.environ, CTXKIT_SHARED=str(shared_path()), CTXKIT_TIKTOKEN_DIR=str(shared_path("tiktoken")),
                HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(REPO_ROOT), COLUMNS="120")


def _make_read_only(path: Path) -> bool:
    """Make `path` unwritable for this user (root: the immutable flag); False when that is not possible."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        return True
    chattr = shutil.which("chattr")
    return bool(chattr) and subprocess.run([chattr, "+i", str(path)], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder of inputs: a conversation, a log, a regular file, a folder, binary and broken files."""
    from ctxkit.log.event_log import EventLog, import_conversation

    root = tmp_path_factory.mktemp("cli_errors")
    (root / "conv.json").write_text(json.dumps(CONVERSATION))
    (root / "tools_nope.json").write_text(json.dumps({**CONVERSATION, "tools": "nope"}))
    (root / "tool_no_id.json").write_text(json.dumps([{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]))
    (root / "empty_list.json").write_text("[]")
    (root / "null_message.json").write_text(json.dumps({"messages": [{"role": "user", "content": "x"}, None]}))
    (root / "broken.json").write_text('{"messages": [\n  {"role": "user",\n   "content": }\n]}')
    binary = (bytes(range(128, 256)) + b"\n") * 20
    (root / "binary.json").write_bytes(binary)
    (root / "binary.jsonl").write_bytes(binary)
    (root / "afile").write_text("a regular file\n")
    (root / "adir").mkdir()
    for name in ("ep.jsonl", "ro.jsonl"):
        with EventLog.create(root / name, episode_id="cli-errors") as log:
            log.extend(import_conversation(CONVERSATION)[1:])
    with EventLog.create(root / "pin.jsonl", episode_id="cli-errors-pin") as log:  # a constraint the builder pins
        log.extend(import_conversation([{"role": "user", "content": "Do not modify the original config file."}])[1:])
    read_only = _make_read_only(root / "ro.jsonl")
    yield root, read_only
    if read_only and os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(root / "ro.jsonl")], capture_output=True)


# (id, argv, text the error line must hold, outputs that must not exist afterwards); "{d}" is the work folder
CASES = [
    ("import-o-under-a-file", ["import", "{d}/conv.json", "-o", "{d}/afile/out.jsonl"],
     "-o {d}/afile/out.jsonl: {d}/afile is a file, not a folder", ["{d}/afile/out.jsonl"]),
    ("import-o-proc", ["import", "{d}/conv.json", "-o", "/proc/ctxkit-out.jsonl"],
     "-o /proc/ctxkit-out.jsonl: cannot write", ["/proc/ctxkit-out.jsonl"]),
    ("import-o-sys", ["import", "{d}/conv.json", "-o", "/sys/ctxkit-out.jsonl"],
     "-o /sys/ctxkit-out.jsonl: cannot write", ["/sys/ctxkit-out.jsonl"]),
    ("import-o-dir-slash", ["import", "{d}/conv.json", "-o", "{d}/adir/"], "-o {d}/adir/: is a folder", []),
    ("import-o-new-dir-slash", ["import", "{d}/conv.json", "-o", "{d}/newdir/"], "-o {d}/newdir/: is a folder",
     ["{d}/newdir"]),
    ("import-o-dir", ["import", "{d}/conv.json", "-o", "{d}/adir"], "-o {d}/adir: is a folder", []),
    ("import-binary", ["import", "{d}/binary.json", "-o", "{d}/b.jsonl"], "{d}/binary.json:1: invalid JSON",
     ["{d}/b.jsonl"]),
    ("import-folder", ["import", "{d}/adir", "-o", "{d}/b.jsonl"], "{d}/adir: cannot read: Is a directory",
     ["{d}/b.jsonl"]),
    ("import-bad-json", ["import", "{d}/broken.json", "-o", "{d}/b.jsonl"], "{d}/broken.json:3: invalid JSON",
     ["{d}/b.jsonl"]),
    ("samples-o-under-a-file", ["samples", "{d}/ep.jsonl", "-o", "{d}/afile/s.jsonl"],
     "-o {d}/afile/s.jsonl: {d}/afile is a file, not a folder", ["{d}/afile/s.jsonl"]),
    ("samples-o-proc", ["samples", "{d}/ep.jsonl", "-o", "/proc/ctxkit-s.jsonl"],
     "-o /proc/ctxkit-s.jsonl: cannot write", ["/proc/ctxkit-s.jsonl"]),
    ("samples-o-dir", ["samples", "{d}/ep.jsonl", "-o", "{d}/adir/"], "-o {d}/adir/: is a folder", []),
    ("samples-o-unknown-format", ["samples", "{d}/ep.jsonl", "-o", "{d}/s.txt"],
     "-o {d}/s.txt: unknown format .txt", ["{d}/s.txt"]),
    ("samples-no-logs", ["samples", "{d}/adir", "-o", "{d}/s.jsonl"], "no episode logs found in {d}/adir",
     ["{d}/s.jsonl"]),
    ("samples-binary", ["samples", "{d}/binary.jsonl", "-o", "{d}/s.jsonl"], "{d}/binary.jsonl:1: invalid JSON",
     ["{d}/s.jsonl"]),
    ("samples-no-tokenizer", ["samples", "{d}/ep.jsonl", "-o", "{d}/s.jsonl"], "{d}/ep.jsonl: the log records no tokenizer",
     ["{d}/s.jsonl"]),
    ("build-write-read-only", ["build", "{d}/ro.jsonl", "--write", *TOKENIZER, "--budget", "500"],
     "--write {d}/ro.jsonl: cannot open the log for appending", []),
    ("build-write-over-budget", ["build", "{d}/pin.jsonl", "--write", *TOKENIZER, "--budget", "10"],
     "over the budget of 10", []),  # the pin it detected is not appended either: the log is unchanged
    ("build-budget-negative", ["build", "{d}/ep.jsonl", *TOKENIZER, "--budget", "-5"],
     "build: argument --budget: expected an integer >= 1, got -5", []),
    ("build-folder", ["build", "{d}/adir", *TOKENIZER, "--budget", "500"], "{d}/adir: is a directory", []),
    ("render-tools-not-a-list", ["render", "{d}/tools_nope.json", *TOKENIZER],
     '{d}/tools_nope.json: conversation: "tools" must be a list', []),
    ("render-tool-without-call-id", ["render", "{d}/tool_no_id.json", *TOKENIZER],
     "{d}/tool_no_id.json: messages[1]: a tool message needs a string tool_call_id", []),
    ("render-empty-list", ["render", "{d}/empty_list.json", *TOKENIZER],
     "{d}/empty_list.json: the conversation holds no messages to render", []),
    ("render-null-message", ["render", "{d}/null_message.json", *TOKENIZER],
     "{d}/null_message.json: messages[1]: expected an object, got NoneType", []),
    ("render-binary", ["render", "{d}/binary.json", *TOKENIZER], "{d}/binary.json:1: invalid JSON", []),
    ("render-missing", ["render", "{d}/missing.json", *TOKENIZER], "{d}/missing.json: cannot read", []),
    ("render-bad-json", ["render", "{d}/broken.json", *TOKENIZER], "{d}/broken.json:3: invalid JSON", []),
    ("render-binary-log", ["render", "{d}/binary.jsonl", *TOKENIZER], "{d}/binary.jsonl:1: invalid JSON", []),
    ("inspect-max-tokens-negative", ["inspect", "{d}/conv.json", *TOKENIZER, "--max-tokens", "-5"],
     "inspect: argument --max-tokens: expected an integer >= 0, got -5", []),
    ("replay-max-tokens-negative", ["replay", "{d}/ep.jsonl", "--step", "0", "--max-tokens", "-5"],
     "replay: argument --max-tokens: expected an integer >= 0, got -5", []),
    ("replay-missing", ["replay", "{d}/missing.jsonl", "--verify"], "{d}/missing.jsonl: no such log file", []),
    ("export-binary", ["export", "{d}/binary.jsonl"], "{d}/binary.jsonl:1: invalid JSON", []),
    ("log-verify-folder", ["log", "verify", "{d}/adir"], "{d}/adir: is a directory", []),
    ("audit-no-logs", ["audit", "{d}/adir"], "no episode logs found in {d}/adir", []),
    ("bench-build-no-compressor", ["bench", "build", "--compressors", ","], "--compressors ',': no compressor named", []),
    ("bench-render-zero-turns", ["bench", "render", "--turns", "0"],
     "bench render: argument --turns: expected an integer >= 1, got 0", []),
    ("bench-build-without-langchain", ["-c", without("langchain_core"), "bench", "build", "--turns", "2", "--repeats", "1"],
     "needs the python package 'langchain-core', which is not installed; install it with: pip install 'ctxkit[test]'",
     []),
    ("samples-parquet-without-pyarrow", ["-c", without("pyarrow"), "samples", "{d}/ep.jsonl", "-o", "{d}/s.parquet"],
     "ctxkit samples -o {d}/s.parquet (Parquet) needs the python package 'pyarrow', which is not installed; "
     "install it with: pip install 'ctxkit[export]'", ["{d}/s.parquet"]),
    ("import-empty-episode-id", ["import", "{d}/conv.json", "-o", "{d}/b.jsonl", "--episode-id", " "],
     "--episode-id ' ': expected a non-empty, printable id", ["{d}/b.jsonl"]),
]


def _listing(folder: Path) -> dict[str, bytes | None]:
    """Every entry under `folder` (lock files aside) with the bytes of files."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*")) if not p.name.endswith(".lock")}


@pytest.mark.parametrize("argv, expected, outputs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line(work, argv, expected, outputs):
    folder, read_only = work
    if "{d}/ro.jsonl" in argv and not read_only:
        missing_fixture("cannot make a file read-only here (chattr +i failed)")
    d = str(folder)
    argv = [a if a.startswith("import sys;") else a.format(d=d) for a in argv]
    before = _listing(folder)
    cmd = [sys.executable, *argv] if argv[0] == "-c" else [sys.executable, "-m", "ctxkit.cli.parser", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=folder, timeout=300)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctxkit: error: "), proc.stderr
    assert expected.format(d=d) in lines[0]
    for out in outputs:
        assert not os.path.lexists(out.format(d=d))
    assert _listing(folder) == before  # nothing written, nothing half-written, inputs untouched


def test_ctrl_c_is_a_short_message_and_exit_130(tmp_path):
    """SIGINT while `import` waits on its input (a FIFO: the writer's open returns once the command has
    opened it, so the signal lands inside the command): `ctxkit: interrupted`, exit 130, no output."""
    fifo = tmp_path / "conv.json"
    os.mkfifo(fifo)
    out = tmp_path / "ep.jsonl"
    # A job started in the background by a shell inherits SIGINT ignored, and Python then installs no handler:
    # the command starts with the default disposition, as it does in a terminal.
    proc = subprocess.Popen([sys.executable, "-m", "ctxkit.cli.parser", "import", str(fifo), "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        with open(fifo, "w"):
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (proc.returncode, stderr, stdout) == (130, "ctxkit: interrupted\n", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv.json"]


def test_full_disk_on_stdout_is_one_error_line(work):
    folder, _ = work
    if not os.path.exists("/dev/full"):
        missing_fixture("/dev/full (a device that is always full)")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "ctxkit.cli.parser", "export", str(folder / "ep.jsonl")], stdout=full,
                              stderr=subprocess.PIPE, text=True, env=_env(), timeout=300)
    assert (proc.returncode, proc.stderr) == (2, "ctxkit: error: writing output: No space left on device\n")
