"""`ctxkit audit`: a clean stateful episode passes all five checks; purpose-built bad logs (one problem each,
valid hash chains) are flagged by exactly the check that owns the problem; figures are exact."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import tokenizer_dir
from rollout_driver import Driver
from log_tamper import flip, rechain
from ctxkit.training.preflight import CHECKS, audit
from ctxkit.context.builder import ContextBuilder
from ctxkit.cli.parser import main
from ctxkit.log.event_log import EventLog

N_TURNS = 6


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clean")
    work = root / "work"
    work.mkdir()
    builder = ContextBuilder(str(tokenizer_dir("qwen2.5-instruct")), compressor="mask-observations",
                             params={"keep_last": 2}, budget=560)
    log = EventLog.create(root / "ep.jsonl", episode_id="ep-audit")
    Driver(n_turns=N_TURNS, workdir=work, episode_id="ep-audit").run(log, builder)
    log.close()
    return root / "ep.jsonl"


def copy_log(src: Path, dst_dir: Path, name: str = "ep.jsonl") -> Path:
    dst = dst_dir / name
    shutil.copyfile(src, dst)
    shutil.copytree(str(src) + ".blobs", str(dst) + ".blobs")
    return dst


def failing(report) -> set[str]:
    return {c.name for c in report.checks if not c.ok}


def kinds(body, kind):
    return [o for o in body if o["kind"] == kind]


def _steps(body):
    return kinds(body, "step")


def _end(body):
    return kinds(body, "episode_end")[-1]


def edit_step(i, **fields):
    def edit(body):
        _steps(body)[i].update(fields)
        return body
    return edit


def edit_end(**fields):
    def edit(body):
        _end(body).update(fields)
        return body
    return edit


def drop_logprob(body):
    s = _steps(body)[1]
    s["logprobs"] = s["logprobs"][:-1]
    return body


def positive_logprob(body):
    _steps(body)[2]["logprobs"][0] = 0.5
    return body


def tamper_tool(body):
    r = kinds(body, "tool_result")[1]
    r["content"] = flip(r["content"], 2)
    return body


def drop_end(body):
    return [o for o in body if o["kind"] != "episode_end"]


def drop_reward_kind(body):
    _end(body).pop("reward_kind")
    return body


def no_sampling(body):
    kinds(body, "episode_start")[0]["sampler"] = {"seed": 0}
    for s in _steps(body):
        s["sampling"] = {"seed": 0}
    return body


def no_seed(body):
    kinds(body, "episode_start")[0]["sampler"] = {"temperature": 0.7}
    for s in _steps(body):
        s["sampling"] = {"temperature": 0.7, "top_p": 0.95}
    return body


def drop_second_result_snapshot(body):
    target = kinds(body, "tool_result")[1]["id"]
    i = next(i for i, o in enumerate(body) if o["id"] == target)
    assert body[i + 1]["kind"] == "state_snapshot"
    return body[: i + 1] + body[i + 2:]


def unknown_unpin(body):
    return body + [{"kind": "unpin", "seq": None, "id": "e98-unpin000", "ts": body[-1]["ts"], "pin_id": "nope", "reason": None}]


BAD = {
    "logprobs not aligned": (drop_logprob, {"record"}),
    "log-prob above zero": (positive_logprob, {"record"}),
    "tool result tampered": (tamper_tool, {"record"}),
    "no episode end": (drop_end, {"rewards", "ends"}),
    "reward_kind not stated": (drop_reward_kind, {"rewards"}),
    "scored zero on truncation": (edit_end(outcome="truncated", cause="max_steps", reward=0.0), {"rewards"}),
    "unscored with a value": (edit_end(reward_kind="unscored", reward=0.0), {"rewards"}),
    "log-probs without kind": (edit_step(3, logprob_kind=None), {"distributions"}),
    "no sampling config": (no_sampling, {"distributions"}),
    "no policy version": (edit_step(0, policy_version=None), {"distributions"}),
    "limit recorded as terminated": (edit_end(cause="max_steps"), {"ends"}),
    "end without cause": (edit_end(cause=""), {"ends"}),
    "length cut recorded as answered": (edit_step(N_TURNS - 1, finish_reason="length"), {"ends"}),
    "no sampler seed": (no_seed, {"resume"}),
    "tool result without snapshot": (drop_second_result_snapshot, {"resume"}),
    "unpin of unknown pin": (unknown_unpin, {"resume"}),
}


def test_clean_log_passes_every_check(clean):
    report = audit([clean])
    assert report.ok, [str(f) for c in report.checks for f in c.examples]
    assert [c.name for c in report.checks] == list(CHECKS)
    by = {c.name: c for c in report.checks}
    assert by["record"].checked == N_TURNS and by["distributions"].checked == N_TURNS
    assert by["rewards"].checked == by["ends"].checked == by["resume"].checked == 1


@pytest.mark.parametrize("problem", list(BAD))
def test_each_bad_log_is_flagged_by_its_check(clean, tmp_path, problem):
    edit, expected = BAD[problem]
    path = copy_log(clean, tmp_path)
    rechain(path, edit)  # a valid chain: only the audit's checks can notice
    report = audit([path])
    assert failing(report) == expected, {c.name: [str(f) for f in c.examples] for c in report.checks}
    for name in expected:
        check = next(c for c in report.checks if c.name == name)
        assert check.failed >= 1 and check.examples and all(f.path == str(path) for f in check.examples)
    assert not report.ok


def test_raw_edit_and_missing_blob(clean, tmp_path):
    raw = copy_log(clean, tmp_path, "raw.jsonl")
    data = bytearray(raw.read_bytes())
    data[data.index(b"it now reads")] = ord("I")
    raw.write_bytes(bytes(data))
    report = audit([raw])
    assert failing(report) == {"record"}
    assert "cannot be read" in report.checks[0].examples[0].message

    sub = tmp_path / "blob"
    sub.mkdir()
    path = copy_log(clean, sub)
    from ctxkit.log.event_log import read_events
    from ctxkit.log.state import BlobStore

    snap = [e for e in read_events(path) if e.kind == "state_snapshot"][-1]
    BlobStore.for_log(path).path_of(snap.manifest_sha256).unlink()
    report = audit([path])
    assert failing(report) == {"resume"}
    assert "is missing from" in report.checks[4].examples[0].message


def test_raw_logprobs_under_top_p_is_a_warning_not_a_failure(clean, tmp_path):
    path = copy_log(clean, tmp_path)
    rechain(path, edit_step(0, logprob_kind="raw"))
    report = audit([path])
    assert report.ok
    warnings = report.checks[2].warnings
    assert warnings and "temperature, top_p" in warnings[0].message


def test_figures_are_exact(clean, tmp_path):
    from ctxkit.log.event_log import read_events

    steps = [e for e in read_events(clean) if e.kind == "step"]
    n_gen = sum(len(s.token_ids) for s in steps)
    path = copy_log(clean, tmp_path)

    def one_timeout(body):
        kinds(body, "tool_result")[0]["status"] = "timeout"
        return body

    rechain(path, one_timeout)
    fig = audit([path], trained_at=5).figures
    assert fig["generated_tokens"] == n_gen and fig["loss_tokens"] == n_gen
    assert fig["generated_tokens_per_s"] == 100.0  # the driver records generate_s = 0.01 s per token
    assert fig["policy_lag"] == {"trained_at": 5, "steps_known": 6, "steps_unknown": 0, "mean": 4.0, "max": 5,
                                 "by_lag": {"3": 2, "4": 2, "5": 2}}
    assert fig["tool_timeout_rate"] == pytest.approx(1 / 5, abs=1e-6)
    assert fig["discard_rate"] == 0.0 and fig["abort_rate"] == 0.0 and fig["episode_timeout_rate"] == 0.0
    assert fig["compactions"] >= 1 and fig["steps"] == N_TURNS
    # every sample after the first starts anew because a compaction rewrote the history; no sampled turn drifts
    assert fig["samples"] >= 2 and fig["sample_splits"] == fig["samples"] - 1
    assert fig["sample_splits_by_reason"] == {"compaction": fig["sample_splits"]}
    assert fig["drifts"] == 0 and fig["drifts_by_reason"] == {}
    quick = audit([path], rebuild=False).figures  # without replay the loss-bearing tokens are unknown, not 0
    assert quick["loss_tokens"] is None and quick["generated_tokens"] == n_gen
    assert quick["sample_splits_by_reason"] is None and quick["drifts_by_reason"] is None


def test_drifts_are_counted_by_reason(tmp_path, capsys):
    from ctxkit.events import EpisodeEnd, EpisodeStart, Message, Step

    builder = ContextBuilder(str(tokenizer_dir("qwen2.5-instruct")), budget=4096)
    tok = builder.tokenizer
    log = EventLog.create(tmp_path / "d.jsonl", episode_id="ep-d")
    log.extend([EpisodeStart(episode_id="ep-d", context=builder.describe(), sampler={"seed": 1}),
                Message(role="user", content="Say hello.")])
    # the policy wrote "Hello world" in pieces the tokenizer would merge: a bpe_merge drift, kept verbatim
    replies = [tok.encode("Hel") + tok.encode("lo world") + [tok.special_tokens["<|im_end|>"]],
               tok.encode("Again.<|im_end|>")]
    for i, ids in enumerate(replies):
        ctx = builder.build(log)
        text = tok.decode(ids[:-1])
        log.append(Step(context_hash=ctx.hash, context_length=ctx.n_tokens, token_ids=tuple(ids), content=text,
                        logprobs=tuple([-0.5] * len(ids)), logprob_kind="processed", sampling={"temperature": 1.0},
                        policy_version=1))
        if i == 0:
            log.append(Message(role="user", content="Once more."))
    log.append(EpisodeEnd(outcome="terminated", cause="answered", reward=1.0, reward_kind="scored"))
    log.close()
    fig = audit([tmp_path / "d.jsonl"]).figures
    assert (fig["drifts"], fig["drifts_by_reason"]) == (1, {"bpe_merge": 1})
    assert (fig["samples"], fig["sample_splits"], fig["sample_splits_by_reason"]) == (1, 0, {})
    assert main(["audit", str(tmp_path / "d.jsonl")]) == 0
    out = capsys.readouterr().out
    assert 'drifts_by_reason: {"bpe_merge": 1}' in out and "sample_splits: 0" in out


def test_cli_over_a_run_folder(clean, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    copy_log(clean, run, "a.jsonl")
    bad = copy_log(clean, run, "b.jsonl")
    rechain(bad, drop_end)
    (run / "samples.jsonl").write_text('{"token_ids": [1]}\n')  # an export, not a log
    assert main(["audit", str(run / "a.jsonl")]) == 0
    assert "audit: ok" in capsys.readouterr().out
    assert main(["audit", str(run), "--json", "--trained-at", "3"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and len(out["paths"]) == 2 and out["skipped"] == [str(run / "samples.jsonl")]
    by = {c["name"]: c for c in out["checks"]}
    assert by["rewards"]["failed"] == 1 and by["ends"]["failed"] == 1 and by["record"]["failed"] == 0
    assert out["figures"]["discard_rate"] == 0.5 and out["figures"]["policy_lag"]["max"] == 3
    assert main(["audit", str(tmp_path / "missing")]) == 2
