"""Shared fixtures. Everything that needs `../shared` or an installed model finds it here.

`CTXKIT_SHARED` points at the shared folder (default: `../shared` beside the repository root). Where a
fixture is missing the test skips with the reason, except when `CTXKIT_REQUIRE_FIXTURES=1` (set by
`.ci/run`), where a missing fixture is a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("CTXKIT_SHARED", REPO_ROOT.parent / "shared")).resolve()
REQUIRE = os.environ.get("CTXKIT_REQUIRE_FIXTURES") == "1"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

READ_TOOLS = ({"type": "function", "function": {"name": "read", "description": "Read a file.",
                                                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},)
"""The one-tool schema (`read(path)`) most builder, compressor and log tests offer."""

HF_TOKENIZERS = ("qwen2.5-instruct", "qwen3", "mistral-7b-instruct-v0.3", "smollm2-135m-instruct")


def missing_fixture(reason: str) -> None:
    """Skip (locally) or fail (CI, `CTXKIT_REQUIRE_FIXTURES=1`) for a fixture that is not there."""
    if REQUIRE:
        pytest.fail(f"required fixture missing: {reason}", pytrace=False)
    pytest.skip(f"fixture missing: {reason}")


def shared_path(*parts: str) -> Path:
    """A path inside the shared folder, or skip/fail when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        missing_fixture(f"{path} (set CTXKIT_SHARED to the shared folder)")
    return path


def tokenizer_dir(name: str) -> Path:
    """The folder of one of the shared HF tokenizers."""
    return shared_path("tokenizers", name)


def require_module(name: str):
    """Import an optional dependency, or skip/fail when it is not installed."""
    try:
        return __import__(name)
    except ImportError:
        missing_fixture(f"python package {name!r} is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The shared folder."""
    if not SHARED.exists():
        missing_fixture(f"{SHARED} (set CTXKIT_SHARED)")
    return SHARED


@pytest.fixture(scope="session")
def hf_tokenizer_paths() -> dict[str, Path]:
    """name -> folder for every shared HF tokenizer."""
    return {name: tokenizer_dir(name) for name in HF_TOKENIZERS}


@pytest.fixture(scope="session")
def tiktoken_dir() -> Path:
    """The folder holding cl100k_base.tiktoken and o200k_base.tiktoken."""
    return shared_path("tiktoken")


@pytest.fixture(scope="session")
def tok():
    """The Qwen2.5 tokenizer (a loaded `Tokenizer`), the default of the tests; a folder's conftest may override it."""
    from ctxkit.text.tokenizer.loader import load_tokenizer  # lazy: loads only for tests that ask

    return load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))


@pytest.fixture(scope="session")
def smollm_tok():
    """The SmolLM2-135M-Instruct tokenizer, the tokenizer of the real causal LM the tests run."""
    from ctxkit.text.tokenizer.loader import load_tokenizer  # lazy: loads only for tests that ask

    return load_tokenizer(str(tokenizer_dir("smollm2-135m-instruct")))
