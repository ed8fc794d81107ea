"""Compression-aware samples from a saved trajectory: every step's context rebuilt under another
compressor and budget on an in-memory copy (the log file stays byte-identical), loss-bearing ids still the
assistant ids, compactions recorded in the samples and the Parquet metadata, readable by `datasets`."""

from __future__ import annotations

import hashlib

import pytest

from conftest import require_module
from trajectory_logs import tau_conversation, tau_episodes, write_offline_log
from ctxkit.cli.parser import main
from ctxkit.log.conversation import import_conversation
from ctxkit.errors import BudgetError, ConfigError
from ctxkit.events import Step
from ctxkit.training.sample_files import PARQUET_SCHEMA, parquet_info, read_samples
from ctxkit.log.event_log import read_events
from ctxkit.training.episode_samples import compressed_samples, samples

BUDGET = 6000  # the full episode reaches 7819 tokens; its system prompt and 14 tool schemas take 3878


@pytest.fixture(scope="module")
def tau_log(tmp_path_factory):
    path = tmp_path_factory.mktemp("tau") / "tau-0.jsonl"
    write_offline_log(path, tau_conversation(0), episode_id="tau-0", reward=float(tau_episodes()[0]["reward"])).close()
    return path


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def step_contexts(row):
    """Per step of a sample: the length of the context it saw (its sampled ids start there)."""
    return [row.token_step.index(k) for k in range(len(row.step_seqs))]


def test_window_below_the_full_length(tau_log):
    before = digest(tau_log)
    full = samples(str(tau_log))
    assert [len(s.token_ids) for s in full] == [7819]
    rows = compressed_samples(str(tau_log), compressor="window", budget=BUDGET)
    assert digest(tau_log) == before  # the source log is only read
    compactions = [c for s in rows for c in s.compactions if c["kind"] == "compaction"]
    assert len(rows) == 3 and len(compactions) == 2
    assert [c["before_step_seq"] for c in compactions] == [15, 31]
    assert all(c["compressor"] == "window-v1" and c["edits"][0]["op"] == "drop" for c in compactions)
    assert all(n <= BUDGET for s in rows for n in step_contexts(s))
    assert max(n for s in rows for n in step_contexts(s)) > 4096
    steps = [e for e in read_events(tau_log) if isinstance(e, Step)]
    assert [t for s in rows for t, m in zip(s.token_ids, s.loss_mask) if m] == [t for s in steps for t in s.token_ids]
    assert [q for s in rows for q in s.step_seqs] == [s.seq for s in steps]
    assert all(s.compressor.startswith("window-v1 {") and s.compressor.endswith(f" budget={BUDGET}") for s in rows)
    assert all((s.reward, s.reward_kind, s.outcome, s.cause) == (0.0, "scored", "terminated", "answered") for s in rows)
    assert [s.is_final for s in rows] == [False, False, True]
    # a budget the history cannot be windowed into names the step
    with pytest.raises(BudgetError, match=rf"^{tau_log}: step seq 9: window-v1: even the first 2 message\(s\)"):
        compressed_samples(str(tau_log), compressor="window", budget=4096)
    assert digest(tau_log) == before


def test_on_overflow_truncate_ends_the_episode_where_a_context_cannot_fit(tau_log):
    """At 4096 tokens the window cannot hold step seq 9's context (3878 tokens of system prompt and tools
    plus the newest turn): with on_overflow="truncate" the samples stop before it, the episode is truncated
    by the context budget and the source's reward is not carried (this policy never finished the episode)."""
    before = digest(tau_log)
    rows = compressed_samples(str(tau_log), compressor="window", budget=4096, on_overflow="truncate")
    steps = [e for e in read_events(tau_log) if isinstance(e, Step)]
    kept = [s for s in steps if s.seq < 9]
    assert [q for s in rows for q in s.step_seqs] == [s.seq for s in kept]
    assert [t for s in rows for t, m in zip(s.token_ids, s.loss_mask) if m] == [t for s in kept for t in s.token_ids]
    assert all(n <= 4096 for s in rows for n in step_contexts(s))
    assert all((s.reward, s.reward_kind, s.outcome, s.cause) == (None, "limit_truncation", "truncated", "context_budget")
               for s in rows)
    assert rows[-1].is_final and digest(tau_log) == before
    with pytest.raises(ConfigError, match="on_overflow is 'drop'; expected one of"):
        compressed_samples(str(tau_log), compressor="window", budget=4096, on_overflow="drop")


def test_keep_all_rebuild_gives_the_recorded_samples(tau_log):
    rows = compressed_samples(str(tau_log), compressor="keep-all", budget=1 << 20)
    recorded = samples(str(tau_log))
    assert [(s.token_ids, s.loss_mask, s.context_hashes) for s in rows] == [
        (s.token_ids, s.loss_mask, s.context_hashes) for s in recorded]
    assert all(not s.compactions for s in rows)


def test_a_message_only_episode_gets_offline_steps_first():
    events = import_conversation(tau_conversation(0), episode_id="tau-0")
    with pytest.raises(ConfigError, match="the log holds no steps; pass a tokenizer"):
        compressed_samples(events, compressor="window", budget=BUDGET)
    from trajectory_logs import qwen

    rows = compressed_samples(events, compressor="window", budget=BUDGET, tokenizer=qwen())
    assert len(rows) == 3 and sum(s.n_sampled for s in rows) == 1599


def test_cli_writes_parquet_readable_by_datasets(tau_log, tmp_path, capsys):
    datasets = require_module("datasets")
    before = digest(tau_log)
    out = tmp_path / "w.parquet"
    assert main(["samples", str(tau_log), "--compressor", "window", "--budget", str(BUDGET), "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{out}: 3 samples from 1 log(s), 15910 tokens, 1599 loss-bearing"
    assert lines[1] == "2 split(s) within episodes (compaction 2)"  # both compactions start a sample
    assert lines[2].startswith("rebuilt under window-v1 {") and lines[2].endswith(
        f"budget={BUDGET}: 2 compaction(s) (recorded in the samples' metadata; the logs are unchanged)")
    assert digest(tau_log) == before
    info = parquet_info(out)
    assert info["info"] == {"sources": [str(tau_log)], "rebuild": {"compressor": "window", "budget": BUDGET, "params": {},
                                                                   "reserve_tokens": 0, "detect_pins": False,
                                                                   "on_overflow": "error"}}
    assert sorted(info["compactions"]) == [("tau-0", 1), ("tau-0", 2)]
    back = read_samples(out)
    assert back == compressed_samples(str(tau_log), compressor="window", budget=BUDGET)
    ds = datasets.load_dataset("parquet", data_files=str(out), split="train")
    assert ds.column_names == [name for name, _ in PARQUET_SCHEMA] and ds.num_rows == 3
    assert ds[2]["reward"] == 0.0 and ds[2]["reward_kind"] == "scored" and ds[2]["logprob_kind"] == "none"


@pytest.mark.parametrize("argv, message", [
    (["--budget", "100"], "ctxkit: error: --budget only apply with --compressor NAME"),
    (["--compressor", "window"], "ctxkit: error: --compressor window needs --budget N (tokens)"),
    (["--compressor", "window", "--budget", "9000", "--params", "[1]"], "ctxkit: error: --params '[1]': expected a JSON object"),
])
def test_cli_option_errors(tau_log, tmp_path, capsys, argv, message):
    assert main(["samples", str(tau_log), "-o", str(tmp_path / "x.parquet"), *argv]) == 2
    assert capsys.readouterr().err.strip() == message
    assert not (tmp_path / "x.parquet").exists()
