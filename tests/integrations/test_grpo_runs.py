"""`ctxkit train grpo`: its config (runs built from shared fields, held-out seeds refused, every key named), its
report (figures exact over hand-made iteration logs, the equal-wall-time cut), and a real quick run on SmolLM2."""

from __future__ import annotations

import json

import pytest

from conftest import REPO_ROOT, require_module, tokenizer_dir
from step_logs import write_step_log as write_log
from ctxkit.errors import ConfigError
from ctxkit.integrations.grpo_config import load_grpo_config
from ctxkit.integrations.grpo_runs import read_grpo_log, summarize_run, write_report

CONFIG = """
name = "tiny-grpo"
model = "default"
tokenizer = "{tok}"
task = "needle-recall"
task_params = {{ n_files = 3, lines_per_file = 3 }}
seeds = [200, 201]
eval_seeds = [0, 1]
threads = 2
{extra}
[grpo]
steps = 3
budget = 1024
max_new_tokens = 12

[[runs]]
name = "window-sync"
compressor = "window"
compressor_params = {{ keep_first = 1 }}
pins = false

[[runs]]
name = "window-off"
compressor = "window"
compressor_params = {{ keep_first = 1 }}
mode = "one-step-off"

[quick]
steps = 1
prompts = 1
group_size = 2
max_steps = 2
"""


def write_config(tmp_path, extra: str = "", tok: str = "../shared/tokenizers/smollm2-135m-instruct"):
    path = tmp_path / "grpo.toml"
    path.write_text(CONFIG.format(tok=tok, extra=extra))
    return path


def test_runs_take_the_shared_fields_then_their_own_then_quick(tmp_path):
    config = load_grpo_config(write_config(tmp_path))
    assert (config.name, config.model, config.eval_seeds, config.threads) == ("tiny-grpo", None, (0, 1), 2)
    a, b = config.runs
    assert (a.name, a.spec.task, a.spec.seeds, a.spec.steps, a.spec.pins, a.spec.mode) == \
        ("window-sync", "needle-recall", (200, 201), 3, False, "sync")
    assert (b.name, b.spec.pins, b.spec.mode, b.spec.max_new_tokens, dict(b.spec.compressor_params)) == \
        ("window-off", True, "one-step-off", 12, {"keep_first": 1})
    quick = load_grpo_config(tmp_path / "grpo.toml", quick=True)
    assert [(r.spec.steps, r.spec.group_size, r.spec.budget) for r in quick.runs] == [(1, 2, 1024), (1, 2, 1024)]


@pytest.mark.parametrize("change, message", [
    (("eval_seeds = [0, 1]", "eval_seeds = [0, 201]"), r"grpo\.toml: eval_seeds \[201\] are also training seeds"),
    (("steps = 3", "epochs = 3"), r"\[grpo\] has unknown key\(s\) \['epochs'\]; expected GrpoSpec fields"),
    (("mode = \"one-step-off\"", "mode = \"async\""), r"\[\[runs\]\] 1 \(window-off\): GrpoSpec\.mode='async'"),
    (("name = \"window-off\"", "name = \"window-sync\""), r"\[\[runs\]\] 1 name 'window-sync' is used twice"),
    (("threads = 2", "threads = 0"), r"threads is 0; expected an integer >= 1"),
    (("group_size = 2", "group_size = 1"), r"\[\[runs\]\] 0 \(window-sync\): GrpoSpec\.group_size=1"),
])
def test_config_errors_name_the_file_and_key(tmp_path, change, message):
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace(*change, 1))
    quick = change[0].startswith("group_size")
    with pytest.raises(ConfigError, match=message):
        load_grpo_config(path, quick=quick)


def test_the_shipped_config_loads_with_held_out_seeds_apart():
    tokenizer_dir("smollm2-135m-instruct")
    config = load_grpo_config(REPO_ROOT / "experiments" / "grpo.toml")
    assert [r.name for r in config.runs] == ["window-sync", "mask-window-pins-sync", "mask-window-pins-off"]
    train = {s for r in config.runs for s in r.spec.seeds}
    assert train.isdisjoint(config.eval_seeds) and train.isdisjoint(range(100, 106))  # nor the SFT's seeds
    assert [r.spec.mode for r in config.runs] == ["sync", "sync", "one-step-off"]


def test_the_at_budget_config_is_grpo_toml_from_the_48_step_policy_at_its_budget():
    """grpo_at_budget_48.toml: grpo.toml's runs, seeds and fields, with only the policy (the 48-step checkpoint
    trained on expert data at 1,024 tokens) and the budget (that 1,024) changed."""
    import dataclasses

    tokenizer_dir("smollm2-135m-instruct")
    first = load_grpo_config(REPO_ROOT / "experiments" / "grpo.toml")
    at_budget = load_grpo_config(REPO_ROOT / "experiments" / "grpo_at_budget_48.toml")
    assert at_budget.model == str(REPO_ROOT / "runs" / "sft_at_budget_48" / "checkpoint")
    assert (at_budget.tokenizer, at_budget.eval_seeds, at_budget.threads) == (first.tokenizer, first.eval_seeds,
                                                                             first.threads)
    assert [r.name for r in at_budget.runs] == [r.name for r in first.runs]
    assert [r.spec for r in at_budget.runs] == [dataclasses.replace(r.spec, budget=1024) for r in first.runs]

def test_the_window_config_is_the_first_run_of_the_48_step_config_alone():
    tokenizer_dir("smollm2-135m-instruct")
    full = load_grpo_config(REPO_ROOT / "experiments" / "grpo_at_budget_48.toml")
    alone = load_grpo_config(REPO_ROOT / "experiments" / "grpo_at_budget_48_window.toml")
    assert (alone.model, alone.tokenizer, alone.eval_seeds, alone.threads) == (full.model, full.tokenizer,
                                                                              full.eval_seeds, full.threads)
    assert alone.runs == full.runs[:1] and alone.runs[0].name == "window-sync"


def row(reward, wall, lag=0, generated=100, generate_s=10.0, loss_tokens=50, samples=4, discarded=0, age=0.0):
    return {"mean_reward": reward, "wall_s": wall, "episodes": 4, "discarded": discarded, "samples": samples,
            "generated_tokens": generated, "generate_s": generate_s, "loss_tokens": loss_tokens, "lag": lag,
            "data_age_s": age}


def test_summaries_are_exact_and_cut_at_equal_wall_time():
    rows = [row(0.0, 10.0), row(0.5, 10.0, samples=6, discarded=1), row(1.0, 10.0)]
    whole = summarize_run("a", "sync", "window", rows)
    assert (whole.iterations, whole.until_s, whole.first_reward, whole.last_reward) == (3, 30.0, 0.0, 1.0)
    assert whole.mean_reward == pytest.approx(0.5) and whole.samples_per_episode == pytest.approx(14 / 11)
    assert whole.generated_tokens_per_s == pytest.approx(10.0) and whole.loss_tokens_per_s == pytest.approx(5.0)
    cut = summarize_run("a", "sync", "window", rows, until_s=25.0)
    assert (cut.iterations, cut.until_s, cut.last_reward, cut.mean_reward) == (2, 25.0, 0.5, 0.25)
    none = summarize_run("a", "sync", "window", rows, until_s=5.0)  # a run slower than the cut shows nothing yet
    assert (none.iterations, none.episodes, none.mean_reward, none.last_reward) == (0, 0, None, None)


def test_the_report_compares_runs_at_the_shortest_runs_wall_time(tmp_path):
    require_module("matplotlib")
    config = load_grpo_config(write_config(tmp_path))
    logs = {"window-sync": [row(0.0, 10.0), row(0.25, 10.0)],
            "window-off": [row(0.0, 8.0, age=1.0), row(0.5, 6.0, lag=1, age=0.5), row(0.75, 6.0, lag=1, age=0.5)]}
    for name, rows in logs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "grpo_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    whole, equal = write_report(config, tmp_path)
    assert [s.until_s for s in whole] == [20.0, 20.0]
    assert [(s.run, s.iterations, s.mean_reward, s.mean_lag) for s in equal] == \
        [("window-sync", 2, 0.125, 0.0), ("window-off", 3, 0.4166666666666667, 2 / 3)]
    report = (tmp_path / "report.md").read_text()
    assert "## At equal wall time (20 s, the shortest run)" in report and "| window-off | window+pins | one-step-off | 3 |" in report
    assert json.loads((tmp_path / "grpo.json").read_text())["equal_wall_time_s"] == 20.0
    assert (tmp_path / "grpo.png").stat().st_size > 1000


def test_the_report_names_runs_that_showed_the_policy_the_same_contexts(tmp_path):
    require_module("matplotlib")

    config = load_grpo_config(write_config(tmp_path))
    for name in ("window-sync", "window-off"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "grpo_log.jsonl").write_text(json.dumps(row(0.5, 10.0)) + "\n")
        write_log(tmp_path / name / "step0000" / "needle-recall-200-0.jsonl", ["h1", "h2"])
        write_log(tmp_path / name / "step0000" / "needle-recall-200-1.jsonl", ["h1", "h3", "h4"])
    write_report(config, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert ("## Runs that showed the policy the same contexts" in report and "- `window-sync` and `window-off`: "
            "identical contexts at every decision (2 of 2 shared episodes, 5 decisions, equal context hashes)" in report)
    assert json.loads((tmp_path / "grpo.json").read_text())["same_contexts"] == [
        {"first": "window-sync", "second": "window-off", "episodes": 2, "decisions": 5}]
    write_log(tmp_path / "window-off" / "step0001" / "needle-recall-201-0.jsonl", ["h5"])  # an episode one run lacks
    write_report(config, tmp_path)
    assert "same contexts" not in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "grpo.json").read_text())["same_contexts"] == []


def test_a_damaged_log_line_is_named(tmp_path):
    path = tmp_path / "grpo_log.jsonl"
    path.write_text(json.dumps(row(0.0, 1.0)) + "\n{oops\n")
    with pytest.raises(ConfigError, match=r"grpo_log\.jsonl: line 2: not JSON"):
        read_grpo_log(path)


@pytest.mark.slow
def test_a_quick_run_trains_both_schedules_and_reports(tmp_path):
    for module in ("torch", "transformers", "gguf", "matplotlib"):
        require_module(module)
    from ctxkit.integrations.grpo_runs import run_grpo_config

    config = load_grpo_config(write_config(tmp_path, tok=str(tokenizer_dir("smollm2-135m-instruct"))), quick=True)
    whole, equal = run_grpo_config(config, tmp_path / "out", log=lambda _: None)
    assert [(s.run, s.iterations, s.episodes, s.mean_lag) for s in whole] == \
        [("window-sync", 1, 2, 0.0), ("window-off", 1, 2, 0.0)]
    assert (tmp_path / "out" / "report.md").exists() and len(equal) == 2
    assert max(s.iterations for s in equal) == 1  # the shortest run is read whole at its own wall time
    with pytest.raises(ConfigError, match=r"run folder window-sync already exists; pass --force"):
        run_grpo_config(config, tmp_path / "out", log=lambda _: None)
