"""Configs: every mistake is a ConfigError naming the file and the problem, before any episode runs."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from conftest import tokenizer_dir
from experiment_configs import small_toml, write_config
from ctxkit.cli.parser import main
from ctxkit.errors import ConfigError
from ctxkit.experiment.config import load_config, parse_config, resolve_tokenizer
from ctxkit.experiment.runner import run_experiment, validate


def test_small_config_parses_into_the_paired_grid(tmp_path):
    cfg = load_config(write_config(tmp_path, small_toml()))
    assert [a.name for a in cfg.arms] == ["window", "window+pins"]
    assert [a.pins for a in cfg.arms] == [False, True]
    assert cfg.baseline == "window+pins" and cfg.seeds == (0, 1)
    assert cfg.limits.max_steps == 20 and cfg.limits.max_context == 900
    grid = [s.key for s in cfg.episodes()]
    assert len(grid) == len(set(grid)) == 2 * 2 * 2
    assert grid[0] == "window/constraint-edit-0"
    validate(cfg)


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.replace("[tasks.needle-recall]", "[tasks.needle-recal]"), r"unknown task 'needle-recal'"),
    (lambda t: t.replace("n_files = 4\nlines_per_file = 8\n[tasks.needle", "n_file = 4\nlines_per_file = 8\n[tasks.needle"),
     r"task 'constraint-edit' has no parameter\(s\) \['n_file'\]"),
    (lambda t: t.replace("[agents.scripted]", "[agents.scripted]\nkind = \"scrypted\""), r"unknown agent 'scrypted'"),
    (lambda t: t.replace("[agents.scripted]", "[agents.scripted]\ntemperature = 0.5"), r"\[agents.scripted\].*takes no parameters"),
    (lambda t: t.replace('compressor = "window"\nparams = { keep_first = 1 }\npins = false', 'compressor = "windoww"'),
     r"arm 'window'.*unknown compressor 'windoww'"),
    (lambda t: t.replace("params = { keep_first = 1 }\npins = false", "params = { keep_frist = 1 }\npins = false"),
     r"arm 'window'.*unknown parameter\(s\) \['keep_frist'\]"),
    (lambda t: t.replace("budget = 900", "budget = 200"), r"budget 200 is too small for the opening context"),
    (lambda t: t.replace("max_context = 900", "max_context = 150"), r"opening context is \d+ tokens, over \[limits\] max_context = 150"),
    (lambda t: t.replace('baseline = "window+pins"', 'baseline = "nope"'), r"baseline 'nope' is not an arm"),
    (lambda t: t.replace("seeds = [0, 1]", "seeds = [0, 0]"), r"repeat a value"),
    (lambda t: t.replace("seeds = [0, 1]", "seeds = -2"), r"seeds is -2"),
    (lambda t: t.replace('name = "small"', 'name = "small"\nbudgett = 3'), r"unknown key\(s\) \['budgett'\]"),
    (lambda t: t.replace("max_steps = 20", "max_step = 20"), r"\[limits\] has unknown key\(s\) \['max_step'\]"),
    (lambda t: t.replace("max_steps = 20", "max_steps = 0"), r"max_steps is 0"),
    (lambda t: t.replace('name = "window+pins"', 'name = "window"'), r"arm name\(s\) \['window'\] are used more than once"),
    (lambda t: t.replace("pins = false", 'pins = "no"'), r"pins is 'no'"),
    (lambda t: t.replace("[report]", "[report]\nconfidence = 2.0"), r"confidence is 2.0"),
    (lambda t: t.replace("tokenizer = ", "tokenizer = \"/nonexistent/tok\"\n#"), r"tokenizer '/nonexistent/tok' cannot be loaded"),
    (lambda t: t + "\n[[arms]]\nname = \"x\"\ncompressor = \"window\"\nagent = \"llm\"\n", r"agent 'llm' is not configured"),
    (lambda t: t.replace("[report]", "[[arms]]\nname = \"a/b\"\ncompressor = \"window\"\n[report]"), r"name is 'a/b'"),
    (lambda t: t.replace('name = "small"', 'name = "small"\nhistory = "kept"'),
     r"history is 'kept'; expected one of \['sampled', 'template'\]"),
    (lambda t: t.replace('name = "small"', 'name = "small"\ntemplate_kwargs = "preserve_thinking"'),
     r"template_kwargs is 'preserve_thinking'; expected a table"),
    (lambda t: t.replace('name = "small"', 'name = "small"\ntemplate_kwargs = { messages = 1 }'),
     r"arm 'window'.*would shadow a variable"),
])
def test_bad_configs_fail_before_any_episode_runs(tmp_path, edit, message):
    path = write_config(tmp_path, edit(small_toml()))
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=message) as info:
        run_experiment(load_config(path), out, progress=False)
    assert str(path) in str(info.value)
    assert not (out / "episodes").exists() and not (out / "results.jsonl").exists()


def test_cli_reports_config_errors_with_exit_code_2(tmp_path, capsys):
    path = write_config(tmp_path, small_toml().replace("budget = 900", "budget = 200"))
    assert main(["ablate", str(path), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "ctxkit: error:" in err and "too small for the opening context" in err and str(path) in err
    assert main(["ablate", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "r")]) == 2
    assert "config file not found" in capsys.readouterr().err
    bad = write_config(tmp_path, "name = [", "bad.toml")
    assert main(["ablate", str(bad), "--out", str(tmp_path / "r")]) == 2
    assert "not valid TOML" in capsys.readouterr().err
    good = write_config(tmp_path, small_toml(), "good.toml")
    assert main(["ablate", str(good), "--out", str(tmp_path / "r"), "--validate-only"]) == 0
    assert "8 episodes: 2 arms x 2 tasks x 2 seeds" in capsys.readouterr().out
    assert not (tmp_path / "r").exists()


def test_tokenizer_paths_resolve_against_shared_or_the_repository(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "experiments").mkdir(parents=True)
    (tmp_path / "shared" / "tokenizers" / "t").mkdir(parents=True)
    cfg_dir = repo / "experiments"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CTXKIT_SHARED", raising=False)
    # relative to the repository root (the config folder's parent)
    assert resolve_tokenizer("../shared/tokenizers/t", cfg_dir) == str((tmp_path / "shared" / "tokenizers" / "t").resolve())
    monkeypatch.setenv("CTXKIT_SHARED", "/elsewhere/shared")
    assert resolve_tokenizer("../shared/tokenizers/t", cfg_dir) == os.path.join("/elsewhere/shared", "tokenizers", "t")
    assert resolve_tokenizer("tiktoken:cl100k_base", cfg_dir) == "tiktoken:cl100k_base"
    assert resolve_tokenizer("HuggingFaceTB/SmolLM2-135M-Instruct", cfg_dir) == "HuggingFaceTB/SmolLM2-135M-Instruct"


REPO = Path(__file__).resolve().parents[2]


def test_quickstart_config_shape():
    cfg = load_config(REPO / "experiments" / "quickstart.toml")
    assert len(cfg.arms) >= 5 and len(cfg.tasks) == 4 and [a.kind for a in cfg.agents] == ["scripted"]
    assert {a.compressor for a in cfg.arms} >= {"keep-all", "window", "mask-observations", "summarize", "retrieve"}
    assert any(not a.pins for a in cfg.arms) and any(a.pins and a.compressor == "window" for a in cfg.arms)


@pytest.mark.parametrize("name", ["quickstart.toml", "lm_cpu.toml", "gpu.toml"])
def test_shipped_configs_validate(name):
    tokenizer_dir("qwen2.5-instruct"), tokenizer_dir("smollm2-135m-instruct")
    cfg = load_config(REPO / "experiments" / name)
    validate(cfg)
    if name != "quickstart.toml":
        assert cfg.agents[0].kind == "transformers" and cfg.template == "chatml-tools-v1"
        assert cfg.agents[0].params["device"] == ("cuda" if name == "gpu.toml" else "cpu")


def test_the_sft_evaluation_holds_out_the_training_seeds_on_the_training_tasks():
    tokenizer_dir("smollm2-135m-instruct")
    ev = load_config(REPO / "experiments" / "sft_eval.toml")
    train = load_config(REPO / "experiments" / "sft_collect.toml")
    validate(ev)
    assert not set(ev.seeds) & set(train.seeds) and len(ev.seeds) >= 8
    assert {t.name: t.params for t in ev.tasks} == {t.name: t.params for t in train.tasks}
    assert (ev.tokenizer, ev.template) == (train.tokenizer, train.template)
    agents = {a.label: a.params for a in ev.agents}
    assert agents["sft"]["model_path"] == "runs/sft/checkpoint" and "model_path" not in agents["base"]
    assert {k: v for k, v in agents["sft"].items() if k != "model_path"} == agents["base"]  # one sampling config
    assert [(a.name, a.agent) for a in ev.arms] == [("base", "base"), ("sft", "sft"), ("sft+mask", "sft")]


@pytest.mark.parametrize("name", ["lm_ablation.toml", "lm_ablation_at_budget.toml", "lm_ablation_at_budget_48.toml",
                                  "gpu.toml"])
def test_the_trained_policy_ablation_is_the_evaluated_policy_under_every_compression(name):
    tokenizer_dir("smollm2-135m-instruct")
    grid = load_config(REPO / "experiments" / name)
    ev = load_config(REPO / "experiments" / "sft_eval.toml")
    trained_at_budget = name.startswith("lm_ablation_at_budget")
    train = load_config(REPO / "experiments" / ("sft_collect_at_budget.toml" if trained_at_budget else "sft_collect.toml"))
    validate(grid)
    assert not set(grid.seeds) & set(train.seeds) and len(grid.seeds) >= (16 if name == "gpu.toml" else 4)
    evaluated = {t.name: t.params for t in ev.tasks}
    assert all(evaluated[t.name] == t.params for t in grid.tasks)  # the sizes the policy was evaluated at
    assert len(grid.tasks) == (4 if name == "gpu.toml" else 2)
    (policy,) = grid.agents
    device = "cuda" if name == "gpu.toml" else "cpu"
    expected = {**ev.agent("sft").params, "device": device}
    if trained_at_budget:
        expected["model_path"] = f"runs/sft_{name.removeprefix('lm_ablation_').removesuffix('.toml')}/checkpoint"
    if device == "cuda":
        expected.pop("num_threads")
    assert policy.params == expected
    assert [(a.name, a.compressor, a.pins, a.budget) for a in grid.arms] == [
        ("keep-all", "keep-all", True, 3072), ("window", "window", False, 1024), ("window+pins", "window", True, 1024),
        ("mask-then-window-v2", "mask-then-window-v2", True, 1024),
        ("truncate-then-window-v2", "truncate-then-window-v2", True, 1024),
        ("summarize-then-window", "summarize-then-window", True, 1024), ("retrieve", "retrieve", True, 1024)]
    assert grid.baseline == "keep-all" and grid.limits == ev.limits


def test_the_whole_grid_and_its_reference_are_the_48_step_ablation_on_four_held_out_tasks():
    """lm_ablation_grid_48.toml: the 48-step ablation's arms, policy and limits on >= 8 held-out seeds x the four
    tasks at their evaluated sizes; lm_ablation_grid_48_reference.toml: the same grid with keep-all at a budget
    it never runs out of, against the grid's window arms unchanged (so their episodes can be compared)."""
    tokenizer_dir("smollm2-135m-instruct")
    pilot = load_config(REPO / "experiments" / "lm_ablation_at_budget_48.toml")
    grid = load_config(REPO / "experiments" / "lm_ablation_grid_48.toml")
    ref = load_config(REPO / "experiments" / "lm_ablation_grid_48_reference.toml")
    train = load_config(REPO / "experiments" / "sft_collect_at_budget.toml")
    evaluated = {t.name: t.params for t in load_config(REPO / "experiments" / "sft_eval.toml").tasks}
    validate(grid), validate(ref)
    assert (grid.arms, grid.agents, grid.limits, grid.template) == (pilot.arms, pilot.agents, pilot.limits, pilot.template)
    assert len(grid.seeds) >= 8 and not set(grid.seeds) & set(train.seeds)
    assert {t.name: t.params for t in grid.tasks} == evaluated and len(evaluated) == 4
    assert (ref.seeds, ref.tasks, ref.agents, ref.template) == (grid.seeds, grid.tasks, grid.agents, grid.template)
    assert ref.arms == (dataclasses.replace(grid.arms[0], budget=6144), *grid.arms[1:4])
    assert ref.limits == dataclasses.replace(grid.limits, max_context=6144, wall_time_s=900.0)


def test_the_grpo_evaluation_is_the_grid_window_arm_for_the_sft_and_the_grpo_policy_on_held_out_seeds():
    """grpo_eval_48.toml: the whole grid's `window` arm (same agent, seeds, tasks, limits) as `sft`, and the
    same arm for the policy `grpo_at_budget_48_window.toml` trains, sampled alike, on seeds neither trained on."""
    from ctxkit.integrations.grpo_config import load_grpo_config

    tokenizer_dir("smollm2-135m-instruct")
    grid = load_config(REPO / "experiments" / "lm_ablation_grid_48.toml")
    ev = load_config(REPO / "experiments" / "grpo_eval_48.toml")
    grpo = load_grpo_config(REPO / "experiments" / "grpo_at_budget_48_window.toml")
    validate(ev)
    assert (ev.seeds, ev.tasks, ev.limits, ev.template, ev.baseline) == (grid.seeds, grid.tasks, grid.limits,
                                                                         grid.template, "sft")
    window = next(a for a in grid.arms if a.name == "window")
    assert ev.arms == (dataclasses.replace(window, name="sft"), dataclasses.replace(window, name="grpo", agent="grpo"))
    assert ev.agent("sft") == grid.agent("sft")
    (run,) = grpo.runs
    expected = {**ev.agent("sft").params, "model_path": f"runs/grpo_at_budget_48_window/{run.name}/checkpoint"}
    assert ev.agent("grpo").params == expected
    assert (run.spec.compressor, run.spec.pins, run.spec.budget) == (window.compressor, window.pins, window.budget)
    assert not set(ev.seeds) & (set(run.spec.seeds) | set(range(100, 106)))


def test_the_expert_data_at_budget_is_the_collection_under_the_ablation_compressors():
    """sft_collect_at_budget.toml: the tasks and seeds of sft_collect.toml, keep-all at the ablation's uncut
    budget, and the ablation's pinned compressors (same params) at its compressed budget."""
    tokenizer_dir("smollm2-135m-instruct")
    at_budget = load_config(REPO / "experiments" / "sft_collect_at_budget.toml")
    first = load_config(REPO / "experiments" / "sft_collect.toml")
    grid = load_config(REPO / "experiments" / "lm_ablation_at_budget.toml")
    validate(at_budget)
    assert (at_budget.seeds, at_budget.tasks, at_budget.tokenizer) == (first.seeds, first.tasks, first.tokenizer)
    arms = {a.name: (a.compressor, a.params, a.budget) for a in grid.arms}
    assert [(a.name, a.compressor, a.params, a.budget) for a in at_budget.arms] == [
        (name, *arms[name]) for name in ("keep-all", "window+pins", "mask-then-window-v2", "truncate-then-window-v2",
                                         "summarize-then-window", "retrieve")]
    from ctxkit.integrations.sft_config import load_sft_config

    sft = load_sft_config(REPO / "experiments" / "sft_at_budget.toml")
    assert sft.collect == (at_budget,) and sft.train == load_sft_config(REPO / "experiments" / "sft.toml").train
    longer = load_sft_config(REPO / "experiments" / "sft_at_budget_48.toml")
    assert longer.collect == (at_budget,) and longer.train == dataclasses.replace(sft.train, max_steps=48)
    assert load_config(REPO / "experiments" / "lm_ablation_at_budget_48.toml").arms == grid.arms


def test_the_long_context_data_adds_uncompressed_episodes_on_more_training_seeds():
    """sft_long.toml: sft_at_budget_48's collection and training, with a keep-all-only collection (the same tasks,
    limits and keep-all arm, on seeds of its own) pooled in, and a max_length every expert sample fits."""
    from ctxkit.integrations.sft_config import load_sft_config

    tokenizer_dir("smollm2-135m-instruct")
    at_budget = load_config(REPO / "experiments" / "sft_collect_at_budget.toml")
    keep_all = load_config(REPO / "experiments" / "sft_collect_keep_all.toml")
    validate(keep_all)
    assert (keep_all.tasks, keep_all.limits, keep_all.tokenizer, keep_all.template) == (
        at_budget.tasks, at_budget.limits, at_budget.tokenizer, at_budget.template)
    assert keep_all.arms == tuple(a for a in at_budget.arms if a.name == "keep-all")
    assert keep_all.seeds == tuple(range(106, 118)) and not set(keep_all.seeds) & set(at_budget.seeds)
    long = load_sft_config(REPO / "experiments" / "sft_long.toml")
    at_48 = load_sft_config(REPO / "experiments" / "sft_at_budget_48.toml")
    assert long.collect == (at_budget, keep_all) and long.eval_seeds == at_48.eval_seeds
    assert long.train == dataclasses.replace(at_48.train, max_length=2048)
    ev = load_config(REPO / "experiments" / "lm_ablation_long.toml")
    ref = load_config(REPO / "experiments" / "lm_ablation_grid_48_reference.toml")
    validate(ev)
    assert (ev.seeds, ev.tasks, ev.limits, ev.arms, ev.template) == (ref.seeds, ref.tasks, ref.limits, ref.arms,
                                                                     ref.template)
    (agent,) = ev.agents
    assert agent.params == {**ref.agent("sft").params, "model_path": "runs/sft_long/checkpoint"}
    assert ev.seeds == long.eval_seeds and not set(ev.seeds) & {s for c in long.collect for s in c.seeds}


def test_the_rest_of_the_grid_with_the_long_policy_pairs_each_arm_with_its_own_reference():
    """lm_ablation_long_grid.toml: lm_ablation_long's seeds, tasks, limits, policy and keep-all reference, with the
    whole grid's three arms lm_ablation_long leaves out (same compressors and params), so the two runs hold all
    seven arms."""
    tokenizer_dir("smollm2-135m-instruct")
    long = load_config(REPO / "experiments" / "lm_ablation_long.toml")
    rest = load_config(REPO / "experiments" / "lm_ablation_long_grid.toml")
    grid = load_config(REPO / "experiments" / "lm_ablation_grid_48.toml")
    validate(rest)
    assert (rest.seeds, rest.tasks, rest.limits, rest.agents, rest.template, rest.baseline) == (
        long.seeds, long.tasks, long.limits, long.agents, long.template, long.baseline)
    assert rest.arms == (long.arms[0], *grid.arms[4:])
    assert [a.name for a in rest.arms[1:]] == ["truncate-then-window-v2", "summarize-then-window", "retrieve"]
    assert {a.name for a in long.arms} | {a.name for a in rest.arms} == {a.name for a in grid.arms}


def test_retrieve_v2_with_the_long_policy_is_the_grids_retrieve_arm_at_version_2():
    """lm_ablation_long_retrieve.toml: lm_ablation_long_grid's run with its retrieve arm at version 2 (same params)."""
    tokenizer_dir("smollm2-135m-instruct")
    rest = load_config(REPO / "experiments" / "lm_ablation_long_grid.toml")
    v2 = load_config(REPO / "experiments" / "lm_ablation_long_retrieve.toml")
    validate(v2)
    assert (v2.seeds, v2.tasks, v2.limits, v2.agents, v2.template, v2.baseline) == (
        rest.seeds, rest.tasks, rest.limits, rest.agents, rest.template, rest.baseline)
    keep_all, retrieve = rest.arms[0], rest.arms[-1]
    assert v2.arms == (keep_all, dataclasses.replace(retrieve, name="retrieve-v2", compressor="retrieve-v2"))


def test_parse_config_defaults():
    cfg = parse_config({"tokenizer": "tiktoken:cl100k_base", "tasks": {"multi-hop": {}},
                        "arms": [{"name": "k", "compressor": "keep-all"}]})
    assert cfg.seeds == (0, 1, 2) and cfg.baseline == "k" and cfg.agents[0].kind == "scripted"
    assert cfg.arms[0].pins is True and cfg.arms[0].budget == 32_768


def test_template_kwargs_and_history_reach_every_episode_log_and_replay(tmp_path):
    """`template_kwargs` and `history` of a config: each episode renders with the kwargs' distinct template
    (Qwen3 with enable_thinking=false) in the chosen history mode, both recorded, and every log replays."""
    from ctxkit.events import EpisodeStart
    from ctxkit.log.event_log import read_events

    text = small_toml(seeds="[0]", top='template_kwargs = { enable_thinking = false }\nhistory = "template"')
    text = text.replace(str(tokenizer_dir("qwen2.5-instruct")), str(tokenizer_dir("qwen3")))
    cfg = load_config(write_config(tmp_path, text))
    assert cfg.template_kwargs == {"enable_thinking": False} and cfg.history == "template"
    summary = run_experiment(cfg, tmp_path / "run", progress=False, report=False)
    logs = sorted((tmp_path / "run" / "episodes").glob("*/*.jsonl"))
    assert len(logs) == 4
    for path in logs:
        start = next(e for e in read_events(path) if isinstance(e, EpisodeStart))
        assert start.context["history"] == "template"
        assert start.context["template"]["id"].startswith("tokenizer+enable_thinking=false@sha256:")
        assert start.context["template"]["kwargs"] == {"enable_thinking": False}
        assert main(["replay", "--verify", str(path)]) == 0
    assert summary is not None
