"""Every real trajectory in ../shared/trajectories, end to end: import -> export -> render -> offline steps
-> replay -> samples, and compression-aware samples under every registered compressor.

Recorded by other people's agents (tau-bench, SWE-agent, OpenHands and SWE-smith through Agent Data
Protocol samples, mini-swe-agent, OpenHands event streams, tau2-bench, Toucan, CodeAct ShareGPT), so
nothing here was shaped by ctxkit. Per episode:
- it imports with `--format auto` and exports back to the same messages (a second import is identical);
- its render equals `apply_chat_template(tokenize=True)` under `special_tokens="allow"` (transformers'
  own semantics) for Qwen2.5 and Qwen3 on every episode, and for SmolLM2 and Mistral v0.3 wherever their
  templates accept the conversation (SmolLM2's has no tool support; Mistral's wants 9-character call ids
  and alternating roles); where a template refuses a conversation, ctxkit refuses it too;
- its assistant turns become offline steps, the log replays n/n, and its samples' loss-bearing ids are
  exactly the assistant turns' ids;
- on a spread of episodes from every file, every registered compressor rebuilds every step at the
  smallest budget from 50 % of the episode's full length up (in 256-token steps) at which `window` fits
  every step (below that, the fixed prefix of system prompt and tool schemas plus the newest turn does not
  fit: tau-bench's prompt and tools alone take 3,878 Qwen2.5 tokens). Compressors that promise to fit
  (`fits_budget`) must build every step there; the one-thing `-v2` strategies may stop with a
  `BudgetError`, and then `on_overflow="truncate"` gives the samples of the steps before it;
- on the same spread, the offline-step logs pass `ctxkit audit` (all five checks) and `ctxkit view` shows
  every step with its context.
"""

from __future__ import annotations

from functools import lru_cache

import pytest

from conftest import shared_path, tokenizer_dir
from shared_trajectories import EPISODES, FILES, NOT_YET_IMPORTED, episodes, spread, window_budget
from ctxkit.context.compress import COMPRESSORS, make_compressor
from ctxkit.log.conversation import export_messages, import_conversation
from ctxkit.errors import BudgetError, CtxkitError
from ctxkit.events import EpisodeStart, Message, Step, ToolResult
from ctxkit.log.event_log import MemoryLog
from ctxkit.training.context_replay import verify_log
from ctxkit.training.offline_steps import add_offline_steps
from ctxkit.text.rendering.renderer import render
from ctxkit.text.tokenizer.loader import load_tokenizer
from ctxkit.training.episode_samples import compressed_samples, samples

RENDER_TOKENIZERS = ("qwen2.5-instruct", "qwen3", "smollm2-135m-instruct")


def test_the_shared_folder_holds_exactly_these_trajectories():
    folder = shared_path("trajectories")
    data = sorted(p.name for p in folder.iterdir() if p.name != "SOURCES.md")
    assert data == sorted([*FILES, *(t for t in FILES.values() if t), *NOT_YET_IMPORTED])
    assert not set(NOT_YET_IMPORTED) & set(FILES)


@lru_cache(maxsize=None)
def tok(name: str):
    return load_tokenizer(str(tokenizer_dir(name)))


def tools_of(events) -> list | None:
    start = next(e for e in events if isinstance(e, EpisodeStart))
    return list(start.tools) or None


@pytest.mark.parametrize("name", FILES)
def test_every_episode_imports_and_exports_back(name):
    eps = episodes(name)
    assert len(eps) == EPISODES[name]
    for ep in eps:
        messages = export_messages(ep.events)
        again = import_conversation({"messages": messages, "tools": tools_of(ep.events) or []})
        assert [chat_key(m) for m in export_messages(again)] == [chat_key(m) for m in messages], ep.entry_id
        assert len(messages) == sum(isinstance(e, (Message, ToolResult)) for e in ep.events)


def chat_key(message: dict) -> tuple:
    """What a template renders of a message (a `ToolResult` exports as a tool message)."""
    return message["role"], message.get("content"), message.get("tool_calls"), message.get("tool_call_id")


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer", [*RENDER_TOKENIZERS, "mistral-7b-instruct-v0.3"])
@pytest.mark.parametrize("name", FILES)
def test_render_equals_apply_chat_template(name, tokenizer):
    """Same ids as transformers wherever its template accepts the conversation; where the template itself
    refuses it (Mistral's 9-character call ids and role order; SmolLM2's template reads `content` of tool
    calls it does not support), ctxkit refuses it too. Qwen2.5 and Qwen3 accept every episode."""
    t = tok(tokenizer)
    refused = 0
    for ep in episodes(name):
        messages, tools = export_messages(ep.events), tools_of(ep.events)
        try:
            expected = t.hf.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False)
        except Exception:  # noqa: BLE001 - the template's own error (raise_exception, undefined attribute)
            refused += 1
            with pytest.raises(CtxkitError):
                render(messages, tokenizer=t, tools=tools, special_tokens="allow")
            continue
        got = render(messages, tokenizer=t, tools=tools, special_tokens="allow")
        assert list(got.token_ids) == list(expected), (name, ep.entry_id, tokenizer)
    print(f"{name} {tokenizer}: {EPISODES[name] - refused} rendered, {refused} refused by the template")
    if tokenizer in ("qwen2.5-instruct", "qwen3"):
        assert refused == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_offline_steps_replay_and_samples(name):
    t = tok("qwen2.5-instruct")
    for ep in episodes(name):
        events = add_offline_steps(ep.events, t)
        log = MemoryLog()
        log.extend(events)
        steps = [e for e in log.events() if isinstance(e, Step)]
        assert steps and all(s.logprob_kind == "none" and s.logprobs is None for s in steps)
        report = verify_log(log)
        assert report.ok and report.n_ok == report.n_steps == len(steps), (ep.entry_id, report.first_failure)
        rows = samples(log)
        assert rows
        assert [x for r in rows for x, m in zip(r.token_ids, r.loss_mask) if m] == [x for s in steps for x in s.token_ids]





def loss_ids(rows) -> list[int]:
    return [x for r in rows for x, m in zip(r.token_ids, r.loss_mask) if m]


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_every_compressor_rebuilds_every_step(name):
    t = tok("qwen2.5-instruct")
    windowed, longest = 0, 0
    for index in spread(name):
        ep = episodes(name)[index]
        events = add_offline_steps(ep.events, t)
        steps = [e for e in events if isinstance(e, Step)]
        full, budget = window_budget(events)
        made: dict[str, int] = {}
        for compressor in COMPRESSORS:
            if compressor == "keep-all":
                continue
            where = (name, ep.entry_id, compressor, budget)
            try:
                rows = compressed_samples(events, compressor=compressor, budget=budget)
            except BudgetError:
                assert not make_compressor(compressor).fits_budget, where
                rows = compressed_samples(events, compressor=compressor, budget=budget, on_overflow="truncate")
                assert all(r.outcome == "truncated" and r.cause == "context_budget" for r in rows), where
                n = sum(len(r.step_seqs) for r in rows)
                assert loss_ids(rows) == [x for s in steps[:n] for x in s.token_ids], where
                made[compressor] = sum(len(r.compactions) for r in rows)
                continue
            assert rows, where
            assert loss_ids(rows) == [x for s in steps for x in s.token_ids], where
            assert all(r.token_step.index(k) <= budget for r in rows for k in range(len(r.step_seqs))), where
            made[compressor] = sum(len(r.compactions) for r in rows)
        compacting = sorted(c for c, n in made.items() if n)
        print(f"{name} {ep.entry_id}: full {full} tokens, budget {budget} ({budget / full:.0%}), "
              f"{len(compacting)}/{len(made)} compressors compacted")
        windowed += "window" in compacting
        longest = max(longest, len(steps))
    # the budget forces compaction in the file: window keeps the first two messages and the newest turn, so
    # only two-step episodes (the Toucan sample) leave it nothing to drop (one CodeAct episode fits at the
    # first 256-token step above the window's floor)
    assert windowed or longest <= 2, f"{name}: window compacted no episode"


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_audit_and_view_pass(name, tmp_path):
    from ctxkit.log.event_log import EventLog
    from ctxkit.training.preflight import audit
    from ctxkit.viewer.page import build_page

    t = tok("qwen2.5-instruct")
    for index in spread(name):
        ep = episodes(name)[index]
        with EventLog.create(tmp_path / f"{index}.jsonl", episode_id=ep.entry_id or None) as log:
            log.extend(add_offline_steps(ep.events, t))
    report = audit([tmp_path])
    assert report.ok, [str(f) for c in report.checks for f in c.examples]
    assert len(report.paths) == len(report.offline) == len(spread(name))
    page = build_page([tmp_path], tokenizer=t)
    assert page.failed == () and page.n_episodes == len(spread(name))
    assert page.n_steps == sum(1 for i in spread(name) for e in episodes(name)[i].events
                               if isinstance(e, Message) and e.role == "assistant")

