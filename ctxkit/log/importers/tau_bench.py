"""tau-bench result files: a list of `{task_id, trial, reward, info, traj}`, one episode each, `traj` an
OpenAI chat list; the reward (0/1) becomes a `scored` `EpisodeEnd`.

The files hold no tool schemas: pass the environment's tools (`tau-bench__airline_tools.json`) as `tools`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ctxkit.log.importers.common import ImportedEpisode, Importer, SourceInfo, ending, episode_events, require

_KEYS = ("task_id", "reward", "traj")


def matches(obj: Any) -> bool:
    """A non-empty list whose first item has `task_id`, `reward` and a `traj` list."""
    return isinstance(obj, list) and bool(obj) and isinstance(obj[0], Mapping) \
        and all(k in obj[0] for k in _KEYS) and isinstance(obj[0]["traj"], list)


def entry_id(item: Mapping[str, Any], index: int) -> str:
    """`task-<task_id>-trial-<trial>` (trial omitted when absent)."""
    trial = item.get("trial")
    return f"task-{item['task_id']}" + (f"-trial-{trial}" if trial is not None else "")


def entry_problem(item: Any) -> str | None:
    """What keeps `item` from being a tau-bench result, or None."""
    if not isinstance(item, Mapping):
        return f"a tau-bench result is an object, not {type(item).__name__}"
    missing = [k for k in _KEYS if k not in item]
    if missing:
        return f"field(s) {missing} missing (a tau-bench result needs {list(_KEYS)})"
    return None if isinstance(item["traj"], list) else "field 'traj' is not a list"


def read_entry(item: Mapping[str, Any], source: SourceInfo, tools: Sequence[Any] | None = None,
               document: Any = None) -> ImportedEpisode:
    """One result as an episode (the reward a `scored` end)."""
    reward = item["reward"]
    require(reward is None or (isinstance(reward, (int, float)) and not isinstance(reward, bool)),
            f"field 'reward': {reward!r} is not a number", source)
    info = item.get("info") if isinstance(item.get("info"), Mapping) else {}
    task = {"name": f"tau-bench/{info.get('source') or 'task'}", "task_id": item["task_id"], "trial": item.get("trial")}
    metadata = {k: v for k, v in item.items() if k not in ("traj", "reward")}
    scores = {"reward_info": info["reward_info"]} if "reward_info" in info else {}
    return episode_events(item["traj"], source=source, tools=tools or (), task=task, metadata=metadata,
                          end=ending(reward=reward, scores=scores))


IMPORTER = Importer(name="tau-bench", description="tau-bench results: a list of {task_id, trial, reward, info, traj}",
                    matches=matches, entries=lambda doc: doc, entry_problem=entry_problem,
                    entry_id=lambda item, index: entry_id(item, index) if isinstance(item, Mapping) and "task_id" in item else "",
                    read_entry=read_entry)
"""The `tau-bench` entry of `IMPORTERS`."""
