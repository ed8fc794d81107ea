"""README.md as test cases: its fenced blocks, the shell commands in them, and a Python session to run them.

How the README is read (`tests/test_readme.py` runs it; README.md's "Running the examples" note says the same
to readers):

- ```python blocks run in README order in one fresh Python interpreter (`PythonSession`, like a notebook):
  nothing is predefined, a later block may use names an earlier block defined, and the cwd is the
  repository root (a copy of it, see `make_workspace`).
- ```bash / ```sh / ```shell blocks: every command line runs in `bash` as written (a line ending in `\\`
  continues on the next; `#` lines are comments). ```console blocks: the lines starting with `$ `.
- ```text and ```json blocks are output excerpts and never run (`OUTPUT_FENCES`). Any other fence
  (an untagged one included) is an error, so nothing is skipped silently.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

PYTHON_FENCES = frozenset({"python", "py"})
"""Fences whose body is run as Python."""
SHELL_FENCES = frozenset({"bash", "sh", "shell", "console"})
"""Fences whose commands are run in bash."""
OUTPUT_FENCES = frozenset({"text", "json"})
"""Fences holding printed output or file excerpts: never run."""

REPO = Path(__file__).resolve().parent.parent

@dataclass(frozen=True)
class Fence:
    """One fenced block of a Markdown file."""

    lang: str
    """The info string's first word ('' when untagged)."""
    line: int
    """1-based line of the opening fence."""
    body: str
    """The text between the fences."""


@dataclass(frozen=True)
class Case:
    """One runnable piece of the README: a Python block or one shell command."""

    kind: str
    """'python' or 'shell'."""
    line: int
    """1-based README line where the block (python) or the command (shell) starts."""
    code: str
    """The code or command, as written."""

    @property
    def id(self) -> str:
        """Test id naming the README line, e.g. `L102-python`."""
        return f"L{self.line}-{self.kind}"


def fences(text: str) -> list[Fence]:
    """Every fenced block of a Markdown text (``` fences, not nested)."""
    out: list[Fence] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("```"):
            lang = stripped[3:].strip().split(" ")[0] if stripped[3:].strip() else ""
            start = i
            i += 1
            body: list[str] = []
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            if i == len(lines):
                raise ValueError(f"README line {start + 1}: fence ```{lang} is never closed")
            out.append(Fence(lang=lang, line=start + 1, body="\n".join(body)))
        i += 1
    return out


def shell_commands(fence: Fence) -> list[Case]:
    """The commands of a shell fence, each with its README line."""
    out: list[Case] = []
    pending: list[str] = []
    pending_line = 0
    for k, raw in enumerate(fence.body.split("\n")):
        line_no = fence.line + 1 + k
        line = raw.rstrip()
        if fence.lang == "console" and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            pending_line = line_no
        pending.append(line)
        if line.endswith("\\"):
            continue
        out.append(Case("shell", pending_line, "\n".join(pending)))
        pending = []
    if pending:
        raise ValueError(f"README line {pending_line}: a command continues past the end of its block")
    return out


def cases(text: str) -> list[Case]:
    """Every runnable case of a README, in README order. Raises ValueError on an unknown fence."""
    out: list[Case] = []
    for f in fences(text):
        if f.lang in PYTHON_FENCES:
            out.append(Case("python", f.line, f.body))
        elif f.lang in SHELL_FENCES:
            out.extend(shell_commands(f))
        elif f.lang not in OUTPUT_FENCES:
            raise ValueError(
                f"README line {f.line}: fence ```{f.lang} is neither run ({sorted(PYTHON_FENCES | SHELL_FENCES)}) "
                f"nor output ({sorted(OUTPUT_FENCES)})"
            )
    return out


def figures_script():
    """`scripts/readme_figures.py` as a module (its `make_workspace`, `main`)."""
    spec = importlib.util.spec_from_file_location("readme_figures", REPO / "scripts" / "readme_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command_env() -> dict[str, str]:
    """Environment for README commands: the interpreter's bin folder (the .venv) first on PATH, offline."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", COLUMNS="120")
    return env


_KERNEL = r"""
import io, json, sys, traceback
tag = sys.argv[1]
out = sys.stdout
ns = {"__name__": "__main__"}
for line in sys.stdin:
    req = json.loads(line)
    buf = io.StringIO()
    sys.stdout = buf
    try:
        exec(compile(req["code"], req["name"], "exec"), ns)
        res = {"ok": True}
    except BaseException:
        res = {"ok": False, "error": traceback.format_exc()}
    finally:
        sys.stdout = out
    res["stdout"] = buf.getvalue()
    out.write(tag + json.dumps(res) + "\n")
    out.flush()
"""


class PythonSession:
    """A fresh Python interpreter that runs code blocks one after another in one namespace."""

    def __init__(self, cwd: Path, env: dict[str, str] | None = None) -> None:
        self._tag = f"@@readme-{uuid.uuid4().hex}@@"
        self._proc = subprocess.Popen(
            [sys.executable, "-u", "-c", _KERNEL, self._tag], cwd=cwd, env=env or command_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True,
        )

    def run(self, code: str, name: str) -> tuple[bool, str]:
        """Run one block; returns (ok, traceback or printed output)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"code": code, "name": name}) + "\n")
        self._proc.stdin.flush()
        for line in self._proc.stdout:
            if line.startswith(self._tag):
                res = json.loads(line[len(self._tag):])
                return res["ok"], res.get("error") or res["stdout"]
        return False, f"the Python session ended (exit {self._proc.wait()})"

    def close(self) -> None:
        """End the interpreter."""
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
