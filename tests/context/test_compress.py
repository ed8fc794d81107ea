"""Compressors: golden views on small fixed logs (real Qwen2.5 tokenizer and template), triggers,
parameter validation and the registry."""

from __future__ import annotations

import re

import math

import orjson
import pytest

from conftest import READ_TOOLS
from ctxkit.context.builder import ContextBuilder
from ctxkit.context.compress import COMPRESSORS, compressor_defaults, make_compressor
from ctxkit.context.compress.base import CompressorSpec
from ctxkit.context.compress.truncate_tool_output import truncate_text
from ctxkit.edits import DropEdit, edit_to_dict
from ctxkit.errors import BudgetError, ConfigError
from ctxkit.events import Compaction, EpisodeStart, Message, Step, ToolCall, ToolResult
from ctxkit.log.event_log import MemoryLog
from ctxkit.context.view import Provenance, apply_edits

TOOLS = READ_TOOLS
CONSTRAINT = "Do not modify the original file."


def output(t: int, words: int = 80) -> str:
    return " ".join(f"row{t}_{i} value" for i in range(words))


def episode(turns: int, words: int = 80) -> MemoryLog:
    log = MemoryLog()
    log.extend([EpisodeStart(episode_id="golden", tools=TOOLS),
                Message(role="system", content="You are a careful agent."),
                Message(role="user", content=f"Fix the parser. {CONSTRAINT}")])
    for t in range(turns):
        log.extend([Step(content=f"Reading {t}.", tool_calls=(ToolCall(f"c{t}", "read", f'{{"path": "f{t}"}}'),)),
                    ToolResult(tool_call_id=f"c{t}", name="read", content=output(t, words))])
    return log


def ids_of(log, kind):
    return [e.id for e in log.events() if e.kind == kind]


def shape(view):
    return [(m.role, m.provenance.how, m.provenance.event_ids) for m in view.messages]


def last_compaction(log):
    comps = [e for e in log.events() if isinstance(e, Compaction)]
    return comps[-1] if comps else None


def budget_for_target(lo: int, hi: int, fraction: float = 0.75) -> int:
    """A budget whose target int(fraction * budget) lies in [lo, hi)."""
    b = math.ceil(lo / fraction)
    while int(fraction * b) < lo:
        b += 1
    assert int(fraction * b) < hi, (lo, hi)
    return b


# ------------------------------------------------------------------------------------------ keep-all


def test_keep_all_under_budget_is_verbatim_and_over_budget_names_sizes(tok):
    log = episode(4)
    ctx = ContextBuilder(tok, compressor="keep-all", budget=20_000).build(log)
    assert all(m.provenance.how == "verbatim" for m in ctx.view.messages)
    assert last_compaction(log) is None
    small = ContextBuilder(tok, compressor="keep-all", budget=300)
    with pytest.raises(BudgetError, match=rf"keep-all-v1: the context is {ctx.n_tokens} tokens, over the budget of 300"):
        small.build(episode(4))


def test_keep_all_on_overflow_truncate_records_and_marks(tok):
    log = episode(4)
    ctx = ContextBuilder(tok, compressor="keep-all", params={"on_overflow": "truncate"}, budget=300).build(log)
    assert ctx.truncated and ctx.n_tokens > 300
    comp = last_compaction(log)
    assert comp.edits == () and comp.details["overflow"] is True and comp.details["budget"] == 300


# ------------------------------------------------------------------------------------------ window


def test_window_golden_keeps_as_many_recent_turns_as_fit(tok):
    probe = ContextBuilder(tok, compressor="keep-all", budget=100_000)
    log = episode(6)
    full = probe.build(log).view
    steps, results = ids_of(log, "step"), ids_of(log, "tool_result")

    def size_keeping(k):  # exact size of the view with only the newest k turns
        drop = [i for t in range(6 - k) for i in (steps[t], results[t])]
        return probe.measure(apply_edits(full, [DropEdit(tuple(drop))]))

    budget = budget_for_target(size_keeping(2), size_keeping(3))
    log = episode(6)
    ctx = ContextBuilder(tok, compressor="window", budget=budget).build(log)
    msgs = ids_of(log, "message")
    assert shape(ctx.view) == [
        ("system", "verbatim", (msgs[0],)),
        ("user", "verbatim", (msgs[1],)),
        ("assistant", "verbatim", (steps[4],)),
        ("tool", "verbatim", (results[4],)),
        ("assistant", "verbatim", (steps[5],)),
        ("tool", "verbatim", (results[5],)),
    ]
    comp = last_compaction(log)
    assert comp.compressor == "window-v1"
    assert comp.edits == (DropEdit((steps[0], results[0], steps[1], results[1], steps[2], results[2], steps[3],
                                    results[3])),)
    assert ctx.n_tokens == size_keeping(2) <= int(0.75 * budget)


def test_window_keep_first_one_moves_the_constraint_to_the_pinned_block(tok):
    log = episode(6)
    ctx = ContextBuilder(tok, compressor="window", params={"keep_first": 1}, budget=900).build(log)
    hows = [m.provenance.how for m in ctx.view.messages]
    assert hows[:2] == ["verbatim", "pinned"] and "user" not in [m.role for m in ctx.view.messages]
    assert ctx.view.messages[1].content == f"Pinned constraints:\n- {CONSTRAINT}"
    assert CONSTRAINT in tok.decode(ctx.token_ids)


def test_window_never_splits_a_call_from_its_results(tok):
    log = MemoryLog()
    log.extend([EpisodeStart(tools=TOOLS), Message(role="system", content="s"), Message(role="user", content="go")])
    for t in range(5):
        calls = tuple(ToolCall(f"c{t}_{j}", "read", "{}") for j in range(3))
        log.extend([Step(content="", tool_calls=calls)] + [ToolResult(tool_call_id=c.id, content=output(t, 30)) for c in calls])
    ctx = ContextBuilder(tok, compressor="window", budget=1200).build(log)
    roles = [m.role for m in ctx.view.messages]
    assert roles[:2] == ["system", "user"] and roles[2] == "assistant"
    assert roles[2:] == ["assistant", "tool", "tool", "tool"] * ((len(roles) - 2) // 4)


# ------------------------------------------------------------------------------------------ mask-observations


def test_mask_observations_golden(tok):
    log = episode(5)
    b = ContextBuilder(tok, compressor="mask-observations", params={"keep_last": 2}, budget=2000)
    ctx = b.build(log)
    results = ids_of(log, "tool_result")
    originals = {e.id: e.content for e in log.events() if e.kind == "tool_result"}
    tools_view = [(m.provenance.how, m.content) for m in ctx.view.messages if m.role == "tool"]
    assert tools_view == [
        ("masked", f"[tool output {results[0]} masked: {tok.count(originals[results[0]])} tokens]"),
        ("masked", f"[tool output {results[1]} masked: {tok.count(originals[results[1]])} tokens]"),
        ("masked", f"[tool output {results[2]} masked: {tok.count(originals[results[2]])} tokens]"),
        ("verbatim", originals[results[3]]),
        ("verbatim", originals[results[4]]),
    ]
    comp = last_compaction(log)
    assert [e.kind for e in comp.edits] == ["mask"] * 3
    assert comp.details["keep_last_used"] == 2
    # the raw output stays in the log
    assert originals[results[0]] == output(0)


def test_mask_observations_under_budget_does_nothing_by_default(tok):
    log = episode(5)
    ContextBuilder(tok, compressor="mask-observations", params={"keep_last": 2}, budget=50_000).build(log)
    assert last_compaction(log) is None


def test_every_turn_trigger_masks_even_under_budget(tok):
    log = episode(5)
    ctx = ContextBuilder(tok, compressor="mask-observations", params={"keep_last": 2, "trigger": "every_turn"},
                         budget=50_000).build(log)
    assert [m.provenance.how for m in ctx.view.messages if m.role == "tool"] == ["masked"] * 3 + ["verbatim"] * 2


def test_tokens_and_fraction_triggers(tok):
    size = ContextBuilder(tok, budget=50_000).build(episode(5)).n_tokens
    for params, fires in [({"trigger": "tokens", "trigger_tokens": size - 1}, True),
                          ({"trigger": "tokens", "trigger_tokens": size}, False),
                          ({"trigger": "fraction", "trigger_fraction": (size - 1) / 50_000}, True),
                          ({"trigger": "fraction", "trigger_fraction": (size + 1) / 50_000}, False)]:
        log = episode(5)
        ContextBuilder(tok, compressor="mask-observations", params={"keep_last": 2, **params}, budget=50_000).build(log)
        assert (last_compaction(log) is not None) == fires, params


# ------------------------------------------------------------------------------------------ truncate-tool-output


@pytest.mark.parametrize("keep", ["head", "tail", "head_tail", "middle"])
def test_truncate_text_fits_the_cap_in_real_tokens(tok, keep):
    text = output(1, 200)
    cut = truncate_text(tok, text, 60, keep, "e9")
    assert tok.count(cut) <= 60
    assert "tokens of e9 truncated" in cut
    if keep in ("head", "head_tail"):
        assert text.startswith(cut.split("\n")[0])
    if keep in ("tail", "head_tail"):
        assert text.endswith(cut.split("\n")[-1])
    if keep == "middle":
        assert cut.split("\n")[1] in text and not text.startswith(cut.split("\n")[1])
    assert truncate_text(tok, "short", 60, keep, "e9") is None


def test_truncate_tool_output_golden(tok):
    log = episode(3, words=120)
    ctx = ContextBuilder(tok, compressor="truncate-tool-output",
                         params={"max_tokens": 64, "keep": "head", "trigger": "every_turn"}, budget=50_000).build(log)
    results = ids_of(log, "tool_result")
    tool_msgs = [m for m in ctx.view.messages if m.role == "tool"]
    assert [m.provenance for m in tool_msgs] == [Provenance("truncated", (r,)) for r in results]
    for m, t in zip(tool_msgs, range(3)):
        assert tok.count(m.content) <= 64 and output(t, 120).startswith(m.content.split("\n")[0])
    assert [e.kind for e in last_compaction(log).edits] == ["truncate"] * 3


# ------------------------------------------------------------------------------------------ pipeline


def test_pipeline_composes_in_order(tok):
    log = episode(5, words=120)
    stages = [{"name": "truncate-tool-output", "params": {"max_tokens": 64}},
              {"name": "mask-observations", "params": {"keep_last": 2, "trigger": "every_turn"}}]
    ctx = ContextBuilder(tok, compressor="pipeline", params={"stages": stages}, budget=900).build(log)
    comp = last_compaction(log)
    assert comp.compressor == "pipeline-v1"
    assert [s["compressor"] for s in comp.details["stages"]] == ["truncate-tool-output-v1", "mask-observations-v1"]
    results = ids_of(log, "tool_result")
    assert [(e.kind, e.event_id) for e in comp.edits] == [("truncate", r) for r in results] + [("mask", r) for r in results[:3]]
    assert [m.provenance.how for m in ctx.view.messages if m.role == "tool"] == ["masked"] * 3 + ["truncated"] * 2
    assert ctx.n_tokens <= 900
    orjson.dumps([edit_to_dict(e) for e in comp.edits])  # edits serialize to data


# ------------------------------------------------------------------------------------------ registry and params


def test_registry_lists_every_strategy_with_defaults():
    assert set(COMPRESSORS) == {"keep-all", "window", "mask-observations", "truncate-tool-output", "summarize",
                                "retrieve", "retrieve-v2", "pipeline", "mask-observations-v2", "truncate-tool-output-v2",
                                "summarize-v2", "mask-then-window", "truncate-then-window", "summarize-then-window",
                                "mask-observations-v3", "truncate-tool-output-v3", "mask-then-window-v2",
                                "truncate-then-window-v2"}
    defaults = compressor_defaults()
    assert set(defaults) == set(COMPRESSORS)
    for name, params in defaults.items():
        assert params["trigger"] in ("over_budget", "every_turn"), name
        c = make_compressor(name)
        assert c.spec.name == (name if re.search(r"-v\d+$", name) else f"{name}-v1")
        orjson.dumps(c.spec.to_dict())
    assert defaults["mask-observations"]["keep_last"] == 10


def test_make_compressor_accepts_names_specs_and_dicts():
    a = make_compressor("window", keep_first=1)
    b = make_compressor(CompressorSpec("window-v1", {"keep_first": 1}))
    c = make_compressor({"name": "window", "params": {"keep_first": 1}})
    assert a.spec == b.spec == c.spec
    assert make_compressor(a) is a


def test_unknown_compressor_lists_registered_names():
    with pytest.raises(ConfigError, match=r"unknown compressor 'shrink'; registered compressors: \['keep-all', "):
        make_compressor("shrink")
    with pytest.raises(ConfigError, match=r"compressor 'window-v9': this ctxkit has no version 9 of 'window'; "
                                          r"known versions: \['window-v1'\]"):
        make_compressor("window-v9")
    with pytest.raises(ConfigError, match=r"known versions: \['mask-observations-v1', 'mask-observations-v2', "
                                          r"'mask-observations-v3'\]"):
        make_compressor("mask-observations-v4")


def test_unknown_and_bad_parameters():
    with pytest.raises(ConfigError, match=r"compressor 'window': unknown parameter\(s\) \['keep_lst'\]; accepted "
                                          r"parameters: \['keep_first', 'keep_last', 'target_fraction', 'trigger'"):
        make_compressor("window", keep_lst=3)
    for name, params, what in [
        ("mask-observations", {"keep_last": -1}, "'keep_last' is -1"),
        ("window", {"target_fraction": 0}, "'target_fraction' is 0"),
        ("window", {"trigger": "sometimes"}, "'trigger' is 'sometimes'"),
        ("window", {"trigger": "tokens"}, "needs 'trigger_tokens' > 0"),
        ("truncate-tool-output", {"keep": "both"}, "'keep' is 'both'"),
        ("truncate-tool-output", {"max_tokens": 5}, "'max_tokens' is 5"),
        ("mask-observations", {"placeholder": "{nope}"}, "not a format string"),
        ("keep-all", {"on_overflow": "ignore"}, "'on_overflow' is 'ignore'"),
        ("pipeline", {"stages": []}, "non-empty list"),
        ("pipeline", {"stages": [{"name": "window", "params": {"x": 1}}]}, r"stage 0: compressor 'window': unknown parameter"),
    ]:
        with pytest.raises(ConfigError, match=what):
            make_compressor(name, **params)
