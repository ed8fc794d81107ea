"""README.md runs as written, and its figures are those of a fresh run.

Every ```python block and every command of every ```bash/```sh/```shell/```console block is one test case,
named by its README line (`test_readme_block[L102-python]`), run in README order in one session workspace:
a folder laid out like a checkout (`ctxkit/` with copies of experiments/, examples/ and scripts/, and
`shared/` beside it), so nothing a command writes lands in the repository. Python blocks run one after
another in one fresh interpreter started there (README.md's "Running the examples" note: nothing is
predefined, later blocks use names earlier ones define); shell commands run in `bash` with this
interpreter's bin folder (the .venv) first on PATH. ```text and ```json blocks are output excerpts and never
run; any other fence fails `test_every_fence_is_known`.

Two commands cannot run as written inside a test: `bash scripts/quickstart.sh` runs with
`CTXKIT_SKIP_INSTALL=1` (no venv, no pip; the rest of the script, the quickstart ablation, runs as
written), and `bash scripts/test.sh` is the test suite itself, so the test checks that `.ci/run` runs it.
Selecting single cases with `-k` can break the ones that need an earlier case's files or names.

`test_readme_figures_current` then runs `scripts/readme_figures.py --check` on the same workspace (reusing
its quickstart run): every figure and excerpt between `<!-- fig:... -->` markers must match a fresh run.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO_ROOT, SHARED, missing_fixture
from readme_blocks import Case, PythonSession, cases, command_env, figures_script, fences, shell_commands

pytestmark = pytest.mark.slow  # the README runs as a whole (its blocks share one workspace): minutes, so the slow lane

README = REPO_ROOT / "README.md"
try:
    CASES, FENCE_ERROR = cases(README.read_text(encoding="utf-8")), None
except ValueError as exc:
    CASES, FENCE_ERROR = [], str(exc)

NOT_RUN = {"bash scripts/test.sh"}
"""Commands checked instead of run (they would run this test suite inside itself)."""
SKIP_INSTALL = {"bash scripts/quickstart.sh"}
"""Commands run with `CTXKIT_SKIP_INSTALL=1` (the install step cannot run inside the test environment)."""


@pytest.fixture(scope="session")
def readme_workspace(tmp_path_factory):
    """The session's workspace root; the README's cwd is `root / "ctxkit"`."""
    if not (SHARED / "tokenizers" / "qwen2.5-instruct").is_dir():
        missing_fixture(f"{SHARED}/tokenizers/qwen2.5-instruct (set CTXKIT_SHARED)")
    root = tmp_path_factory.mktemp("readme")
    figures_script().make_workspace(root, REPO_ROOT, SHARED)
    return root


@pytest.fixture(scope="session")
def python_session(readme_workspace):
    """One fresh interpreter for every ```python block, cwd the workspace."""
    session = PythonSession(readme_workspace / "ctxkit")
    yield session
    session.close()


def test_every_fence_is_known():
    assert FENCE_ERROR is None, FENCE_ERROR
    assert [c.kind for c in CASES].count("python") >= 4


def _command(case: Case) -> str:
    return case.code.split("#")[0].strip()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_readme_block(case: Case, readme_workspace, python_session):
    work = readme_workspace / "ctxkit"
    if case.kind == "python":
        # Padding keeps tracebacks on README line numbers ("README.md", line N).
        ok, out = python_session.run("\n" * case.line + case.code, str(README))
        assert ok, f"README.md line {case.line}: the python block failed:\n{out}"
        return
    command = _command(case)
    if command in NOT_RUN:
        assert "bash scripts/test.sh" in (REPO_ROOT / ".ci" / "run").read_text()
        assert "python -m pytest" in (REPO_ROOT / "scripts" / "test.sh").read_text()
        return
    env = command_env()
    if command in SKIP_INSTALL:
        env["CTXKIT_SKIP_INSTALL"] = "1"
    proc = subprocess.run(["bash", "-c", case.code], cwd=work, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (f"README.md line {case.line}: `{case.code}` exited {proc.returncode}\n"
                                  f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")


def test_readme_figures_current(readme_workspace):
    """The README's figures and excerpts equal a fresh run's (timings excluded)."""
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "readme_figures.py"), "--check",
                           "--work", str(readme_workspace)], env=command_env(), capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, f"{proc.stdout[-8000:]}\n{proc.stderr[-4000:]}"


def test_block_parsing():
    text = "\n".join([
        "# t", "```python", "x = 1", "```", "```bash", "# comment", "", "ctxkit a  # note", "ctxkit b \\",
        "  --c", "```", "```console", "$ ctxkit d", "output line", "```", "```text", "not run", "```",
    ])
    assert [f.lang for f in fences(text)] == ["python", "bash", "console", "text"]
    assert [(c.kind, c.line, c.code) for c in cases(text)] == [
        ("python", 2, "x = 1"), ("shell", 8, "ctxkit a  # note"), ("shell", 9, "ctxkit b \\\n  --c"),
        ("shell", 13, "ctxkit d"),
    ]
    assert shell_commands(fences(text)[2]) == [Case("shell", 13, "ctxkit d")]
    with pytest.raises(ValueError, match="README line 1: fence ```yaml is neither run"):
        cases("```yaml\na: 1\n```")
    with pytest.raises(ValueError, match="never closed"):
        fences("```bash\nls")
