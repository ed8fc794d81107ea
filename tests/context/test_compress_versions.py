"""Compressors do one thing: the v2 strategies have no built-in window fallback, the presets compose them
with `window` as an explicit pipeline and give exactly the views of the v1 strategies (which keep their
un-suffixed names), and the turn-group helpers have one shared home."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO_ROOT, tokenizer_dir
from ctxkit.context.builder import ContextBuilder
from ctxkit.context.compress import COMPRESSORS, compressor_class, compressor_defaults, make_compressor, versioned_name
from ctxkit.errors import BudgetError, ConfigError
from ctxkit.events import Compaction
from ctxkit.log.event_log import MemoryLog
from ctxkit.context.summarizers import CallableSummarizer


def prefixes(messages: list[dict]) -> str:
    """A deterministic summarizer: the first 60 characters of each message."""
    return " ".join((m.get("content") or "")[:60] for m in messages)


def summarizer() -> CallableSummarizer:
    return CallableSummarizer(prefixes, id="prefixes")


@pytest.fixture(scope="module")
def setup():
    from ctxkit.benchmarks.build_bench import episode_events
    from ctxkit.text.template.chat_template import load_template
    from ctxkit.text.tokenizer.loader import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))
    tpl = load_template(None, tok)
    head, per_turn, _ = episode_events(24, tok, tpl)
    return tok, tpl, head, per_turn


def run(setup, name: str, budget: int, **params):
    """Build before every turn; returns (token ids per build, the log), stopping at a BudgetError."""
    tok, tpl, head, per_turn = setup
    builder = ContextBuilder(tok, tpl, name, budget, params=params)
    log = MemoryLog()
    log.extend(head)
    built = []
    for turn in per_turn:
        try:
            built.append(builder.build(log).token_ids)
        except BudgetError as exc:
            built.append(f"BudgetError: {exc}")
            break
        log.extend(turn)
    return built, log


def compactions(log) -> list[Compaction]:
    return [e for e in log.events() if isinstance(e, Compaction)]


@pytest.mark.parametrize("v1, preset, params", [
    ("mask-observations", "mask-then-window", {"keep_last": 3}),
    ("mask-observations", "mask-then-window", {"keep_last": 2, "trigger": "every_turn", "keep_first": 1}),
    ("truncate-tool-output", "truncate-then-window", {"max_tokens": 64}),
    ("summarize", "summarize-then-window", {"keep_last": 2, "max_summary_tokens": 48}),
])
@pytest.mark.parametrize("budget", [1500, 3000])
def test_preset_gives_the_views_of_the_v1_strategy(setup, v1, preset, params, budget):
    if v1 == "summarize":
        params = {**params, "summarizer": summarizer()}
    old, old_log = run(setup, v1, budget, **params)
    new, new_log = run(setup, preset, budget, **params)
    assert len(old) == len(setup[3]) and all(not isinstance(ids, str) for ids in old)
    assert new == old  # token for token, at every turn
    a, b = compactions(old_log), compactions(new_log)
    assert len(a) == len(b) > 0
    assert [c.edits for c in a] == [c.edits for c in b]
    assert {c.compressor for c in a} == {f"{v1}-v1"} and {c.compressor for c in b} == {f"{preset}-v1"}
    stage_names = {s["compressor"] for c in b for s in c.details["stages"]}
    assert f"{v1}-v2" in stage_names and stage_names <= {f"{v1}-v2", "window-v1"}


@pytest.mark.parametrize("name, kind", [
    ("mask-observations-v2", "mask"),
    ("truncate-tool-output-v2", "truncate"),
    ("summarize-v2", "summary"),
])
def test_v2_does_one_thing_and_leaves_the_budget_to_the_builder(setup, name, kind):
    params, budget = {}, 1200
    if kind == "summary":  # the summary is cut to fit; at 700 the newest turn plus the summary no longer do
        params, budget = {"summarizer": summarizer(), "keep_last": 1}, 700
    if kind == "mask":
        params = {"keep_last": 1}
    built, log = run(setup, name, budget, **params)
    edit_kinds = {e.kind for c in compactions(log) for e in c.edits}
    assert edit_kinds == {kind}  # never a drop
    assert isinstance(built[-1], str) and f"over the budget of {budget}" in built[-1] and name in built[-1]
    assert not make_compressor(name, **params).fits_budget
    v1 = name.removesuffix("-v2")
    assert make_compressor(v1, **params).fits_budget and make_compressor(v1, fallback="none", **params).fits_budget is False


def test_v1_with_fallback_none_is_v2_in_all_but_name(setup):
    a, log_a = run(setup, "mask-observations", 1500, keep_last=1, fallback="none")
    b, log_b = run(setup, "mask-observations-v2", 1500, keep_last=1)
    assert a[:-1] == b[:-1] and [c.edits for c in compactions(log_a)] == [c.edits for c in compactions(log_b)]
    assert a[-1] == b[-1].replace("mask-observations-v2", "mask-observations-v1")  # both end over budget


def test_names_and_versions():
    assert {n: compressor_class(n).VERSION for n in COMPRESSORS} == {
        "keep-all": 1, "window": 1, "mask-observations": 1, "mask-observations-v2": 2, "truncate-tool-output": 1,
        "truncate-tool-output-v2": 2, "summarize": 1, "summarize-v2": 2, "retrieve": 1, "retrieve-v2": 2, "pipeline": 1,
        "mask-then-window": 1, "truncate-then-window": 1, "summarize-then-window": 1, "mask-observations-v3": 3,
        "truncate-tool-output-v3": 3, "mask-then-window-v2": 2, "truncate-then-window-v2": 2}
    for name in ("mask-observations", "truncate-tool-output", "summarize"):
        assert compressor_class(f"{name}-v1") is compressor_class(name)
        assert compressor_class(f"{name}-v2").NAME == name
        assert "fallback" in compressor_defaults()[name] and "fallback" not in compressor_defaults()[f"{name}-v2"]
    # every name a log records can be made again
    for name in COMPRESSORS:
        c = make_compressor(name, **({"summarizer": summarizer()} if "summarize" in name else {}))
        assert compressor_class(c.spec.name) is type(c) and versioned_name(name) == c.spec.name
    assert [versioned_name(n) for n in ("window", "mask-observations", "mask-observations-v1", "mask-observations-v2")] == [
        "window-v1", "mask-observations-v1", "mask-observations-v1", "mask-observations-v2"]


def test_v2_and_preset_parameters_are_checked():
    with pytest.raises(ConfigError, match=r"compressor 'mask-observations': unknown parameter\(s\) \['fallback'\]; "
                                          r"accepted parameters: \['keep_last', 'placeholder', 'target_fraction', "):
        make_compressor("mask-observations-v2", fallback="window")
    with pytest.raises(ConfigError, match=r"mask-then-window: mask-observations: parameter 'keep_last' is -1"):
        make_compressor("mask-then-window", keep_last=-1)
    with pytest.raises(ConfigError, match=r"truncate-then-window: window: parameter 'keep_first' is -2"):
        make_compressor("truncate-then-window", keep_first=-2)
    with pytest.raises(ConfigError, match=r"compressor 'summarize-then-window': unknown parameter\(s\) \['fallback'\]"):
        make_compressor("summarize-then-window", fallback="none")


def test_preset_spec_is_flat_and_records_a_summarizer_by_id():
    spec = make_compressor("mask-then-window", keep_last=3).spec
    assert spec.name == "mask-then-window-v1"
    assert spec.params == {"trigger": "over_budget", "trigger_tokens": 0, "trigger_fraction": 0.8, "keep_last": 3,
                           "placeholder": "[tool output {event_id} masked: {n_tokens} tokens]", "keep_first": 2,
                           "target_fraction": 0.75}
    assert make_compressor(spec.to_dict()).spec == spec
    s = make_compressor("summarize-then-window", summarizer=summarizer())
    assert s.spec.params["summarizer"] == "prefixes" and s.stages[0].summarizer.id == "prefixes"


def test_turn_helpers_have_one_home():
    """No compressor imports window.py's module for its helpers: they live in compress/turns.py."""
    folder = REPO_ROOT / "ctxkit" / "context" / "compress"
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "ctxkit.context.compress.window", f"{path.name} imports from window.py"
    users = [p.name for p in sorted(folder.glob("*.py")) if "from ctxkit.context.compress.turns import" in Path(p).read_text()]
    assert users == ["mask_observations.py", "retrieve.py", "sized_in_context.py", "summarize.py", "truncate_tool_output.py",
                     "window.py", "with_window_fallback.py"]
