"""The public face: lazy, fast, and the documented names resolve to what the README says."""

from __future__ import annotations

import subprocess
import sys

import ctxkit


def test_every_public_name_resolves():
    for name in ctxkit.__all__:
        assert getattr(ctxkit, name) is not None, name


def test_samples_and_replay_stay_callable_after_submodule_import():
    # Importing the submodules binds the package attributes to the modules; they must still call through.
    import ctxkit.replay as replay_module
    from ctxkit.training_samples import TrainingSample  # noqa: F401

    assert callable(ctxkit.samples) and callable(ctxkit.replay)
    assert replay_module.verify_log is not None


def test_import_ctxkit_loads_no_heavy_dependency():
    code = (
        "import sys, ctxkit, ctxkit.cli; "
        "heavy = [m for m in ('torch', 'transformers', 'faiss', 'sentence_transformers', 'pyarrow', 'ray', 'matplotlib') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
