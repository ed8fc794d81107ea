"""The A/B compression harness: tasks, agents, runner, metrics, statistics and report.

Modules (imported on use; nothing heavy loads with the package):

- `tasks/`: seeded long-horizon tool tasks with real tools and scorers (`tasks.base.TASKS`, `make_task`).
- `agents/`: the agent interface (`agents.base.AgentTurn`, `Agent`, `AGENTS`, `make_agent`), scripted
  per-task agents, and model agents (`transformers`, OpenAI-compatible HTTP).
- `config`: TOML experiment configs (`load_config`); `runner`: `validate`, `run_experiment` (local processes
  or Ray, resumable); `episode`: one episode (`run_episode`); `metrics`, `stats`, `report`.

Command line: `ctxkit ablate CONFIG --out DIR`, `ctxkit report DIR`.
"""
