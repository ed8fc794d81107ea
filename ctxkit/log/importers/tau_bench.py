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


def read(obj: Any, path: str, tools: Sequence[Any] | None = None) -> list[ImportedEpisode]:
    """One `ImportedEpisode` per result, in file order."""
    require(isinstance(obj, list), "a tau-bench file is a list of results", path=path)
    out, seen = [], set()
    for index, item in enumerate(obj):
        require(isinstance(item, Mapping) and all(k in item for k in _KEYS),
                f"entry #{index}: a tau-bench result needs {list(_KEYS)}", path=path)
        source = SourceInfo(path=path, format="tau-bench", entry_id=entry_id(item, index), index=index)
        require(source.entry_id not in seen, f"entry id {source.entry_id!r} repeats", source)
        seen.add(source.entry_id)
        reward = item["reward"]
        require(reward is None or (isinstance(reward, (int, float)) and not isinstance(reward, bool)),
                f"reward {reward!r} is not a number", source)
        info = item.get("info") if isinstance(item.get("info"), Mapping) else {}
        task = {"name": f"tau-bench/{info.get('source') or 'task'}", "task_id": item["task_id"], "trial": item.get("trial")}
        metadata = {k: v for k, v in item.items() if k not in ("traj", "reward")}
        scores = {"reward_info": info["reward_info"]} if "reward_info" in info else {}
        out.append(episode_events(item["traj"], source=source, tools=tools or (), task=task, metadata=metadata,
                                  end=ending(reward=reward, scores=scores)))
    return out


IMPORTER = Importer(name="tau-bench", description="tau-bench results: a list of {task_id, trial, reward, info, traj}",
                    matches=matches, read=read)
"""The `tau-bench` entry of `IMPORTERS`."""
