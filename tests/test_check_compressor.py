"""`check_compressor` over every registered compressor (one API check for the whole registry), and a
compressor that breaks an invariant is caught."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import tokenizer_dir
from ctxkit.compress import COMPRESSORS
from ctxkit.compress.base import BaseCompressor, CompressionRequest
from ctxkit.compress.check import check_compressor
from ctxkit.errors import InvariantError


def first_sentences(messages: list[dict]) -> str:
    """A deterministic summarizer: the first sentence of each message."""
    return " ".join((m.get("content") or "").split(".")[0][:80] for m in messages if m.get("content"))


def params_for(name: str) -> dict[str, Any]:
    if name == "summarize":
        from ctxkit.summarizers import CallableSummarizer

        return {"summarizer": CallableSummarizer(first_sentences, id="first-sentences")}
    return {}


FAST = [n for n in COMPRESSORS if n not in ("retrieve",)]


@pytest.mark.parametrize("name", FAST)
def test_check_compressor_over_the_registry(name):
    tok = str(tokenizer_dir("qwen2.5-instruct"))
    report = check_compressor(name, tokenizer=tok, budgets=(1024, 2048), max_examples=3, params=params_for(name),
                              expect_fit=name != "keep-all")
    assert report.examples == 4 and report.builds > 0  # 3 generated + the largest plan
    if name == "keep-all":
        assert report.budget_errors > 0 and report.compactions == 0
    else:
        assert report.compactions > 0 and report.budget_errors == 0
        assert max(report.max_tokens.values()) <= 2048 and report.max_tokens[1024] <= 1024


@pytest.mark.slow
def test_check_compressor_retrieve_with_real_minilm_and_faiss():
    tok = str(tokenizer_dir("qwen2.5-instruct"))
    report = check_compressor("retrieve", tokenizer=tok, budgets=(2048,), max_examples=1)
    assert report.builds > 0 and report.compactions > 0 and report.budget_errors == 0


class DropsOneResult(BaseCompressor):
    """A broken strategy: drops the oldest tool result but keeps its call (an orphaned call)."""

    NAME = "drops-one-result"
    VERSION = 1
    DEFAULTS: dict[str, Any] = {}

    def propose(self, request: CompressionRequest, n_tokens: int):
        tools = [m for m in request.view.messages if m.role == "tool"]
        return ([{"op": "drop", "event_ids": list(tools[0].provenance.event_ids)}], {}) if tools else None


def test_check_compressor_catches_an_orphaning_strategy():
    tok = str(tokenizer_dir("qwen2.5-instruct"))
    with pytest.raises(InvariantError, match="has no result"):
        check_compressor(DropsOneResult(), tokenizer=tok, budgets=(1024,), max_examples=1)
