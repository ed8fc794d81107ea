"""ContextBuilder and rebuild on real logs (EventLog in a temp dir, Qwen2.5 tokenizer and template)."""

from __future__ import annotations

import pytest

from conftest import READ_TOOLS, tokenizer_dir
from ctxkit.context.builder import BuiltContext, ContextBuilder, rebuild
from ctxkit.edits import DropEdit
from ctxkit.errors import BudgetError, ConfigError, InvariantError, MessageFormatError, PinViolationError, ReplayError
from ctxkit.events import Compaction, EpisodeStart, Message, Pin, Step, ToolCall, ToolResult, Unpin
from ctxkit.log.event_log import EventLog, MemoryLog
from ctxkit.text.rendering.renderer import encode_assistant_turn, render

TOOLS = READ_TOOLS
CONSTRAINT = "Do not modify the original file."


@pytest.fixture(scope="module")
def tpl(tok):
    from ctxkit.text.template.chat_template import load_template

    return load_template(None, tok)


def start(log, builder=None):
    log.extend([EpisodeStart(episode_id="b", tools=TOOLS, context=builder.describe() if builder else {}),
                Message(role="system", content="You are a careful agent."),
                Message(role="user", content=f"Fix the parser. {CONSTRAINT} Report when done.")])


def step(log, tok, tpl, t: int, ctx=None, words: int = 80):
    call = ToolCall(f"c{t}", "read", f'{{"path": "f{t}.py"}}')
    msg = {"role": "assistant", "content": f"Reading {t}.", "tool_calls": [call.to_openai()]}
    ids = encode_assistant_turn(msg, tok, tpl, list(TOOLS))
    log.append(Step(context_hash=ctx.hash if ctx else "", token_ids=ids, content=msg["content"], tool_calls=(call,)))
    log.append(ToolResult(tool_call_id=call.id, name="read", content=" ".join(f"line{t}_{i} text" for i in range(words))))
    return ids


def test_build_records_pins_and_compactions_and_rebuild_is_exact(tmp_path, tok, tpl):
    builder = ContextBuilder(tok, compressor="mask-observations", params={"keep_last": 2}, budget=1500)
    log = EventLog.create(tmp_path / "ep.jsonl")
    start(log, builder)
    built: list[tuple[int, BuiltContext]] = []
    sampled: list[tuple[int, ...]] = []
    for t in range(10):
        ctx = builder.build(log)
        built.append((len(log.events()) - 1, ctx))
        sampled.append(step(log, tok, tpl, t, ctx))
    log.close()
    events = EventLog.open(tmp_path / "ep.jsonl").events()
    pins = [e for e in events if isinstance(e, Pin)]
    assert [(p.text, p.rule, p.source_event_id) for p in pins] == [
        (CONSTRAINT, "constraint-rules-v2:prohibition", events[2].id)]
    assert events[3].kind == "pin"  # recorded at the first build, before the first step
    comps = [e for e in events if isinstance(e, Compaction)]
    assert comps and all(c.compressor == "mask-observations-v1" for c in comps)
    assert built[0][1].compactions == (pins[0].id,)
    for upto, ctx in built:
        assert ctx.n_tokens <= 1500 and len(ctx.loss_mask) == ctx.n_tokens
        assert ctx.pins_checked == (pins[0].pin_id,)
        assert ctx.ref == ctx.hash == ctx.rendered.hash
        again = rebuild(events, tokenizer=str(tokenizer_dir("qwen2.5-instruct")), upto_seq=upto)
        assert again.token_ids == ctx.token_ids and again.hash == ctx.hash and again.view.hash == ctx.view.hash
        assert again.compactions == () and again.budget == 1500
        # incremental rendering gives exactly what a fresh full render gives
        fresh = render(ctx.view.chat(), tok, tpl, tools=list(ctx.view.tools), add_generation_prompt=True)
        assert fresh.token_ids == ctx.token_ids
    # sampled ids of verbatim steps are in the context with loss 1, everything else 0
    last = built[-1][1]
    verbatim_steps = [m.token_ids for m in last.view.messages if m.role == "assistant" and m.token_ids]
    assert sum(last.loss_mask) == sum(len(ids) for ids in verbatim_steps)
    assert verbatim_steps and all(ids in sampled for ids in verbatim_steps)


def test_provenance_per_token(tok):
    log = MemoryLog()
    start(log)
    b = ContextBuilder(tok, compressor="mask-observations", params={"keep_last": 1, "trigger": "every_turn"}, budget=8000)
    for t in range(3):
        log.extend([Step(content=f"r{t}", tool_calls=(ToolCall(f"c{t}", "read", "{}"),)),
                    ToolResult(tool_call_id=f"c{t}", content=f"out {t} " * 30)])
    ctx = b.build(log)
    prov = ctx.provenance
    assert len(prov) == ctx.n_tokens
    for span in ctx.rendered.spans:
        msg = ctx.view.messages[span.index]
        assert all(p == (span.index, msg.provenance) for p in prov[span.start:span.end])
    masked_tokens = [i for i, (_, p) in enumerate(prov) if p is not None and p.how == "masked"]
    assert masked_tokens and "masked" in tok.decode([ctx.token_ids[i] for i in masked_tokens])
    assert prov[-1] == (-1, None)  # the generation prompt belongs to no message


def test_describe_round_trip(tok):
    b = ContextBuilder(str(tokenizer_dir("qwen2.5-instruct")), compressor="window", params={"keep_first": 1},
                       budget=4000, reserve_tokens=500)
    d = b.describe()
    assert d["compressor"] == {"name": "window-v1", "params": b.compressor.spec.params}
    assert d["budget"] == 4000 and d["reserve_tokens"] == 500 and d["pin_rules"] == "constraint-rules-v2"
    assert d["tokenizer"]["id"] == tok.id and d["template"]["spec"] is None
    again = ContextBuilder.from_description(d)
    assert again.describe() == d and again.effective_budget == 3500
    bad = {**d, "tokenizer": {**d["tokenizer"], "id": "qwen@sha256:0000"}}
    with pytest.raises(ReplayError, match="recorded tokenizer id"):
        ContextBuilder.from_description(bad)


def test_a_recorded_v1_rule_set_resumes_with_v1(tok):
    """Logs recorded before v2 say `pin_rules: constraint-rules-v1`: a builder resumed from that keeps v1,
    and a builder can name either registered detector; an unknown name is refused."""
    d = ContextBuilder(tok, detect_pins="constraint-rules-v1").describe()
    assert d["pin_rules"] == "constraint-rules-v1"
    assert ContextBuilder.from_description(d).pin_rules == "constraint-rules-v1"
    assert ContextBuilder.from_description({**d, "pin_rules": None}).detect_pins is False
    with pytest.raises(ConfigError, match="constraint-rules-v9"):
        ContextBuilder(tok, detect_pins="constraint-rules-v9")


def test_budget_smaller_than_pinned_prefix_names_sizes(tok):
    log = MemoryLog()
    start(log)
    log.append(Pin(pin_id="long", text="Never do the following things: " + "x " * 300, rule="explicit"))
    with pytest.raises(BudgetError, match=r"pinned constraints \(2 pins, \d+ tokens of text\) plus the fixed prefix "
                                          r"\(system messages, tools, generation prompt\) take \d+ tokens, over the budget of 300"):
        ContextBuilder(tok, compressor="window", budget=300).build(log)


def test_reserve_tokens_shrinks_the_budget(tok):
    log = MemoryLog()
    start(log)
    for t in range(6):
        log.extend([Step(content="", tool_calls=(ToolCall(f"c{t}", "read", "{}"),)),
                    ToolResult(tool_call_id=f"c{t}", content="data " * 100)])
    ctx = ContextBuilder(tok, compressor="window", budget=1000, reserve_tokens=400).build(log)
    assert ctx.n_tokens <= 600 and ctx.budget == 600
    with pytest.raises(ConfigError, match="reserve_tokens"):
        ContextBuilder(tok, budget=1000, reserve_tokens=1000)
    with pytest.raises(ConfigError, match="budget is -5"):
        ContextBuilder(tok, budget=-5)


def test_orphaned_tool_result_in_log(tok):
    log = MemoryLog()
    start(log)
    recorded = log.append(ToolResult(tool_call_id="ghost", content="x"))
    with pytest.raises(MessageFormatError, match=rf"event {recorded.id} \(seq 3, tool_result\).*'ghost'.*orphaned"):
        ContextBuilder(tok, budget=4000).build(log)


def test_unanswered_tool_call_is_an_invariant_error(tok):
    log = MemoryLog()
    start(log)
    s = log.append(Step(content="", tool_calls=(ToolCall("c1", "read", "{}"),)))
    ctx = ContextBuilder(tok, budget=4000).build(log)  # trailing: pending, legal
    assert ctx.view.messages[-1].tool_calls[0].id == "c1"
    u = log.append(Message(role="user", content="go on"))
    with pytest.raises(InvariantError, match=rf"tool call 'c1' of {s.id} has no result before the next message "
                                             rf"{u.id} \(unanswered call\)") as err:
        ContextBuilder(tok, budget=4000).build(log)
    assert (err.value.problem, err.value.event, err.value.call_id) == ("unanswered_call", s.id, "c1")


def test_explicit_pin_unpin_and_pinned_block(tok):
    log = MemoryLog()
    start(log)
    log.append(Pin(pin_id="fr", text="Answer in French.", rule="explicit"))
    b = ContextBuilder(tok, budget=4000, detect_pins=False)
    ctx = b.build(log)
    assert ctx.view.messages[1].content == "Pinned constraints:\n- Answer in French."
    assert ctx.pins_checked == ("fr",) and "Answer in French." in tok.decode(ctx.token_ids)
    log.append(Unpin(pin_id="fr", reason="lifted"))
    ctx = b.build(log)
    assert ctx.pins_checked == () and all(m.provenance.how != "pinned" for m in ctx.view.messages)


def write_template_hiding_late_system(folder):
    """A real template file that renders only the first system message (a later one, the pinned block,
    never reaches the context)."""
    path = folder / "drops-late-system.jinja"
    path.write_text(
        "{%- for m in messages -%}{%- if m.role != 'system' or loop.first -%}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
    )
    return path


def test_a_template_that_hides_the_pinned_block_fails_the_pin_check(tmp_path, tok):
    # a real template that renders only the first system message, so the pinned block (a later system
    # message) never reaches the context: the build must fail, not silently drop the constraint
    path = write_template_hiding_late_system(tmp_path)
    log = MemoryLog()
    log.extend([Message(role="system", content="s"), Message(role="user", content="hi"),
                Pin(pin_id="p", text="Never share secrets.", rule="explicit")])
    with pytest.raises(PinViolationError, match=r"pin p .*'Never share secrets.'"):
        ContextBuilder(tok, template=str(path), budget=4000).build(log)


def test_a_kept_pin_check_cache_gives_the_uncached_answers(tmp_path, tok, tpl):
    # the cache keeps decoded spans by their ids and pin texts by message object: a render that no longer
    # shows a pin (the same view, a template that hides the pinned block) must fail although the cache saw
    # the pin verbatim in the first render
    from ctxkit.context.builder import PinCheckCache, check_pins
    from ctxkit.context.render_cache import RenderCache
    from ctxkit.text.template.chat_template import load_template
    from ctxkit.context.view import build_view

    path = write_template_hiding_late_system(tmp_path)
    log = MemoryLog()
    log.extend([Message(role="system", content="Be brief. Do not guess."), Message(role="user", content="hi"),
                Pin(pin_id="p", text="Never share secrets.", rule="explicit"),
                Pin(pin_id="q", text="Do not guess.", rule="explicit")])
    view = build_view(log)
    cache = PinCheckCache()
    good = RenderCache(tok, tpl).render(view)
    for _ in range(2):
        assert check_pins(view, good, tok, cache) == check_pins(view, good, tok) == ("p", "q")
    assert len(cache.decoded) == 2 and set(cache.holds.values()) >= {(view.messages[0], True)}
    hidden = RenderCache(tok, load_template(str(path), tok)).render(view)
    with pytest.raises(PinViolationError, match=r"pin p .*'Never share secrets.'"):
        check_pins(view, hidden, tok, cache)


def test_two_builders_on_the_same_log_agree_and_a_new_log_resets_state(tok):
    logs = [MemoryLog(), MemoryLog()]
    for log in logs:
        start(log)
    a, b = ContextBuilder(tok, compressor="window", budget=900), ContextBuilder(tok, compressor="window", budget=900)
    for t in range(8):
        ca, cb = a.build(logs[0]), b.build(logs[1])
        assert ca.token_ids == cb.token_ids
        for log in logs:
            log.extend([Step(content="", tool_calls=(ToolCall(f"c{t}", "read", "{}"),)),
                        ToolResult(tool_call_id=f"c{t}", content="data " * 60)])
    fresh = MemoryLog()
    start(fresh)
    assert a.build(fresh).token_ids == ContextBuilder(tok, compressor="window", budget=900).build(MemoryLog(fresh.events())).token_ids


def test_keep_all_truncation_is_reproduced_by_rebuild(tok):
    log = MemoryLog()
    start(log)
    for t in range(4):
        log.extend([Step(content="", tool_calls=(ToolCall(f"c{t}", "read", "{}"),)),
                    ToolResult(tool_call_id=f"c{t}", content="data " * 100)])
    ctx = ContextBuilder(tok, params={"on_overflow": "truncate"}, budget=300).build(log)
    again = rebuild(log, tokenizer=tok, budget=300)
    assert ctx.truncated and again.truncated and again.token_ids == ctx.token_ids


def test_a_failed_build_records_no_compaction(tok):
    from ctxkit.context.compress.base import BaseCompressor

    class DropsACall(BaseCompressor):
        """Broken on purpose: drops the first assistant call but keeps its result."""

        NAME = "drops-a-call"
        DEFAULTS: dict = {}

        def propose(self, request, n_tokens):
            first = next(m for m in request.view.messages if m.tool_calls)
            return [DropEdit(first.provenance.event_ids)], {}

    log = MemoryLog()
    start(log)
    log.extend([Step(content="", tool_calls=(ToolCall("c0", "read", "{}"),)), ToolResult(tool_call_id="c0", content="x")])
    n = len(log)
    with pytest.raises(InvariantError, match="answers call 'c0' with no matching call"):
        ContextBuilder(tok, compressor=DropsACall(trigger="every_turn"), budget=4000).build(log)
    assert [e.kind for e in log.events()[n:]] == ["pin"]  # the detection is kept, the bad decision is not
    with pytest.raises(InvariantError, match="proposed invalid edits"):
        class BadOp(DropsACall):
            NAME = "bad-op"

            def propose(self, request, n_tokens):
                return [{"op": "mask", "event_id": "nope", "text": "x"}], {}

        ContextBuilder(tok, compressor=BadOp(trigger="every_turn"), budget=4000).build(log)

    class UnknownKind(DropsACall):
        NAME = "unknown-kind"

        def propose(self, request, n_tokens):
            return [{"op": "squash", "event_ids": ["e1"]}], {}

    with pytest.raises(InvariantError, match=r"compressor unknown-kind-v1 proposed invalid edits: .*"
                                             r"unknown edit kind \(op\) 'squash'; known kinds: \['drop', "):
        ContextBuilder(tok, compressor=UnknownKind(trigger="every_turn"), budget=4000).build(log)
    assert [e.kind for e in log.events()[n:]] == ["pin"]


def test_build_needs_a_log(tok):
    with pytest.raises(ConfigError, match="needs an EventLog or MemoryLog"):
        ContextBuilder(tok, budget=4000).build([Message(role="user", content="hi")])
