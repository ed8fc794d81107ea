"""The real trajectories of `../shared/trajectories` the tests run on: which files, how many episodes each,
the files in formats no importer reads yet (known, listed, not imported), and the episodes read once."""

from __future__ import annotations

from functools import lru_cache

from conftest import shared_path
from ctxkit.benchmarks.trajectories_bench import NOT_YET_IMPORTED  # noqa: F401  (known, not yet imported)
from ctxkit.errors import BudgetError
from ctxkit.events import Step
from ctxkit.log.importers import read_episodes, read_tools
from ctxkit.training.episode_samples import compressed_samples

FILES = {
    "tau-bench__gpt-4o-airline.json": "tau-bench__airline_tools.json",
    "sweagent__marshmallow-1867__function_calling_replace_from_source.traj": None,
    "sweagent__pydicom-1458.traj": None,
    "adp__swe-gym_openhands_sampled_trajectories__sample_raw.json": None,
    "adp__swe-smith__sample_raw.json": None,
    "minisweagent__deepseek-chat__pydicom-901.traj.json": None,
    "openhands__multi_swe_bench_output.jsonl": None,
    "tau2__telecom_gpt-4o_20sims.json": None,
    "adp__toucan_1_5m__sample_raw.json": None,
    "adp__codeactinstruct__sample_sft.json": None,
}
EPISODES = {"tau-bench__gpt-4o-airline.json": 200, "sweagent__marshmallow-1867__function_calling_replace_from_source.traj": 1,
            "sweagent__pydicom-1458.traj": 1, "adp__swe-gym_openhands_sampled_trajectories__sample_raw.json": 5,
            "adp__swe-smith__sample_raw.json": 5, "minisweagent__deepseek-chat__pydicom-901.traj.json": 1,
            "openhands__multi_swe_bench_output.jsonl": 3, "tau2__telecom_gpt-4o_20sims.json": 20,
            "adp__toucan_1_5m__sample_raw.json": 1, "adp__codeactinstruct__sample_sft.json": 5}
STEP = 256


@lru_cache(maxsize=None)
def episodes(name: str):
    tools = FILES[name]
    return tuple(read_episodes(shared_path("trajectories", name), format="auto",
                               tools=read_tools(shared_path("trajectories", tools)) if tools else None))


def spread(name: str) -> list[int]:
    """Indexes of the episodes the compressor matrix runs on: all of a small file, every 20th of tau-bench."""
    n = EPISODES[name]
    return list(range(0, n, 20)) if n > 20 else list(range(n))


def window_budget(events) -> tuple[int, int]:
    """(full length, the smallest budget >= 50 % of it, in 256-token steps (a sixteenth of a shorter
    episode's length, so a short one is still compacted), at which `window` fits every step)."""
    steps = [e for e in events if isinstance(e, Step)]
    full = max(s.context_length + len(s.token_ids) for s in steps)
    budget, step = full // 2, min(STEP, max(16, full // 16))
    while True:
        try:
            compressed_samples(events, compressor="window", budget=budget)
            return full, budget
        except BudgetError:
            budget += step
            assert budget <= full, "window cannot fit an episode at its own full length"
