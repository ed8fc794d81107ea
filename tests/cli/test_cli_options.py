"""The CLI declares each shared option once: `--tokenizer`/`--template` come from `ctxkit.cli.commands.argtypes`,
with one help text per meaning (render with / replay instead of the recorded one)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO_ROOT
from ctxkit.cli.parser import build_parser

COMMANDS = REPO_ROOT / "ctxkit" / "cli" / "commands"


def test_tokenizer_and_template_are_declared_in_argtypes_only():
    declared = []
    for path in sorted(COMMANDS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value in ("--tokenizer", "--template")):
                declared.append(f"{path.name}:{node.args[0].value}")
    # argtypes.add_render_options names both; add_recorded_overrides builds its names; `bench build` takes a
    # tokenizer and no template
    assert declared == ["argtypes.py:--tokenizer", "argtypes.py:--template", "bench_cmd.py:--tokenizer"]


def _options(parser, path=()):
    """(subcommand path, option, help) for every --tokenizer/--template of the parser tree."""
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, path + (name,))
        elif set(action.option_strings) & {"--tokenizer", "--template"}:
            yield " ".join(path), action.option_strings[0], action.help


def test_every_command_with_a_tokenizer_option_says_the_same_thing():
    found = list(_options(build_parser()))
    helps = {(opt, h) for _, opt, h in found}
    recorded = {h for _, opt, h in found if "recorded" in h}
    assert recorded == {"tokenizer to replay with instead of the recorded one (its id must match)",
                        "template to replay with instead of the recorded one (its id must match)"}
    templates = {h for opt, h in helps if opt == "--template" and "recorded" not in h}
    assert templates == {"chat template: name-vN or a .jinja path (default: the tokenizer's own)"}
    assert [cmd for cmd, opt, _ in found if opt == "--template"] == [
        "render", "inspect", "template check", "import", "bench render", "build", "replay", "samples", "view",
        "serve"]
    assert [cmd for cmd, opt, _ in found if opt == "--tokenizer"] == [
        "render", "inspect", "template check", "import", "bench render", "bench build", "build", "replay", "samples",
        "view", "serve"]
