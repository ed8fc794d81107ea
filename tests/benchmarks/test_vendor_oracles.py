"""`python -m ctxkit.benchmarks.vendor_oracles`: the table of vendor renderers against the HF templates."""

from __future__ import annotations

from conftest import require_module, tokenizer_dir


def test_table_rows(capsys):
    require_module("mistral_common")
    require_module("sentencepiece")
    require_module("openai_harmony")
    require_module("trl")
    tokenizer_dir("mistral-7b-instruct-v0.3")
    from ctxkit.benchmarks.vendor_oracles import main

    assert main(["mistral-v3", "mistral-v7"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| mistral")]
    assert [r.split(" | ")[2:8] for r in rows] == [
        ["10", "8/10", "2/10", "6/10", "vendor refuses 2", "user text 4, tool result 2"],
        ["10", "10/10", "-", "-", "-", "-"],
    ]
