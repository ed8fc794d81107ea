"""`ctxkit.text.rendering.splice`: a renderer cut back to a shared prefix, given a changed block and the old view's kept
suffix, splices its text (and the kept tail's ids) from the old render and windows around the block; every
result equals a fresh render (ids, mask, roles, spans, drifts, hash, special-token reports), for random
front drops, masked / truncated / replaced middle blocks and inserted blocks, on local (Qwen2.5, SmolLM2) and
non-local (Qwen3, never spliced) templates, and the next render after it (a turn appended) is exact too.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkit.text.rendering.segments import SegmentCache
from ctxkit.text.rendering.renderer import IncrementalRenderer, render
from test_render_cut import TOOLS, conversation, tok

TOKENIZERS = ("qwen2.5-instruct", "smollm2-135m-instruct", "qwen3")


def turn_starts(chat: list[dict]) -> list[int]:
    """Indexes of the assistant messages after the leading two (a turn: the call and its results)."""
    return [i for i, m in enumerate(chat) if i >= 2 and m["role"] == "assistant"]


def edit(rng: random.Random, chat: list[dict], kind: str) -> tuple[list[dict], int, int]:
    """`(new chat, a, s)`: the edited chat shares its first `a` and last `s` messages with `chat`."""
    starts = turn_starts(chat)
    x = rng.randrange(len(starts) - 1)
    y = rng.randrange(x + 1, len(starts))
    lo, hi = starts[x], starts[y]  # a run of whole turns, [lo, hi)
    if kind == "drop-front":
        lo = 2
        block: list[dict] = []
    elif kind == "mask":
        block = [dict(m, content="[output masked]") if m["role"] == "tool" else m for m in chat[lo:hi]]
    elif kind == "truncate":
        block = [dict(m, content=m["content"][:40] + " [truncated]") if m["role"] == "tool" else m for m in chat[lo:hi]]
    elif kind == "summary":
        block = [{"role": "user", "content": f"Summary of turns {lo} to {hi}: ran commands."}]
    else:  # insert a block before turn lo
        hi = lo
        block = [{"role": "user", "content": "Retrieved: an earlier note."}]
    new = chat[:lo] + block + chat[hi:]
    a = next((i for i in range(min(len(chat), len(new))) if chat[i] != new[i]), min(len(chat), len(new)))
    s = 0
    while s < min(len(chat), len(new)) - a and chat[-1 - s] == new[-1 - s]:
        s += 1
    return new, a, s


def spliced(name: str, chat: list[dict], new: list[dict], a: int, s: int) -> IncrementalRenderer:
    """A renderer that rendered `chat`, then was cut to `a` and given the rest of `new` with a splice hint."""
    r = IncrementalRenderer(tok(name), None, TOOLS, segments=SegmentCache())
    r.extend(chat)
    r.render(add_generation_prompt=True)
    hint = r.splice_hint(a, s)
    r.cut(a)
    r.extend(new[a:])
    r.expect_splice(hint, a, s)
    return r


def same(got, want) -> None:
    assert got.token_ids == want.token_ids
    assert (got.loss_mask, got.roles, got.spans, got.drifts) == (want.loss_mask, want.roles, want.spans, want.drifts)
    assert (got.hash, got.special_tokens_in_content) == (want.hash, want.special_tokens_in_content)


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), kind=st.sampled_from(["drop-front", "mask", "truncate", "summary", "insert"]))
def test_a_spliced_render_equals_a_fresh_one(name, seed, kind):
    rng = random.Random(seed)
    t = tok(name)
    chat = conversation(rng, t, rng.randint(4, 9), "s")
    new, a, s = edit(rng, chat, kind)
    r = spliced(name, chat, new, a, s)
    same(r.render(add_generation_prompt=True), render(new, t, None, TOOLS, add_generation_prompt=True))
    more = conversation(rng, t, 1, "more")[2:]  # the next turn, appended after the spliced render
    r.extend(more)
    same(r.render(add_generation_prompt=True), render(new + more, t, None, TOOLS, add_generation_prompt=True))
    if name == "qwen3":
        assert r.splice_renders == 0  # not local: never spliced


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "smollm2-135m-instruct"])
def test_a_front_drop_is_spliced_on_a_local_template(name):
    rng = random.Random(7)
    t = tok(name)
    chat = [m for m in conversation(rng, t, 12, "f") if "forged" not in str(m.get("content"))]
    starts = turn_starts(chat)
    new = chat[:2] + chat[starts[4]:]
    r = spliced(name, chat, new, 2, len(new) - 2)
    same(r.render(add_generation_prompt=True), render(new, t, None, TOOLS, add_generation_prompt=True))
    assert (r.splice_renders, r.full_renders) == (1, 1)


def sampled_variants(rng: random.Random, t, chat: list[dict]) -> list[dict]:
    """`chat` with some sampled turns cut by length (no end-of-turn id) or drifting by a token more or less."""
    from ctxkit.text.template.profile import template_profile
    from ctxkit.text.template.chat_template import load_template

    eot = template_profile(t, load_template(None, t)).end_of_turn_id
    out = []
    for m in chat:
        ids = m.get("token_ids")
        if ids is not None and len(ids) > 4:
            x = rng.random()
            if x < 0.2 and ids[-1] == eot:
                m = {**m, "token_ids": ids[:-1]}  # finished by length: the end-of-turn stays as scaffold
            elif x < 0.3:
                m = {**m, "token_ids": ids[:2] + ids[1:]}  # one token more: a drift that shifts what follows
            elif x < 0.4:
                m = {**m, "token_ids": ids[:1] + ids[2:]}  # one token less
        out.append(m)
    return out


def message_spliced(name: str, chat: list[dict], new: list[dict], a: int, s: int) -> IncrementalRenderer:
    """A renderer that rendered `chat`, then was given `new` by `splice` (the kept tail not appended again)."""
    r = IncrementalRenderer(tok(name), None, TOOLS, segments=SegmentCache())
    r.extend(chat)
    r.render(add_generation_prompt=True)
    r.splice(a, s, [(m, None) for m in new[a:len(new) - s]], lambda: [(m, None) for m in new[len(new) - s:]])
    return r


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), kind=st.sampled_from(["drop-front", "mask", "truncate", "summary", "insert"]),
       agp=st.booleans())
def test_a_message_level_splice_renders_what_a_fresh_renderer_renders(name, seed, kind, agp):
    """`splice` reuses the kept tail's prepared messages, regions and labels (shifted); with drifting and
    length-cut sampled turns, special-token text in tool output (escaped) and every edit kind, each render and
    the next one after a turn is appended equal fresh renders; Qwen3 is never spliced."""
    rng = random.Random(seed)
    t = tok(name)
    chat = sampled_variants(rng, t, conversation(rng, t, rng.randint(4, 10), "s"))
    new, a, s = edit(rng, chat, kind)
    r = IncrementalRenderer(tok(name), None, TOOLS, segments=SegmentCache())
    r.extend(chat)
    r.render(add_generation_prompt=agp)
    r.splice(a, s, [(m, None) for m in new[a:len(new) - s]], lambda: [(m, None) for m in new[len(new) - s:]])
    assert r.messages == tuple(new)
    same(r.render(add_generation_prompt=agp), render(new, t, None, TOOLS, add_generation_prompt=agp))
    more = conversation(rng, t, 1, "more")[2:]
    r.extend(more)
    same(r.render(add_generation_prompt=True), render(new + more, t, None, TOOLS, add_generation_prompt=True))
    if name == "qwen3":
        assert r.splice_renders == r.tail_reuses == 0


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "smollm2-135m-instruct"])
def test_a_spliced_front_drop_keeps_the_tail_labelled(name):
    rng = random.Random(11)
    t = tok(name)
    chat = [m for m in sampled_variants(rng, t, conversation(rng, t, 14, "f")) if "forged" not in str(m.get("content"))]
    starts = turn_starts(chat)
    new = chat[:2] + chat[starts[5]:]
    r = message_spliced(name, chat, new, 2, len(new) - 2)
    same(r.render(add_generation_prompt=True), render(new, t, None, TOOLS, add_generation_prompt=True))
    assert (r.splice_renders, r.tail_reuses, r.full_renders) == (1, 1, 1)
    masked = new[:2] + [dict(m, content="[masked]") if m["role"] == "tool" else m for m in new[2:9]] + new[9:]
    a = next(i for i in range(len(new)) if new[i] != masked[i])
    s = next(k for k in range(len(new)) if new[-1 - k] != masked[-1 - k])
    r.splice(a, s, [(m, None) for m in masked[a:len(masked) - s]], lambda: [])
    same(r.render(add_generation_prompt=True), render(masked, t, None, TOOLS, add_generation_prompt=True))
    assert (r.splice_renders, r.tail_reuses) == (2, 2)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_a_splice_that_orphans_a_kept_tool_result_fails_as_a_fresh_render(name):
    """A block dropped with the call a kept tool result answers: the tail is appended again and the pairing
    check raises what a fresh render raises (and the renderer stays usable)."""
    from ctxkit.errors import ToolPairingError

    rng = random.Random(5)
    t = tok(name)
    chat = conversation(rng, t, 6, "o")
    starts = turn_starts(chat)
    new = chat[:2] + chat[starts[3] + 1:]  # the call of turn 3 dropped, its result kept
    with pytest.raises(ToolPairingError) as fresh:
        render(new, t, None, TOOLS)
    r = IncrementalRenderer(t, None, TOOLS, segments=SegmentCache())
    r.extend(chat)
    r.render(add_generation_prompt=True)
    with pytest.raises(ToolPairingError) as got:
        r.splice(2, len(new) - 2, [], lambda: [(m, None) for m in new[2:]])
    assert str(got.value) == str(fresh.value)


def test_splice_rejects_a_block_that_does_not_fit():
    from ctxkit.errors import ConfigError

    r = IncrementalRenderer(tok("qwen2.5-instruct"), None, TOOLS)
    r.extend([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}])
    with pytest.raises(ConfigError, match="splice"):
        r.splice(2, 1, [], lambda: [])


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "smollm2-135m-instruct"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6))
def test_a_renderer_through_appends_cuts_and_splices_stays_exact(name, seed):
    """Sampled-id substitutions, drifts and spans reused across renders (`output.assemble` keeps those of
    regions unchanged since the last output): a random run of appends, cuts and splices of one renderer, with
    drifting and length-cut sampled turns, renders what a fresh renderer renders at every step."""
    rng = random.Random(seed)
    t = tok(name)
    chat = sampled_variants(rng, t, conversation(rng, t, rng.randint(4, 8), "g"))
    r = IncrementalRenderer(t, None, TOOLS, segments=SegmentCache())
    r.extend(chat)
    for step in range(5):
        same(r.render(add_generation_prompt=True), render(chat, t, None, TOOLS, add_generation_prompt=True))
        op = rng.choice(["append", "cut", "splice", "splice"])
        if op == "append" or len(turn_starts(chat)) < 3:
            more = sampled_variants(rng, t, conversation(rng, t, 1, f"m{step}"))[2:]
            r.extend(more)
            chat = chat + more
        elif op == "cut":
            n = rng.choice(turn_starts(chat))
            r.cut(n)
            chat = chat[:n]
        else:
            new, a, s = edit(rng, chat, rng.choice(["drop-front", "mask", "truncate", "summary", "insert"]))
            if s:
                r.splice(a, s, [(m, None) for m in new[a:len(new) - s]], lambda: [(m, None) for m in new[len(new) - s:]])
            else:  # the edit reached the last message: nothing is kept after it, so it is a cut (as RenderCache does)
                r.cut(a)
                r.extend(new[a:])
            chat = new
    same(r.render(add_generation_prompt=True), render(chat, t, None, TOOLS, add_generation_prompt=True))
