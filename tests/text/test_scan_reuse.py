"""Scans before the main loop resumed from an earlier render (`ctxkit.text.template.scan_reuse`): which loops the
syntax-tree check accepts and why it refuses the others, how many iterations a resumed scan runs, and renders
equal to the plain template's over random appends, cuts, new user queries and prompt flags."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import tokenizer_dir
from ctxkit.text.rendering.renderer import IncrementalRenderer
from ctxkit.text.template import iteration_reuse
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.template.iteration_reuse import reuse_plan
from ctxkit.text.tokenizer.loader import load_tokenizer
from render_cases import role_batch

MAIN = ("{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
        "{% if loop.index0 > ns.last %}+{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
FORWARD_SCAN = ("{% for m in messages %}{% if m.role == 'user' and not m.content.startswith('#') %}"
                "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}")
REVERSE_SCAN = ("{% for m in messages[::-1] %}{% set index = (messages|length - 1) - loop.index0 %}"
                "{% if ns.looking and m.role == 'user' and not m.content.startswith('#') %}"
                "{% set ns.looking = false %}{% set ns.last = index %}{% endif %}{% endfor %}")
FORWARD = "{% set ns = namespace(last=-1) %}" + FORWARD_SCAN + MAIN
"""Nemotron 3's shape: the last user message (one whose text starts with `#` does not count) found walking forward."""
REVERSE = "{% set ns = namespace(looking=true, last=messages|length - 1) %}" + REVERSE_SCAN + MAIN
"""Qwen3's shape: walking `messages[::-1]` until the first such message, a flag cleared there."""
NS = "{% set ns = namespace(looking=true, last=-1) %}"
TEXT = ("{% set count = namespace(n=0) %}{% macro text(c, counting, system=false) %}{% if c is string %}{{ c }}"
        "{% else %}{% for item in c %}{% if system %}{{ raise_exception('no images') }}{% endif %}"
        "{% if counting %}{% set count.n = count.n + 1 %}{% endif %}{% if numbered %}Picture {{ count.n }}: {% endif %}"
        "<img>{% endfor %}{% endif %}{% endmacro %}")
"""Qwen 3.5's content macro: it counts images in a namespace only when told to (`counting`)."""
MACRO_SCAN = ("{% for m in messages[::-1] %}{% set index = (messages|length - 1) - loop.index0 %}"
              "{% if ns.looking and m.role == 'user' %}{% set t = text(m.content, false)|trim %}"
              "{% if not t.startswith('#') %}{% set ns.looking = false %}{% set ns.last = index %}{% endif %}"
              "{% endif %}{% endfor %}")
MACRO_MAIN = MAIN.replace("{{ message.content }}", "{{ text(message.content, true) }}")
MACRO = TEXT + "{% set ns = namespace(looking=true, last=messages|length - 1) %}" + MACRO_SCAN + MACRO_MAIN
"""Qwen 3.5's shape: the backward walk calls the macro without counting; the main loop counts."""


@pytest.mark.parametrize("source,shapes", [
    (FORWARD, [(False, None)]),
    (REVERSE, [(True, ("ns", "looking"))]),
    # a counter: every match adds to it, so the iterations before the last match are not idle
    (NS + "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = ns.last + 1 %}{% endif %}{% endfor %}"
     + MAIN, []),
    # two blocks write under different tests: no single last match
    (NS + "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}"
     "{% if m.role == 'tool' %}{% set ns.looking = false %}{% endif %}{% endfor %}" + MAIN, []),
    # the test reads a neighbour, the position, or the clock
    (NS + "{% for m in messages %}{% if m.role == 'user' and messages[loop.index0 - 1].role == 'system' %}"
     "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}" + MAIN, []),
    (NS + "{% for m in messages %}{% if m.role == 'user' and loop.index0 > 2 %}{% set ns.last = loop.index0 %}"
     "{% endif %}{% endfor %}" + MAIN, []),
    (NS + "{% for m in messages %}{% if m.content == strftime_now('%d') %}{% set ns.last = loop.index0 %}"
     "{% endif %}{% endfor %}" + MAIN, []),
    (NS + "{% for m in messages %}{% set prev = messages[loop.index0 - 1] %}{% if prev.role == 'user' %}"
     "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}" + MAIN, []),
    # backwards without a flag: the last write is the earliest match, not the latest
    (NS + "{% for m in messages[::-1] %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}"
     "{% endfor %}" + MAIN, []),
    # a flag the match never clears, one that starts false, one made twice, and a second `if` beside the flag's
    (NS + REVERSE_SCAN.replace("{% set ns.looking = false %}", "") + MAIN, []),
    ("{% set ns = namespace(looking=false, last=-1) %}" + REVERSE_SCAN + MAIN, []),
    (NS + "{% if x %}{% set ns = namespace(looking=true, last=0) %}{% endif %}" + REVERSE_SCAN + MAIN, []),
    (NS + REVERSE_SCAN.replace("{% endif %}{% endfor %}", "{% endif %}{% if m.role == 'x' %}{% set q = 1 %}"
                               "{% endif %}{% endfor %}") + MAIN, []),
])
def test_scans_accepted_and_refused(source, shapes):
    """The check accepts the two shapes of the module docstring and refuses loops whose iterations before the
    last match do something, whose test reads more than the message, or whose flag may not hold at the start."""
    plan = reuse_plan(source)
    assert plan.ok, plan.reason
    assert [(s.reverse, s.flag) for s in plan.scans] == shapes


@pytest.mark.parametrize("source,accepted", [
    (MACRO, True),
    # the scan counts, a call before the scan counts, the macro reads the prompt flag (it differs between
    # renders) or the clock
    (MACRO.replace("text(m.content, false)", "text(m.content, true)"), False),
    (MACRO.replace("{% set ns = namespace(", "{{ text(messages[0].content, true) }}{% set ns = namespace("), False),
    (MACRO.replace("{% if numbered %}", "{% if add_generation_prompt %}"), False),
    (MACRO.replace("<img>", "<img>{{ strftime_now('%d') }}"), False),
    # the macro sets its argument again before the branch; the namespace it reads is written outside a macro
    # before the scan
    (MACRO.replace("{% for item in c %}", "{% set counting = true %}{% for item in c %}"), False),
    (MACRO.replace("{% set ns = namespace(", "{% set count.n = 2 %}{% set ns = namespace("), False),
])
def test_a_macro_the_scan_calls_is_judged_as_called(source, accepted):
    """A macro that writes a namespace in a branch its argument decides is pure where the call passes that
    argument as a false constant, if nothing that can run before the scan ends takes that branch; the
    variables it reads must be ones every render gets alike (never set by the template: `numbered` here), and
    it may call nothing but `raise_exception`."""
    plan = reuse_plan(source)
    assert plan.ok, plan.reason
    assert [(s.reverse, s.flag) for s in plan.scans] == ([(True, ("ns", "looking"))] if accepted else [])


def test_shipped_templates_with_scans():
    """Which stock templates get resumed scans (Qwen 3.5 / 3.6 / 3.8 call their content macro without counting
    images; Qwen3-VL has no such scan)."""
    from conftest import require_module

    require_module("trl")
    import importlib.resources

    folder = importlib.resources.files("trl") / "chat_templates"
    found = {f.name[:-6]: [(s.reverse, s.flag) for s in reuse_plan(f.read_text()).scans]
             for f in folder.iterdir() if f.name.endswith(".jinja") and not f.name.endswith("_training.jinja")}
    assert {k: v for k, v in found.items() if v} == {
        "deepseek_r1_distill": [(False, None)], "glm4moe": [(False, None)], **{f: [(True, ("ns", "multi_step_tool"))] for f in ("qwen3", "qwen3_5_nothink", "qwen3_5_think", "qwen3_6",
                                                           "qwen3_8")},
        **{f: [(False, None), (False, None)] for f in ("nemotron_3_5_lightning", "nemotron_3_nano", "nemotron_3_super",
                                                       "nemotron_3_ultra")}}


def _tok():
    return load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))


def _counting(monkeypatch) -> list[int]:
    """Count the iterations every resumed or full scan runs (one entry per scan run)."""
    counts: list[int] = []
    real = iteration_reuse.scan

    def counted(*args):
        counts.append(0)
        for item in real(*args):
            counts[-1] += 1
            yield item

    monkeypatch.setattr(iteration_reuse, "scan", counted)
    return counts


@pytest.mark.parametrize("source", [FORWARD, REVERSE, MACRO])
def test_an_agent_episode_scans_only_the_new_messages(source, tmp_path, monkeypatch):
    """One user query, then tool turns: after the first renders each scan runs the new messages and the last
    match only (3: the call, its result, the query); a new query ends the backward scan at once (a full
    scan too stops where the flag clears); every render equals the plain template's text."""
    counts = _counting(monkeypatch)
    path = tmp_path / "scan.jinja"
    path.write_text(source)
    tok = _tok()
    plain = load_template(str(path), tok)
    inc = IncrementalRenderer(tok, str(path))
    held = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    inc.extend(held)
    for i in range(12):
        turn = role_batch("tool", i)
        if i == 8:
            turn.append({"role": "user", "content": "and then?"})
        inc.extend(turn)
        held += turn
        before = len(counts)
        assert tok.decode(inc.render(add_generation_prompt=True).token_ids) == plain.render_text(
            held, add_generation_prompt=True)
        ran = counts[before:]
        if i == 8:  # the query moves the last match: the namespace the main loop reads changed, a whole render follows
            assert ran == [1 if source != FORWARD else len(turn) + 1, len(held) if source == FORWARD else 1], ran
        elif i >= 3:
            assert ran == [len(turn) + 1], (i, ran)
    assert inc.reuse_renders >= 9


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(roles=st.lists(st.sampled_from(["user", "#user", "assistant", "tool", "system"]), min_size=1, max_size=24),
       cuts=st.lists(st.integers(0, 30), max_size=3), agps=st.lists(st.booleans(), min_size=1, max_size=8))
def test_resumed_scans_equal_full_renders(tmp_path_factory, roles, cuts, agps):
    """Hypothesis over role sequences (user messages that do and do not count), appends, cuts below and above
    the last match, and prompt flags: every render of both shapes equals the plain template's text."""
    tok = _tok()
    for name, source in (("forward", FORWARD), ("reverse", REVERSE), ("macro", MACRO)):
        path = tmp_path_factory.getbasetemp() / f"scan-{name}.jinja"
        path.write_text(source)
        plain = load_template(str(path), tok)
        inc = IncrementalRenderer(tok, str(path))
        held: list[dict] = []
        pending = list(cuts)
        for i, role in enumerate(roles):
            batch = role_batch("user", i, f"# note {i}") if role == "#user" else role_batch(role, i)
            inc.extend(batch)
            held += batch
            if pending and i % 5 == 4:
                n = pending.pop() % len(held)
                inc.cut(n)
                if n:
                    assert tok.decode(inc.render().token_ids) == plain.render_text(held[:n])
                inc.extend(held[n:])
            agp = agps[i % len(agps)]
            assert tok.decode(inc.render(add_generation_prompt=agp).token_ids) == plain.render_text(
                held, add_generation_prompt=agp), (name, i)
