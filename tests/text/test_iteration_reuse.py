"""Keeping a template's earlier loop iterations (`ctxkit.text.template.iteration_reuse`): which templates the
syntax-tree plan accepts and why it refuses the others, and renders that keep iterations equal to full renders
(Qwen3's own template, hand-written templates with a snapshot, wide reach and `loop.last`), with cuts,
snapshot changes and message text that holds the markers."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import tokenizer_dir
from ctxkit.text.rendering.renderer import IncrementalRenderer, render
from ctxkit.text.rendering.window import rendered_text
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.template.iteration_reuse import ITERATION, SECTION, render_pieces, reuse_plan
from ctxkit.text.template.profile import template_profile
from ctxkit.text.tokenizer.loader import load_tokenizer
from render_cases import conversation, role_batch

# The same loop over `loop_messages`, which skips a leading system message (Llama 3, Gemma 3, Nemotron 3).
ALIAS_TEMPLATE = (
    "{% if messages[0].role == 'system' %}{% set loop_messages = messages[1:] %}<sys>{{ messages[0].content }}"
    "{% else %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{% if loop.last %}$last{% endif %}{% if not loop.last and loop_messages[loop.index0 + 1].role == 'tool' %}>"
    "{% endif %}{% if loop.index0 >= 1 and loop_messages[loop.index0 - 1].role == 'tool' %}*{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Llama 3.2's shape: the template drops a leading system message and then the first user one from `messages`
# itself, and its loop reads the shortened list's first message and neighbours.
DROP_TEMPLATE = (
    "{% if messages[0].role == 'system' %}{% set sys = messages[0].content %}{% set messages = messages[1:] %}"
    "{% else %}{% set sys = '' %}{% endif %}<sys>{{ sys }}"
    "{% if messages|length != 0 and messages[0].role == 'user' %}<first>{{ messages[0].content }}"
    "{% set messages = messages[1:] %}{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}({{ messages[0].role }})"
    "{% if loop.last %}$last{% endif %}{% if not loop.last and messages[loop.index0 + 1].role == 'tool' %}>"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A counter the loop carries (Qwen 3.5 counts images in a macro): a system message past the first bumps it, and
# every iteration prints it, so an iteration's text depends on the messages before it through the counter.
CARRIED_TEMPLATE = (
    "{% set seen = namespace(n=0) %}{% macro body(m) %}{% if m.role == 'system' %}{% set seen.n = seen.n + 1 %}"
    "{% endif %}{{ m.content }}{% endmacro %}"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ body(message) }}#{{ seen.n }}"
    "{% if loop.last %}$last{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A namespace set before the loop from the whole list (the last user message), `loop.last`, a neighbour two
# back and one ahead: not local, but every iteration reads only what the plan allows.
SNAPSHOT_TEMPLATE = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "[{{ messages|length }}]"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{% if loop.index0 > ns.last_user %}+{% endif %}{% if loop.last %}$last{% endif %}"
    "{% if loop.index0 >= 2 and messages[loop.index0 - 2].role == 'tool' %}*{% endif %}"
    "{% if not loop.last and messages[loop.index0 + 1].role == 'tool' %}>{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tok(name: str = "qwen2.5-instruct"):
    return load_tokenizer(str(tokenizer_dir(name)))


@pytest.mark.parametrize("source,reason,names,reach", [
    (SNAPSHOT_TEMPLATE, "", ("ns",), 2),
    ("{% for m in messages %}{{ m.content }}{% if loop.last %}!{% endif %}{% endfor %}", "", (), 1),
    ("{% set sys = messages[0].content %}{% for m in messages %}{{ sys }}{{ m.content }}{% endfor %}",
     "", ("sys",), 1),
    ("{% for m in messages %}{% if add_generation_prompt %}g{% endif %}{{ m.content }}{% endfor %}",
     "", ("add_generation_prompt",), 1),
    ("{% for m in messages %}{{ m.content }}{{ messages|length }}{% endfor %}", "as a whole", (), 1),
    ("{% for m in messages %}{{ m.content }}{{ messages[-1].role }}{% endfor %}", "messages[...]", (), 1),
    ("{% for m in messages %}{{ loop.length }}{% endfor %}", "loop.length", (), 1),
    ("{% for m in messages %}{% if loop.changed(m.role) %}.{% endif %}{% endfor %}", "loop.changed", (), 1),
    ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ ns.n }}{% endfor %}",
     "", ("ns",), 1),  # a counter the loop carries: kept only where the state handed on matches (CARRIED_TEMPLATE)
    ("{% for m in messages %}{% set ns = namespace(n=0) %}{% set ns.n = 1 %}{{ m.content }}{% endfor %}",
     "namespace attribute assigned in the loop (ns.n)", (), 1),
    ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns = namespace(n=1) %}{% set ns.n = 2 %}"
     "{{ m.content }}{% endfor %}", "namespace attribute assigned in the loop (ns.n)", (), 1),
    ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = 2 %}{% for ns in [1] %}{% endfor %}"
     "{{ m.content }}{% endfor %}", "the loop sets ['ns'] itself", (), 1),
    ("{% set ns = namespace(n=0) %}{% macro f(c) %}{% set ns.n = ns.n + 1 %}{{ c }}{% endmacro %}"
     "{% for m in messages %}{{ f(m.content) }}{% endfor %}", "", ("ns",), 1),
    ("{% for m in messages %}{% if m.role == 'x' %}{% break %}{% endif %}{{ m.content }}{% endfor %}", "break", (), 1),
    ("{% set x = 1 %}{% macro f(c) %}{{ c }}{{ x }}{% endmacro %}{% for m in messages %}{{ f(m.content) }}{% endfor %}",
     "macro f reads x", (), 1),
    ("{% macro f(c) %}[{{ c }}]{% endmacro %}{% for m in messages %}{{ f(m.content) }}{% endfor %}", "", (), 1),
    ("{% for m in messages %}{{ m.content }}{% endfor %}{% for m in messages %}{{ m.role }}{% endfor %}",
     "2 writing text", (), 1),
    ("{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{{ m.content }}{% endfor %}", "", (), 1),
    ("{% set loop_messages = messages[2:] %}{% for m in loop_messages %}{{ messages[loop.index0 + 1].role }}"
     "{% endfor %}", "", (), 3),
    ("{% set loop_messages = messages|reverse %}{% for m in loop_messages %}{{ m.content }}{% endfor %}",
     "0 writing text", (), 1),
    ("{% for m in messages %}{% include 'x' %}{% endfor %}", "includes", (), 1),
    ("{% if x %}{% set messages = messages[::-1] %}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
     "assigns messages something other than messages[c:]", (), 1),
    ("{% for m in messages %}{% set messages = messages[1:] %}{{ m.content }}{% endfor %}",
     "the loop over messages assigns messages", (), 1),
    ("{% if messages[0].role == 'system' %}{% set messages = messages[1:] %}{% endif %}"
     "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{{ messages[0].content }}{{ m.content }}"
     "{% endfor %}", "", (), 1),
])
def test_reuse_plan(source, reason, names, reach):
    """The plan accepts a loop whose body reads its message, neighbours, `messages[0]`, `loop.first/last`,
    names set before the loop (the snapshot) and the prompt flag; it names what rules the others out."""
    plan = reuse_plan(source)
    assert plan.ok == (not reason)
    assert reason in plan.reason if reason else plan.reason == ""
    if plan.ok:
        assert (plan.names, plan.reach) == (names, reach)


def test_qwen3_plan():
    """Qwen3's own template: not local (its namespace and `loop.last` rewrite history), its loop reusable
    with the namespace as the snapshot."""
    tok = _tok("qwen3")
    profile = template_profile(tok, load_template(None, tok))
    assert not profile.locality.local
    assert (profile.reuse.ok, profile.reuse.names, profile.reuse.reach) == (True, ("ns",), 1)


def test_marked_render_is_the_plain_render():
    """With every iteration written, the marked render cut at its markers is the plain render."""
    tok = _tok("qwen3")
    tpl = load_template(None, tok)
    msgs, tools = conversation(random.Random(3), "qwen3")
    chat = [dict(m) for m in msgs]
    plan = template_profile(tok, tpl).reuse
    got = render_pieces(tpl, plan, chat, tools, True, len(chat), len(chat))
    assert got.prelude + "".join(got.iterations) + got.epilogue == tpl.render_chat(chat, tools=tools,
                                                                                   add_generation_prompt=True)
    assert len(got.iterations) == len(chat) and got.snapshot.startswith("[0, 0, ('TemplateNamespace', <Namespace")


def test_qwen3_agent_episode_keeps_iterations():
    """The benchmark's agent loop on Qwen3: after the first renders every render keeps the earlier
    iterations, and each equals a fresh full render; a new user query changes the snapshot (the namespace's
    last query index), so that render is whole and the next ones keep iterations again."""
    from ctxkit.benchmarks.render_bench import build_episode

    tok = _tok("qwen3")
    head, steps, tools = build_episode(10, seed=4)
    inc = IncrementalRenderer(tok, tools=tools)
    inc.extend(head)
    msgs = list(head)
    for k, pair in enumerate(steps):
        inc.extend(pair)
        msgs += pair
        if k == 6:
            query = {"role": "user", "content": "And the other file?"}
            inc.append(query)
            msgs.append(query)
        assert inc.render(add_generation_prompt=True) == render(msgs, tok, tools=tools, add_generation_prompt=True)
    assert (inc.full_renders, inc.reuse_renders, inc.window_renders) == (2, 8, 0)


@pytest.mark.parametrize("seed", range(6))
def test_qwen3_random_conversations_with_cuts(seed):
    """Random Qwen3 conversations (reasoning, several calls, system or not), rendered after random appends
    with and without the prompt, cut back at random points and grown again: every render equals a full
    render."""
    tok = _tok("qwen3")
    rng = random.Random(f"reuse-{seed}")
    kept = 0
    for _ in range(4):
        msgs, tools = conversation(rng, "qwen3")
        inc = IncrementalRenderer(tok, tools=tools)
        held: list[dict] = []
        for m in msgs:
            inc.append(m)
            held.append(m)
            if rng.random() < 0.25 and len(held) > 2:  # cut back, render, and append the same messages again
                n = rng.randrange(1, len(held))
                inc.cut(n)
                assert inc.render() == render(held[:n], tok, tools=tools)
                inc.extend(held[n:])
            agp = rng.random() < 0.5
            assert inc.render(add_generation_prompt=agp) == render(held, tok, tools=tools, add_generation_prompt=agp)
        kept += inc.reuse_renders
    assert kept > 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(roles=st.lists(st.sampled_from(["user", "assistant", "tool", "system"]), min_size=1, max_size=24),
       cuts=st.lists(st.integers(0, 30), max_size=3), agps=st.lists(st.booleans(), min_size=1, max_size=8))
def test_snapshot_and_alias_templates_equal_full_render(tmp_path_factory, roles, cuts, agps):
    """Hypothesis over role sequences, appends, cuts and prompt flags on `SNAPSHOT_TEMPLATE` (snapshot,
    reach 2 both ways, `loop.last`, and a prelude that prints the list's length) and `ALIAS_TEMPLATE` (the
    loop over `loop_messages`, one message shorter when a system message leads): every render equals the
    plain template's text of the messages held; and `DROP_TEMPLATE` (`messages` itself shortened by 0-2) and
    `CARRIED_TEMPLATE` (a counter carried from iteration to iteration)."""
    for name, source in (("snapshot", SNAPSHOT_TEMPLATE), ("alias", ALIAS_TEMPLATE), ("drop", DROP_TEMPLATE),
                         ("carried", CARRIED_TEMPLATE)):
        path = tmp_path_factory.getbasetemp() / f"{name}.jinja"
        path.write_text(source)
        _grow_and_cut(path, list(roles), list(cuts), agps)


def _grow_and_cut(path, roles, cuts, agps) -> None:
    tok = _tok()
    plain = load_template(str(path), tok)
    inc = IncrementalRenderer(tok, str(path))
    held: list[dict] = []
    for i, role in enumerate(roles):
        batch = role_batch(role, i)
        inc.extend(batch)
        held += batch
        if cuts and i % 5 == 4:
            n = cuts.pop() % len(held)
            inc.cut(n)
            if n:
                assert inc.render() == render(held[:n], tok, str(path))
            inc.extend(held[n:])
        agp = agps[i % len(agps)]
        ctx = inc.render(add_generation_prompt=agp)
        assert tok.decode(ctx.token_ids) == plain.render_text(held, add_generation_prompt=agp)


def test_a_template_that_shortens_messages_keeps_iterations(tmp_path):
    """`DROP_TEMPLATE` (Llama 3.2's shape): the plan accepts it, and over a tool episode with a system and a user
    message first every render from the third on keeps iterations, and every render equals the plain template's text."""
    assert reuse_plan(DROP_TEMPLATE) == reuse_plan(DROP_TEMPLATE).__class__(True, "", 1, (), "messages")
    tok = _tok()
    path = tmp_path / "drop.jinja"
    path.write_text(DROP_TEMPLATE)
    inc = IncrementalRenderer(tok, str(path))
    plain = load_template(str(path), tok)
    held = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    inc.extend(held)
    for i in range(8):
        turn = role_batch("tool", i)
        inc.extend(turn)
        held += turn
        ctx = inc.render(add_generation_prompt=True)
        assert tok.decode(ctx.token_ids) == plain.render_text(held, add_generation_prompt=True)
    # the second render's base holds two iterations: none between the lead and the last one to keep
    assert (inc.full_renders, inc.reuse_renders) == (2, 6)


def test_carried_state_is_restored_after_the_kept_iterations(tmp_path):
    """`CARRIED_TEMPLATE`: a system message mid-way bumps the counter inside the kept iterations; the render that
    skips them sets the counter, at the first iteration after the gap, to the earlier render's state there (1,
    not the lead's 0), so renders keep iterations across the bump and each equals the plain template's text."""
    path = tmp_path / "carried.jinja"
    path.write_text(CARRIED_TEMPLATE)
    assert reuse_plan(CARRIED_TEMPLATE).carried == ("seen",)
    tok = _tok()
    inc = IncrementalRenderer(tok, str(path))
    plain = load_template(str(path), tok)
    held, counts = [{"role": "user", "content": "task"}], []
    inc.extend(held)
    for i in range(8):
        turn = [{"role": "system" if i == 4 else "assistant", "content": f"a{i}"}, {"role": "user", "content": f"u{i}"}]
        inc.extend(turn)
        held += turn
        ctx = inc.render(add_generation_prompt=True)
        assert tok.decode(ctx.token_ids) == plain.render_text(held, add_generation_prompt=True)
        counts.append((inc.full_renders, inc.reuse_renders))
    assert counts == [(1, k) for k in range(8)]  # a full render builds the first base; every later one keeps
    assert "a7#1" in tok.decode(ctx.token_ids)  # the last turn, rendered after the gap, prints the restored count


@pytest.mark.parametrize("marker", [SECTION, ITERATION])
def test_marker_in_content_falls_back(marker):
    """A message holding a marker's text (tool output is untrusted) does not cut the marked render as
    expected: the plain template renders it, and the result still equals a full render."""
    tok = _tok("qwen3")
    msgs = [{"role": "user", "content": "hi"}]
    inc = IncrementalRenderer(tok, special_tokens="allow")
    inc.extend(msgs)
    inc.render()
    for k in range(4):
        m = {"role": "assistant", "content": f"a{k}"} if k % 2 == 0 else {"role": "user", "content": f"u {marker} {k}"}
        inc.append(m)
        msgs.append(m)
        assert inc.render(add_generation_prompt=True) == render(msgs, tok, add_generation_prompt=True,
                                                                special_tokens="allow")
    assert not inc.state.reuse_bases[True] and inc.reuse_renders == 0  # (the first render, without it, left one)


def test_marked_render_over_the_output_limit_falls_back():
    """Fault injection: an output limit the plain render fits and the marked one (longer by its markers)
    does not. The plain template renders, the result equals a full render, and no base is kept."""
    from dataclasses import replace

    tok = _tok("qwen3")
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}, {"role": "user", "content": "b"}]
    tpl = load_template(None, tok)
    size = len(tpl.render_text(msgs, add_generation_prompt=True))
    tight = load_template(None, tok, limits=replace(tpl.limits, max_output_chars=size + 4))
    inc = IncrementalRenderer(tok, tight)
    inc.extend(msgs)
    got, full = inc.render(add_generation_prompt=True), render(msgs, tok, tpl, add_generation_prompt=True)
    assert (got.token_ids, got.loss_mask, got.template_id) == (full.token_ids, full.loss_mask, full.template_id)
    assert not any(inc.state.reuse_bases.values()) and (inc.full_renders, inc.reuse_renders) == (1, 0)


REUSED_FAMILIES = ("cohere", "deepseek_r1_distill", "deepseekv3", "gemma", "gemma3", "glm4moe", "llama3", "llama3_1",
                   "llama3_2", "nemotron_3_5_lightning", "nemotron_3_nano", "nemotron_3_super", "nemotron_3_ultra",
                   "qwen3", "qwen3_5_nothink", "qwen3_5_think", "qwen3_6", "qwen3_8", "qwen3_vl")
"""TRL stock templates that are not local and whose loop iterations the plan lets a render keep."""


@pytest.mark.parametrize("family", REUSED_FAMILIES)
def test_trl_families_grown_message_by_message(family, tmp_path):
    """Every generated conversation of the family (tools, several calls, reasoning, errors), grown message by
    message with the prompt: each incremental render's text is the plain template's, and some renders kept
    earlier iterations."""
    from conftest import require_module, shared_path
    from ctxkit.benchmarks.family_conversations import family_conversations
    from ctxkit.benchmarks.template_families import family_spec, family_tokenizer
    from ctxkit.errors import CtxkitError

    require_module("trl")
    tok = load_tokenizer(str(family_tokenizer(family, shared_path("tokenizers").parent, tmp_path)))
    tpl = load_template(None, tok)
    plan = template_profile(tok, tpl)
    assert plan.reuse.ok and not plan.locality.local
    kept = 0
    for name, (msgs, tools) in family_conversations(family_spec(family)).items():
        inc = IncrementalRenderer(tok, tpl, tools, special_tokens="allow")
        for i, m in enumerate(msgs):
            inc.append(m)
            try:
                expected = tpl.render_text(msgs[: i + 1], tools=tools, add_generation_prompt=True)
            except CtxkitError:
                continue  # the template refuses this prefix (Qwen 3.5: a system message alone): nothing to compare
            text = rendered_text(inc.state, inc._render_text, plan.locality, True, inc._reuse)
            assert text == expected, (family, name, i)
        kept += inc.reuse_renders
    assert kept > 0


def test_prefix_renders_that_locate_turns_keep_iterations(tmp_path, monkeypatch):
    """Nemotron 3 (TRL's stock template) locates assistant turns from prefix renders (its prompt opens a
    `<think>` the rendered turn closes at once, so the turn is found per turn): those renders keep the earlier
    iterations too, or take a base's text of the same messages. Over a tool episode the plain template never
    renders after the first turns, and every context (ids, loss mask) equals a one-shot render, with a cut
    back and regrowth in the middle."""
    from conftest import require_module, shared_path
    from ctxkit.benchmarks.render_bench import build_episode
    from ctxkit.benchmarks.template_families import family_tokenizer
    from ctxkit.text.template.chat_template import ChatTemplate

    require_module("trl")
    tok = load_tokenizer(str(family_tokenizer("nemotron_3_nano", shared_path("tokenizers").parent, tmp_path)))
    tpl = load_template(None, tok)
    assert template_profile(tok, tpl).reuse.ok
    head, steps, tools = build_episode(12, seed=5)
    plain_renders = []
    inner = ChatTemplate.render_chat
    monkeypatch.setattr(ChatTemplate, "render_chat", lambda self, chat, **kw: plain_renders.append(len(chat))
                        or inner(self, chat, **kw))
    inc = IncrementalRenderer(tok, tpl, tools)
    inc.extend(head)
    held = list(head)
    for k, pair in enumerate(steps):
        inc.extend(pair)
        held += pair
        if k == 7:
            inc.cut(len(held) - 3)
            inc.extend(held[-3:])
        got = inc.render(add_generation_prompt=True)
        plain_renders.append("|")
        expected = render(held, tok, tpl, tools, add_generation_prompt=True)
        del plain_renders[plain_renders.index("|"):]
        assert (got.token_ids, got.loss_mask) == (expected.token_ids, expected.loss_mask), k
    assert plain_renders == [] and inc.state.mode == "turns"
    assert (inc.full_renders, inc.reuse_renders) == (1, len(steps) - 1)
