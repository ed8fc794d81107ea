"""Tasks: seeded and deterministic, real tools in real folders, scorers, typed parameter errors."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from ctxkit.errors import ConfigError
from ctxkit.experiment.tasks.base import TASKS, make_task
from ctxkit.experiment.tasks.calculator_chain import evaluate
from ctxkit.experiment.tasks.tools import InvalidToolCall, ToolBox, calculator_tools, file_tools


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_same_seed_same_episode_other_seed_other_episode(name, tmp_path):
    task = make_task(name)
    a, b, c = (tmp_path / x for x in "abc")
    for d in (a, b, c):
        d.mkdir()
    ea, eb, ec = task.episode(3, a), task.episode(3, b), task.episode(4, c)
    assert _tree(a) == _tree(b) and ea.facts == eb.facts and ea.messages == eb.messages and ea.tools == eb.tools
    assert _tree(a) != _tree(c)
    assert len(_tree(a)) >= 4
    assert ea.messages[0]["role"] == "system" and ea.messages[1]["role"] == "user"


@pytest.mark.parametrize("name", sorted(TASKS))
def test_fault_injection_kinds(name, tmp_path):
    for fault, status in (("raise", "error"), ("error", "error"), ("timeout", "timeout")):
        d = tmp_path / fault
        d.mkdir()
        ep = make_task(name, {"fault_at_call": 1, "fault": fault}).episode(0, d)
        first = ep.call_tool("read_file", '{"path": "' + _first_file(d) + '"}')
        assert first.status == "ok"
        second = ep.call_tool("read_file", '{"path": "' + _first_file(d) + '"}')
        assert second.status == status, (fault, second)
        assert ep.call_tool("read_file", '{"path": "' + _first_file(d) + '"}').status == "ok"  # only that call


def _first_file(root: Path) -> str:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())[0]


def test_make_task_errors_name_the_problem():
    with pytest.raises(ConfigError, match=r"config: unknown task .nope..*registered tasks"):
        make_task("nope")
    with pytest.raises(ConfigError, match=r"cfg.toml: task 'needle-recall' has no parameter\(s\) \['n_file'\]"):
        make_task("needle-recall", {"n_file": 3}, where="cfg.toml")
    with pytest.raises(ConfigError, match=r"parameter 'n_files' must be int, got '8'"):
        make_task("needle-recall", {"n_files": "8"})
    with pytest.raises(ConfigError, match=r"needle_file must be in \[0, 2\]"):
        make_task("needle-recall", {"n_files": 4, "needle_file": 3})
    with pytest.raises(ConfigError, match=r"fault must be one of"):
        make_task("multi-hop", {"fault": "explode"})
    with pytest.raises(ConfigError, match=r"lag must be in"):
        make_task("calculator-chain", {"n_steps": 3, "lag": 3})


def test_file_tools_are_real_and_sandboxed(tmp_path):
    (tmp_path / "a.txt").write_text("alpha\nbeta ACCESS\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("gamma access\n")
    box = ToolBox(file_tools(tmp_path, writable=True))
    assert box.call("read_file", '{"path": "a.txt"}').content == "FILE a.txt\nalpha\nbeta ACCESS\n"
    assert box.call("list_dir", "{}").content == "DIR .\na.txt\nsub/"
    assert box.call("search", '{"query": "access"}').content == (
        "SEARCH 'access': 2 match(es)\na.txt:2: beta ACCESS\nsub/b.txt:1: gamma access")
    assert box.call("copy_file", '{"src": "a.txt", "dst": "c/d.txt"}').content == "COPIED a.txt -> c/d.txt"
    assert box.call("replace_in_file", '{"path": "c/d.txt", "old": "beta", "new": "BETA"}').status == "ok"
    assert (tmp_path / "c" / "d.txt").read_text() == "alpha\nBETA ACCESS\n"
    assert (tmp_path / "a.txt").read_text() == "alpha\nbeta ACCESS\n"
    escape = box.call("read_file", '{"path": "../../etc/passwd"}')
    assert escape.status == "error" and "outside the working directory" in escape.content
    missing = box.call("read_file", '{"path": "zzz"}')
    assert missing.status == "error" and "no such file" in missing.content


@pytest.mark.parametrize("name,args,message", [
    ("nope", "{}", "unknown tool 'nope'"),
    ("read_file", "{bad json", "not valid JSON"),
    ("read_file", "{}", r"missing argument\(s\) \['path'\]"),
    ("read_file", '{"path": "a", "x": 1}', r"unknown argument\(s\) \['x'\]"),
    ("read_file", '{"path": 3}', "must be string"),
    ("read_file", "[1]", "must be a JSON object"),
])
def test_invalid_calls_are_the_policys_fault(tmp_path, name, args, message):
    box = ToolBox(file_tools(tmp_path))
    with pytest.raises(InvalidToolCall, match=message):
        box.call(name, args)
    assert box.n_calls == 0


def test_calculator_memory():
    box = ToolBox(calculator_tools())
    assert box.call("multiply", '{"a": 12, "b": 34, "name": "r1"}').content == "RESULT r1 = 12 * 34 = 408"
    assert box.call("recall", '{"name": "r1"}').content == "RESULT r1 = 408"
    assert box.call("recall", '{"name": "r9"}').status == "error"
    with pytest.raises(InvalidToolCall, match="must be integer"):
        box.call("multiply", '{"a": true, "b": 2, "name": "x"}')


def test_calculator_expected_answer_follows_from_the_worksheet_files(tmp_path):
    ep = make_task("calculator-chain", {"n_steps": 7, "lag": 3}).episode(11, tmp_path)
    steps = {}
    for f in sorted((tmp_path / "sheet").iterdir()):
        m = re.search(r"STEP (\d+) of 7: r(\d+) = (\S+) \* (\S+)", f.read_text())
        if m:
            steps[int(m.group(1))] = (m.group(3), m.group(4))
    assert sorted(steps) == list(range(1, 8))
    values: dict[str, int] = {}
    for k in range(1, 8):
        a, b = steps[k]
        operands = [values[x] if x.startswith("r") else int(x) for x in (a, b)]
        for x in (a, b):
            if x.startswith("r"):
                assert k - int(x[1:]) >= 3  # reused at least `lag` steps later
        values[f"r{k}"] = operands[0] * operands[1]
    assert ep.facts["expected"] == str(values["r7"])
    assert "QUESTION: Answer with the value of r7." in (tmp_path / "sheet" / "08.txt").read_text()
    assert evaluate([("12", "3"), ("r1", "2"), ("r1", "r2")]) == [36, 72, 2592]
    assert ep.score(f"The answer is {values['r7']}").quality == 1.0
    assert ep.score(str(values["r7"] + 1)).quality == 0.0


def test_needle_appears_exactly_once_in_the_named_file(tmp_path):
    ep = make_task("needle-recall", {"n_files": 6, "needle_file": 2}).episode(5, tmp_path)
    code, vault = ep.facts["expected"], ep.facts["vault"]
    hits = [p.name for p in (tmp_path / "logs").iterdir() if f"vault-{vault} is {code}" in p.read_text()]
    assert hits == ["02.log"]
    assert f"vault-{vault}?" in (tmp_path / "logs" / "05.log").read_text()
    s = ep.score(code)
    assert (s.reward, s.reward_kind, s.cause, s.quality) == (1.0, "scored", "answered", 1.0)
    assert ep.score("no idea").reward == 0.0


def test_multi_hop_facts_are_in_three_files_in_hop_order(tmp_path):
    ep = make_task("multi-hop").episode(2, tmp_path)
    f = ep.facts
    where = {}
    for p in sorted((tmp_path / "records").iterdir()):
        text = p.read_text()
        for key, needle in (("dept", f"{f['person']} works in the {f['department']} department."),
                            ("mgr", f"The {f['department']} department is managed by {f['manager']}."),
                            ("city", f"{f['manager']} is based in {f['expected']}.")):
            if needle in text:
                where[key] = p.name
    assert where["dept"] < where["mgr"] < where["city"] < "07.txt"
    assert ep.score(f["expected"]).quality == 1.0
    assert ep.score("Atlantis").quality == 0.0


def test_constraint_edit_scores_violation_copy_and_wrong_edit(tmp_path):
    task = make_task("constraint-edit")
    for case in ("violate", "good", "wrong", "nothing"):
        d = tmp_path / case
        d.mkdir()
        ep = task.episode(1, d)
        key, old, new = ep.facts["key"], ep.facts["old"], ep.facts["new"]
        assert ep.snapshot_dirs == {"workdir": d}
        assert f"TODO: set {key} to {new} in settings." in (d / "notes" / "07.txt").read_text()
        if case == "violate":
            ep.call_tool("replace_in_file", f'{{"path": "settings", "old": "{key} = {old}", "new": "{key} = {new}"}}')
        elif case in ("good", "wrong"):
            ep.call_tool("copy_file", '{"src": "settings", "dst": "settings-local"}')
            value = new if case == "good" else new + 100
            ep.call_tool("replace_in_file", f'{{"path": "settings-local", "old": "{key} = {old}", "new": "{key} = {value}"}}')
        s = ep.score("Done.")
        expected = {
            "violate": (0.0, "constraint_violation", "constraint_violated", 1),
            "good": (1.0, "scored", "answered", 0),
            "wrong": (0.0, "scored", "answered", 0),
            "nothing": (0.0, "scored", "answered", 0),
        }[case]
        assert (s.reward, s.reward_kind, s.cause, s.violations) == expected, case
