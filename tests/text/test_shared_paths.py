"""The library finds `../shared` beside a checkout by itself: with `CTXKIT_SHARED` unset (as for a user who
never sets it; `.ci/run` sets it, which once hid a default pointing inside the package after a move)."""

from __future__ import annotations

from conftest import REPO_ROOT
from ctxkit.text.tokenizer.tiktoken_files import CHECKOUT_PARENT, shared_dir, tiktoken_search_dirs


def test_default_shared_folder_is_beside_the_checkout(monkeypatch):
    monkeypatch.delenv("CTXKIT_SHARED", raising=False)
    monkeypatch.delenv("CTXKIT_TIKTOKEN_DIR", raising=False)
    assert CHECKOUT_PARENT == REPO_ROOT.parent
    assert shared_dir() == REPO_ROOT.parent / "shared"
    assert tiktoken_search_dirs()[0] == REPO_ROOT.parent / "shared" / "tiktoken"
