"""The `summarize` compressor in a real ContextBuilder over real logs (Qwen2.5 tokenizer and template)."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import require_module, tokenizer_dir
from ctxkit.context.builder import ContextBuilder, rebuild
from ctxkit.context.compress import compressor_defaults, make_compressor
from ctxkit.context.compress.summarize import SUMMARY_HEADER, cut_to_tokens
from ctxkit.context.compress.with_window_fallback import SummarizeV1
from ctxkit.edits import SummaryEdit
from ctxkit.errors import BudgetError, ConfigError
from ctxkit.events import Compaction, EpisodeStart, Message, ToolCall, ToolResult
from ctxkit.log.event_log import EventLog
from ctxkit.context.summarizers import CallableSummarizer
from ctxkit.context.view import build_view, find_orphans

TOOLS = ({"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},)
WORDS = "parser token buffer index value return error state module config field record stream offset cache".split()


@pytest.fixture(scope="module")
def qwen():
    from ctxkit.text.tokenizer.loader import load_tokenizer

    return load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))


def _output(t: int, n_words: int = 60) -> str:
    return " ".join(f"{WORDS[(t + 3 * i) % len(WORDS)]}{(t * 7 + i) % 89}" for i in range(n_words))


def start(log, task: str = "Fix the parser. Do not modify the original file.") -> None:
    log.extend([EpisodeStart(episode_id="ep-sum", tools=TOOLS), Message(role="system", content="You are a careful agent."),
                Message(role="user", content=task)])


def turn(log, t: int, n_words: int = 60, follow_up: str | None = None) -> None:
    call = ToolCall(id=f"call_{t}", name="read_file", arguments=f'{{"path": "src/f{t}.py"}}')
    events = [Message(role="assistant", content=f"Reading file {t}.", tool_calls=(call,)),
              ToolResult(tool_call_id=call.id, name="read_file", content=_output(t, n_words))]
    if follow_up:
        events.append(Message(role="user", content=follow_up))
    log.extend(events)


def chat_groups(events) -> list[list[str]]:
    """Event-id groups of the chat events, as the view groups them (assistant + its tool results)."""
    groups: list[list[str]] = []
    for e in events:
        if isinstance(e, ToolResult):
            groups[-1].append(e.id)
        elif isinstance(e, Message):
            groups.append([e.id])
    return groups


def compactions(log) -> list[Compaction]:
    return [e for e in log.events() if isinstance(e, Compaction)]


class Recorder:
    """A summarizer function that records its inputs (a real callable summarizer, not a mock)."""

    def __init__(self):
        self.inputs: list[list[dict]] = []

    def __call__(self, messages):
        self.inputs.append(messages)
        return f"{len(messages)} messages, roles {','.join(m['role'][0] for m in messages)}"


def test_defaults_and_parameter_errors():
    defaults = compressor_defaults()["summarize"]
    assert defaults["summarizer"] == "extractive" and defaults["keep_last"] == 4 and defaults["keep_first"] == 2
    assert SummarizeV1.VERSION == 1 and make_compressor("summarize").spec.name == "summarize-v1"
    assert make_compressor("summarize-v2").spec.name == "summarize-v2" and "fallback" not in compressor_defaults()["summarize-v2"]
    with pytest.raises(ConfigError, match="'fallback' is 'drop'"):
        SummarizeV1(fallback="drop")
    with pytest.raises(ConfigError, match=r"'summarizer' is 'gpt'; registered summarizers: \['extractive', 'lm'\]"):
        SummarizeV1(summarizer="gpt")
    with pytest.raises(ConfigError, match=r"summarize: summarizer 'extractive': unknown parameter\(s\) \['beams'\]"):
        SummarizeV1(summarizer_params={"beams": 2})
    with pytest.raises(ConfigError, match="'keep_last' is 0"):
        SummarizeV1(keep_last=0)
    with pytest.raises(ConfigError, match="'role' is 'tool'"):
        SummarizeV1(role="tool")
    with pytest.raises(ConfigError, match="'max_summary_tokens' is 4"):
        SummarizeV1(max_summary_tokens=4)
    with pytest.raises(ConfigError, match="expected one of"):
        SummarizeV1(summarizer=42)
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) \['keep_lats'\]"):
        make_compressor("summarize", keep_lats=3)
    custom = SummarizeV1(summarizer=CallableSummarizer(str, id="str-v"))
    assert custom.spec.params["summarizer"] == "str-v"
    with pytest.raises(ConfigError, match="cannot be given with a summarizer instance"):
        SummarizeV1(summarizer=CallableSummarizer(str, id="x"), summarizer_params={"n_sentences": 1})


def test_summary_covers_the_middle_and_replays_without_the_summarizer(qwen, tmp_path):
    rec = Recorder()
    comp = SummarizeV1(summarizer=CallableSummarizer(rec, id="recorder", version=2), keep_last=2)
    builder = ContextBuilder(qwen, compressor=comp, budget=700)
    log = EventLog.create(tmp_path / "ep.jsonl")
    start(log)
    t = 0
    while not compactions(log):
        turn(log, t)
        t += 1
        ctx = builder.build(log)
        assert t < 20
    (c,) = compactions(log)
    # Expected coverage from the log alone: chat events after the first two messages and before the
    # newest two groups (an assistant call with its result is one group).
    groups = chat_groups(log.events()[: c.seq])
    expected = [i for g in groups[2:-2] for i in g]
    body = f"{len(expected)} messages, roles " + ",".join("at" * (len(expected) // 2))
    assert c.compressor == "summarize-v1"
    assert c.edits == (SummaryEdit(tuple(expected), f"{SUMMARY_HEADER}\n{body}", "user"),)
    assert c.details["summarizer"] == {"id": "recorder", "version": 2}
    assert c.details["covered_messages"] == len(expected) and c.details["kept_last_groups"] == 2
    assert c.details["tokens_before"] > 700 >= c.details["tokens_after"] == ctx.n_tokens
    assert c.details["summary_tokens"] == qwen.count(f"{SUMMARY_HEADER}\n{body}")
    assert len(rec.inputs) == 1 and [m["role"] for m in rec.inputs[0]] == ["assistant", "tool"] * (len(expected) // 2)
    assert rec.inputs[0][1]["content"] == _output(0)
    # The view: system, task, the summary, the two newest groups; nothing orphaned.
    hows = [(m.role, m.provenance.how) for m in ctx.view.messages]
    assert hows == [("system", "verbatim"), ("user", "verbatim"), ("user", "summary"),
                    ("assistant", "verbatim"), ("tool", "verbatim"), ("assistant", "verbatim"), ("tool", "verbatim")]
    assert not find_orphans(ctx.view.messages)
    # Replay from the saved file never runs the summarizer.
    reopened = EventLog.open(tmp_path / "ep.jsonl")
    assert build_view(reopened).hash == ctx.view.hash
    assert rebuild(reopened.events(), tokenizer=qwen).token_ids == ctx.token_ids
    assert len(rec.inputs) == 1
    # Building again with nothing new records nothing and calls nothing.
    n = len(log)
    assert builder.build(log).token_ids == ctx.token_ids and len(log) == n and len(rec.inputs) == 1


def test_later_summaries_fold_in_the_earlier_one(qwen):
    from ctxkit.log.event_log import MemoryLog

    rec = Recorder()
    builder = ContextBuilder(qwen, compressor=SummarizeV1(summarizer=CallableSummarizer(rec, id="rec"), keep_last=2), budget=700)
    log = MemoryLog()
    start(log)
    t = 0
    while len(compactions(log)) < 2:
        turn(log, t)
        t += 1
        ctx = builder.build(log)
        assert not find_orphans(ctx.view.messages) and ctx.n_tokens <= 700
        assert sum(m.provenance.how == "summary" for m in ctx.view.messages) <= 1
        assert t < 40
    first, second = compactions(log)
    assert set(first.edits[0].event_ids) < set(second.edits[0].event_ids)
    first_body = first.edits[0].text.split("\n", 1)[1]
    assert rec.inputs[-1][0] == {"role": "user", "content": first_body}  # header stripped
    assert rec.inputs[-1][1]["role"] == "assistant"
    assert rebuild(log.events(), tokenizer=qwen).token_ids == ctx.token_ids


def test_pinned_constraint_survives_being_summarized(qwen):
    from ctxkit.log.event_log import MemoryLog

    constraint = "Never delete anything in the data folder."
    builder = ContextBuilder(qwen, compressor=SummarizeV1(summarizer=CallableSummarizer(lambda m: "work happened", id="fixed"),
                                                        keep_last=1), budget=600)
    log = MemoryLog()
    start(log, task="Clean up the repository.")
    turn(log, 0, follow_up=constraint)  # the constraint lives in a message that will be summarized
    for t in range(1, 8):
        turn(log, t)
        ctx = builder.build(log)
    assert compactions(log)
    covered = {i for c in compactions(log) for e in c.edits for i in getattr(e, "event_ids", ())}
    source = next(e for e in log.events() if isinstance(e, Message) and e.content == constraint)
    assert source.id in covered
    assert constraint in qwen.decode(ctx.token_ids)
    pinned = [m for m in ctx.view.messages if m.provenance.how == "pinned"]
    assert len(pinned) == 1 and constraint in pinned[0].content


def test_long_summaries_are_cut_and_tight_budgets_still_fit(qwen):
    from ctxkit.log.event_log import MemoryLog

    long_text = " ".join(f"fact{i}." for i in range(2000))
    comp = SummarizeV1(summarizer=CallableSummarizer(lambda m: long_text, id="long"), keep_last=3, max_summary_tokens=64)
    builder = ContextBuilder(qwen, compressor=comp, budget=420)
    log = MemoryLog()
    start(log)
    for t in range(8):
        turn(log, t)
        ctx = builder.build(log)
        assert ctx.n_tokens <= 420 and not find_orphans(ctx.view.messages)
    cs = compactions(log)
    assert cs
    for c in cs:
        summary = [e for e in c.edits if isinstance(e, SummaryEdit)]
        if summary:
            assert qwen.count(summary[0].text.split("\n", 1)[1]) <= 64
        assert c.details["tokens_after"] <= 420
    # At this budget a 60-word output leaves room for one kept group only.
    assert {c.details["kept_last_groups"] for c in cs if "kept_last_groups" in c.details} <= {1, 2}
    assert rebuild(log.events(), tokenizer=qwen).token_ids == ctx.token_ids


def test_budget_below_prefix_and_newest_turn_is_a_budget_error(qwen):
    from ctxkit.log.event_log import MemoryLog

    builder = ContextBuilder(qwen, compressor=SummarizeV1(summarizer=CallableSummarizer(lambda m: "s", id="s")), budget=150,
                             detect_pins=False)
    log = MemoryLog()
    start(log)
    for t in range(3):
        turn(log, t, n_words=120)
    with pytest.raises(BudgetError, match="150"):
        builder.build(log)


def test_every_turn_trigger_records_nothing_when_nothing_is_new(qwen):
    from ctxkit.log.event_log import MemoryLog

    rec = Recorder()
    builder = ContextBuilder(qwen, compressor=SummarizeV1(summarizer=CallableSummarizer(rec, id="rec"), keep_last=1,
                                                        trigger="every_turn"), budget=4000)
    log = MemoryLog()
    start(log)
    for t in range(3):
        turn(log, t)
    ctx = builder.build(log)  # fits, but every_turn summarizes all but the newest group
    (c,) = compactions(log)
    assert c.details["tokens_before"] <= 4000 and len(c.edits[0].event_ids) == 4
    n = len(log)
    assert builder.build(log).token_ids == ctx.token_ids and len(log) == n and len(rec.inputs) == 1


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=string.printable + "éü中文😀", max_size=300), limit=st.integers(min_value=1, max_value=60))
def test_cut_to_tokens_property(qwen, text, limit):
    out = cut_to_tokens(qwen, text, limit)
    assert qwen.count(out) <= limit
    if qwen.count(text) <= limit:
        assert out == text
    else:
        assert text.startswith(out.removesuffix(" [..]"))


@pytest.mark.slow
def test_default_extractive_summarizer_end_to_end(qwen):
    require_module("sentence_transformers")
    from ctxkit.context.compressor_check import check_compressor

    report = check_compressor("summarize", tokenizer=qwen, budgets=(1024,), max_examples=2)
    assert report.builds > 0 and report.compactions > 0 and report.max_tokens[1024] <= 1024


@pytest.mark.slow
def test_lm_summarizer_end_to_end_with_real_smollm2(qwen):
    require_module("gguf")
    from ctxkit.log.event_log import MemoryLog

    comp = make_compressor("summarize", summarizer="lm", summarizer_params={"max_new_tokens": 24}, keep_last=1)
    builder = ContextBuilder(qwen, compressor=comp, budget=420)
    log = MemoryLog()
    start(log)
    for t in range(4):
        turn(log, t)
    ctx = builder.build(log)
    (c,) = compactions(log)
    assert c.details["summarizer"]["id"].startswith("lm:SmolLM2-135M-Instruct.Q4_1@sha256:")
    text = c.edits[0].text
    assert text.startswith(SUMMARY_HEADER + "\n") and len(text) > len(SUMMARY_HEADER) + 1
    assert text in qwen.decode(ctx.token_ids)
    assert rebuild(log.events(), tokenizer=qwen).token_ids == ctx.token_ids


class ReturnsNothing:
    """A summarizer object that breaks the protocol's return type."""

    id = "returns-nothing"
    version = 1

    def summarize(self, messages):
        return None


def test_a_summarizer_returning_a_non_string_is_a_typed_error(qwen):
    from ctxkit.log.event_log import MemoryLog
    from ctxkit.context.summarizers import SummarizerError

    builder = ContextBuilder(qwen, compressor=SummarizeV1(summarizer=ReturnsNothing(), keep_last=1), budget=400)
    log = MemoryLog()
    start(log)
    for t in range(4):
        turn(log, t)
    with pytest.raises(SummarizerError, match="'returns-nothing' returned NoneType, not a string"):
        builder.build(log)
