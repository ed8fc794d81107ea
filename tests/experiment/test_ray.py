"""The Ray executor (a real local Ray) gives the same results table as local processes."""

from __future__ import annotations

import pytest

from conftest import require_module
from experiment_configs import small_toml, strip_timing, write_config
from ctxkit.experiment.config import load_config
from ctxkit.experiment.runner import read_rows, run_experiment


@pytest.mark.slow
def test_ray_and_local_give_the_same_rows(tmp_path):
    require_module("ray")
    cfg = load_config(write_config(tmp_path, small_toml(seeds="[0]")))
    local = run_experiment(cfg, tmp_path / "local", progress=False, report=False)
    ray_run = run_experiment(cfg, tmp_path / "ray", executor="ray", workers=2, progress=False)
    assert local.total == ray_run.total == ray_run.ran == 4
    assert strip_timing(read_rows(tmp_path / "ray")) == strip_timing(read_rows(tmp_path / "local"))
    assert (tmp_path / "ray" / "report.md").exists()
