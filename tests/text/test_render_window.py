"""Windowed (suffix) text rendering: taken for local templates, never for history-rewriting or
whole-list templates, and always equal to a full render."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import tokenizer_dir
from ctxkit.errors import RenderError
from ctxkit.text.rendering.renderer import IncrementalRenderer, render
from ctxkit.text.template.locality import scan_locality
from ctxkit.text.template.profile import template_locality
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.tokenizer.loader import load_tokenizer
from render_cases import conversation

LOCAL = [("qwen2.5-instruct", None, "qwen"), ("smollm2-135m-instruct", None, "smollm"),
         ("qwen2.5-instruct", "chatml-tools-v1", "chatml")]


def _tok(name):
    return load_tokenizer(str(tokenizer_dir(name)))


@pytest.mark.parametrize("name,template,family", LOCAL)
def test_window_path_taken_and_exact(name, template, family):
    """Local templates: after the first render every render of a growing conversation comes from a
    window (when a window exists), and each one equals a full render."""
    tok = _tok(name)
    assert template_locality(tok, load_template(template, tok)).local
    rng = random.Random(f"window-{name}-{template}")
    windowed = 0
    for _ in range(12):
        msgs, tools = conversation(rng, family)
        inc = IncrementalRenderer(tok, template, tools=tools)
        for i, m in enumerate(msgs):
            inc.append(m)
            if rng.random() < 0.6 or i == len(msgs) - 1:
                agp = rng.random() < 0.5
                assert inc.render(add_generation_prompt=agp) == render(msgs[: i + 1], tok, template, tools, agp)
        windowed += inc.window_renders
    assert windowed >= 10


def run_agent_loop(inc, tok, head, steps, tools) -> None:
    """The benchmark's agent loop on `inc` (render with the prompt, then append a call + result pair); the
    last render must equal a full one."""
    inc.extend(head)
    msgs = list(head)
    for pair in steps:
        inc.render(add_generation_prompt=True)
        inc.extend(pair)
        msgs += pair
    assert inc.render(add_generation_prompt=True) == render(msgs, tok, tools=tools, add_generation_prompt=True)


def test_window_path_taken_every_agent_turn_qwen():
    """The agent loop of the benchmark (assistant tool call + tool result, render with the prompt):
    full renders while the conversation is too short for a window (system + user), then only windows."""
    from ctxkit.benchmarks.render_bench import build_episode

    tok = _tok("qwen2.5-instruct")
    head, steps, tools = build_episode(12, seed=1)
    inc = IncrementalRenderer(tok, tools=tools)
    run_agent_loop(inc, tok, head, steps, tools)
    assert (inc.full_renders, inc.window_renders) == (2, 11)


@pytest.mark.parametrize("name", ["qwen3", "mistral-7b-instruct-v0.3"])
def test_whole_list_templates_never_windowed(name):
    """Qwen3 (rewrites earlier turns after a new query) and Mistral (alternation counter) are not local."""
    tok = _tok(name)
    loc = template_locality(tok, load_template(None, tok))
    assert not loc.local and loc.reason
    family = "qwen3" if name == "qwen3" else "mistral"
    msgs, tools = conversation(random.Random(5), family)
    inc = IncrementalRenderer(tok, tools=tools)
    for m in msgs:
        inc.append(m)
        try:
            inc.render()
        except Exception:
            pass
    assert inc.window_renders == 0 and inc.full_renders + inc.reuse_renders == len(msgs)


@pytest.mark.parametrize("source,bad", [
    ("{% for m in messages %}{{ m.content }}{% if loop.last %}!{% endif %}{% endfor %}", None),
    ("{% for m in messages %}{% if loop.index0 == 0 or messages[loop.index0 - 1].role != m.role %}"
     "<{{ m.role }}>{% endif %}{{ m.content }}{% endfor %}", None),
    ("{{ messages[0].content }}{% for m in messages %}{{ m.content }}{% endfor %}", None),
    ("{% for m in messages %}{{ m.content }}{% if messages[-1].role == 'user' %}.{% endif %}{% endfor %}", "messages[...]"),
    ("{% for m in messages %}{{ m.content }}{{ messages|length }}{% endfor %}", "as a whole"),
    ("{% for m in messages %}{{ loop.index }}: {{ m.content }}{% endfor %}", "loop.index"),
    ("{% for m in messages %}{% if loop.revindex0 < 2 %}{{ m.content }}{% endif %}{% endfor %}", "loop.revindex0"),
    ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.content }}{% endfor %}",
     "namespace"),
    ("{% for m in messages[::-1] %}{{ m.content }}{% endfor %}", "messages[...]"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}{% for m in messages %}{% endfor %}", "2 loops"),
])
def test_scan_locality(source, bad):
    """The syntax-tree scan accepts neighbour lookups, loop.first/last and messages[0]; it rejects
    whole-list uses (length, messages[-1], slices, reversed loops, loop.index arithmetic, accumulators)."""
    got = scan_locality(source)
    if bad is None:
        assert got is None
    else:
        assert got is not None and bad in got


def test_lookup_two_back_widens_the_window(tmp_path):
    """A neighbour lookup two messages back: the scan measures its reach and the window starts far
    enough back that new messages see their real neighbours; the window's own first messages (whose
    lookups fall outside it) are checked against the known text; the first two messages, whose lookups
    wrap to the end of the list, lead every window (here their rendering follows the last message, so
    the windows fail their check and the full render is used). Every render equals a full render."""
    path = tmp_path / "two_back.jinja"
    path.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% if messages[loop.index0 - 2].role == 'user' %}*{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = _tok("qwen2.5-instruct")
    msgs = [{"role": "system", "content": "S"}]
    inc = IncrementalRenderer(tok, str(path))
    inc.extend(msgs)
    rng = random.Random(2)
    for k in range(20):
        m = {"role": rng.choice(["user", "system"]), "content": f"m{k}"}
        msgs.append(m)
        inc.append(m)
        assert inc.render(add_generation_prompt=k % 2 == 0) == render(msgs, tok, str(path), add_generation_prompt=k % 2 == 0)
    loc = template_locality(tok, load_template(str(path), tok))
    assert loc.local and loc.reach == 2  # the window starts 3 messages back
    assert inc.window_renders + inc.full_renders == 20


_TEXT = st.one_of(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12),
                  st.sampled_from(["<|im_end|>", "<|im_start|>assistant\n", "\n", "<tool_call>", "</tool_response>"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(system=st.booleans(), with_tools=st.booleans(),
       steps=st.lists(st.tuples(st.sampled_from(["user", "assistant", "call", "tools"]), _TEXT,
                                st.integers(1, 3), st.booleans(), st.booleans()), min_size=1, max_size=14))
def test_window_exact_on_generated_conversations(system, with_tools, steps):
    """Property (Qwen2.5 template, tools or not, system or not, tool runs, renders after any step with
    or without the prompt): every incremental render equals a full render."""
    from render_cases import TOOLS

    tok = _tok("qwen2.5-instruct")
    tools = TOOLS if with_tools else None
    msgs: list[dict] = [{"role": "system", "content": "Sys."}] if system else []
    msgs.append({"role": "user", "content": "Go."})
    inc = IncrementalRenderer(tok, tools=tools)
    inc.extend(msgs)
    pending: list[str] = []
    for k, (kind, text, n, do_render, agp) in enumerate(steps):
        if kind == "call":
            pending = [f"c{k}_{j}" for j in range(n)]
            new = [{"role": "assistant", "content": text, "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": "read_file", "arguments": {"path": text}}}
                for cid in pending]}]
        elif kind == "tools" and pending:
            new = [{"role": "tool", "tool_call_id": cid, "content": text} for cid in pending]
            pending = []
        else:
            new = [{"role": "user" if kind != "assistant" else "assistant", "content": text}]
        msgs += new
        inc.extend(new)
        if do_render or k == len(steps) - 1:
            try:
                full = render(msgs, tok, tools=tools, add_generation_prompt=agp)
            except RenderError:  # control text in content hides a turn: both paths must say so
                with pytest.raises(RenderError):
                    inc.render(add_generation_prompt=agp)
                return
            assert inc.render(add_generation_prompt=agp) == full


@pytest.mark.parametrize("source,expected", [
    ("{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>\n{% endif %}", "<a>\n"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}{%- if add_generation_prompt %}{{- '<b>' + '' }}{% endif %}", None),
    ("{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}{{ bos_token }}{% endif %}", None),
    ("{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}tail", None),
    ("{% for m in messages %}{% if add_generation_prompt %}x{% endif %}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}",
     None),
    ("{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% else %}<b>{% endif %}", None),
])
def test_trailing_prompt(source, expected):
    """The generation prompt is appended as a constant only for a final, constant, sole use of the flag."""
    from ctxkit.text.template.locality import trailing_prompt

    assert trailing_prompt(source) == expected


def test_locality_records_the_prompt_suffix():
    tok = _tok("qwen2.5-instruct")
    assert template_locality(tok, load_template(None, tok)).prompt == "<|im_start|>assistant\n"
    assert template_locality(tok, load_template("chatml-tools-v1", tok)).prompt == "<|im_start|>assistant\n"


@pytest.mark.parametrize("name,template,family", LOCAL)
def test_window_delta_from_a_marked_core_equals_full(name, template, family):
    """`window_delta` with a mark `(j, len(render(chat[:j])))` renders only the window with the new messages
    and gives what the window without a mark gives (the full renders where the check passes); a mark one
    character off fails its check (None), never a wrong text."""
    from ctxkit.text.template.locality import window_delta, window_start

    tok = _tok(name)
    tpl = load_template(template, tok)
    rng = random.Random(f"mark-{name}-{template}")
    checked = 0
    for _ in range(6):
        msgs, tools = conversation(rng, family)
        r = IncrementalRenderer(tok, template, tools=tools)
        r.extend(msgs)
        chat = r._chat
        calls = []

        def full(k, agp):
            return tpl.render_chat(chat[:k], tools=r._tools_plain, add_generation_prompt=agp)

        def full_list(part, agp):
            return tpl.render_chat(part, tools=r._tools_plain, add_generation_prompt=agp)

        def counted(part, agp):
            calls.append(len(part))
            return tpl.render_chat(part, tools=r._tools_plain, add_generation_prompt=agp)

        for m in range(4, len(chat)):
            j = window_start(chat, m)
            if j <= 1:
                continue
            core, p = full(m, False), len(full(j, False))
            for n in range(m, min(len(chat), m + 3) + 1):
                for agp in (False, True):
                    calls.clear()
                    got = window_delta(counted, chat[:n], m, core, agp, head=full(1, False), mark=(j, p))
                    assert all(k == 1 + n - j for k in calls) and len(calls) <= (n > m) + agp
                    # as without the mark (None where the new messages change how old ones render: a tool
                    # result after a tool result), and then the full renders
                    assert got == window_delta(full_list, chat[:n], m, core, agp, head=full(1, False))
                    if got is not None:
                        assert got == (full(n, False), full(n, agp))
                        checked += 1
            assert window_delta(counted, chat[: m + 1], m, core, False, head=full(1, False), mark=(j, p - 1)) is None
    assert checked >= 20


def test_agent_turns_render_one_window_each():
    """In the agent loop each windowed render takes its window's old part from the previous build's core
    (`RenderState.core_marks`): one template render per turn instead of two, with ids equal to a full render."""
    from ctxkit.benchmarks.render_bench import build_episode

    tok = _tok("qwen2.5-instruct")
    head, steps, tools = build_episode(12, seed=1)
    inc = IncrementalRenderer(tok, tools=tools)
    inner, sizes = inc._render_text, []

    def counted(chat, agp):
        sizes.append(len(chat))
        return inner(chat, agp)

    inc._render_text = counted
    run_agent_loop(inc, tok, head, steps, tools)
    assert (inc.full_renders, inc.window_renders) == (2, 11)
    # two full renders (2 and 4 messages; the head between them, for a window too short to use), then one
    # window of the lead + 4 messages per turn (without marks its old part was rendered too: 3 and 5)
    assert sizes == [2, 1, 4] + [5] * 11
