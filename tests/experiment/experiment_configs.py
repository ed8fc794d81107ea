"""Small experiment configs for the harness tests (written as real TOML files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import tokenizer_dir


def small_toml(*, seeds: str = "[0, 1]", extra_arms: str = "", limits: str = "", tasks: str | None = None,
               arms: str | None = None, top: str = "") -> str:
    """A two-arm, two-task grid that runs in about a second per episode on one core."""
    tok = tokenizer_dir("qwen2.5-instruct")
    if tasks is None:
        tasks = """
[tasks.constraint-edit]
n_files = 4
lines_per_file = 8
[tasks.needle-recall]
n_files = 4
lines_per_file = 8
"""
    if arms is None:
        arms = """
[[arms]]
name = "window"
compressor = "window"
params = { keep_first = 1 }
pins = false

[[arms]]
name = "window+pins"
compressor = "window"
params = { keep_first = 1 }
"""
    return f"""
name = "small"
tokenizer = "{tok}"
seeds = {seeds}
budget = 900
baseline = "window+pins"
{top}
[limits]
max_steps = 20
max_context = 900
wall_time_s = 120.0
{limits}
[agents.scripted]
{tasks}
{arms}
{extra_arms}
[report]
bootstrap_resamples = 200
"""


def write_config(tmp_path: Path, text: str, name: str = "exp.toml") -> Path:
    """Write `text` to `tmp_path/name`."""
    path = tmp_path / name
    path.write_text(text)
    return path


def strip_timing(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows sorted by episode id, without their wall-clock fields."""
    return sorted(({k: v for k, v in r.items() if k != "timing"} for r in rows), key=lambda r: r["episode_id"])


def tiny_toml(*, seeds: str = "[0]", n_files: int = 3, max_steps: int = 12) -> str:
    """One task (a short needle-recall chain), one arm, few steps: about a second per episode."""
    return small_toml(
        seeds=seeds,
        tasks=f"""
[tasks.needle-recall]
n_files = {n_files}
lines_per_file = 4
""",
        arms="""
[[arms]]
name = "window+pins"
compressor = "window"
params = { keep_first = 1 }
""",
    ).replace("max_steps = 20", f"max_steps = {max_steps}")
