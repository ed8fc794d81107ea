"""IncrementalRenderer equals a full render (and apply_chat_template) at every turn, sampled ids included."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import tokenizer_dir
from ctxkit.errors import RenderError
from ctxkit.text.rendering.renderer import IncrementalRenderer, context_hash, encode_assistant_turn, render
from ctxkit.text.tokenizer.loader import load_tokenizer
from render_cases import conversation

FAMILIES = {
    "qwen2.5-instruct": "qwen",
    "qwen3": "qwen3",
    "mistral-7b-instruct-v0.3": "mistral",
    "smollm2-135m-instruct": "smollm",
}


def _strip(m):
    return {k: v for k, v in m.items() if k != "token_ids"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_incremental_equals_full_render_every_turn(name):
    tok = load_tokenizer(str(tokenizer_dir(name)))
    rng = random.Random(f"incremental-{name}")
    compared = 0
    for _ in range(25):
        msgs, tools = conversation(rng, FAMILIES[name])
        inc = IncrementalRenderer(tok, tools=tools)
        for i, m in enumerate(msgs):
            inc.append(m)
            agp = rng.random() < 0.5
            prefix = msgs[: i + 1]
            try:
                full = render(prefix, tok, tools=tools, add_generation_prompt=agp)
            except Exception as exc:  # the template itself rejects this prefix (e.g. Mistral alternation)
                with pytest.raises(type(exc)):
                    inc.render(add_generation_prompt=agp)
                continue
            got = inc.render(add_generation_prompt=agp)
            assert got == full, (name, i, agp)
            assert got.hash == context_hash(got.token_ids)
            if rng.random() < 0.3:
                ref = tok.hf.apply_chat_template(prefix, tools=tools, tokenize=True, add_generation_prompt=agp,
                                                 return_dict=False)
                assert list(got.token_ids) == ref
            compared += 1
    assert compared > 100


def test_incremental_with_sampled_ids_and_drift():
    """An agent loop: each assistant turn carries the ids the policy sampled (from encode_assistant_turn,
    some re-split to force drift, some cut by length); incremental and full renders agree at each step."""
    tok = load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))
    rng = random.Random(3)
    msgs = [{"role": "system", "content": "Agent."}, {"role": "user", "content": "Start."}]
    inc = IncrementalRenderer(tok)
    inc.extend(msgs)
    n_drift = 0
    for step in range(30):
        ctx = inc.render(add_generation_prompt=True)
        assert ctx == render(msgs, tok, add_generation_prompt=True)
        text = f"Step {step}: looking at item number {rng.randint(0, 999)} now."
        ids = list(encode_assistant_turn({"role": "assistant", "content": text}, tok))
        kind = rng.choice(["exact", "resplit", "length"])
        if kind == "resplit":
            word = tok.encode(" looking")
            pos = next(k for k in range(len(ids)) if ids[k : k + len(word)] == word)
            ids[pos : pos + len(word)] = tok.encode(" look") + tok.encode("ing")
            n_drift += 1
        elif kind == "length":
            ids = ids[:-1]
        turn = {"role": "assistant", "content": text, "token_ids": ids}
        msgs.append(turn)
        inc.append(turn)
        after = inc.render()
        full = render(msgs, tok)
        assert after == full
        assert after.token_ids[: len(ctx.token_ids)] == ctx.token_ids  # the context extends the previous one
        span = after.spans[-1]
        assert after.token_ids[span.start : span.end] == tuple(ids)
        obs = {"role": "user", "content": f"Observation {step}: {'ok ' * rng.randint(1, 30)}"}
        msgs.append(obs)
        inc.append(obs)
    final = inc.render(add_generation_prompt=True)
    assert len(final.drifts) == n_drift > 0
    assert all(d.sampled_ids != d.rendered_ids for d in final.drifts)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool"]),
                          st.lists(st.one_of(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=15),
                                             st.sampled_from(["<|im_end|>", "<|im_start|>", "<|im_start|>assistant\n",
                                                              "\n", " ", "<tool_call>", "<|endoftext|>"])),
                                   max_size=4).map("".join),
                          st.booleans()),
                min_size=1, max_size=12))
@pytest.mark.parametrize("policy", ["allow", "escape", None])
def test_incremental_property_chatml(policy, steps):
    """Property: for any text (unicode, whitespace, ChatML control text inside content) and any order of
    appends and renders, the incremental render equals the full render, under every special-token policy
    (None: the default, tool content escaped); under "allow" the ids are tiktoken's with specials parsed."""
    tok = load_tokenizer("tiktoken:cl100k_base")
    inc = IncrementalRenderer(tok, "chatml-tools-v1", special_tokens=policy)
    msgs: list[dict] = []
    for k, (role, text, agp) in enumerate(steps):
        if role == "tool":
            msgs.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": f"c{k}", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
            inc.append(msgs[-1])
            msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": text})
        else:
            msgs.append({"role": role, "content": text})
        inc.append(msgs[-1])
        try:
            full = render(msgs, tok, "chatml-tools-v1", add_generation_prompt=agp, special_tokens=policy)
        except RenderError:
            with pytest.raises(RenderError):
                inc.render(add_generation_prompt=agp)
            return
        got = inc.render(add_generation_prompt=agp)
        assert got == full
        if policy == "allow" or not any(r.policy == "escape" for r in got.special_tokens_in_content):
            assert list(got.token_ids) == tok.encoding.encode(
                inc.template.render_text(msgs, add_generation_prompt=agp), allowed_special="all")


def test_renderer_recovers_after_an_error(tmp_path):
    """A render that fails (a turn the template hides without add_generation_prompt) leaves no
    half-updated state: the next render equals a full render."""
    path = tmp_path / "hide.jinja"
    path.write_text(
        "{% for m in messages %}{% if m.role == 'assistant' and m.content == 'hidden' and not add_generation_prompt %}"
        "<|im_start|>assistant\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))
    inc = IncrementalRenderer(tok, str(path))
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    inc.extend(msgs)
    assert inc.render() == render(msgs, tok, str(path))
    more = [{"role": "user", "content": "c"}, {"role": "assistant", "content": "hidden"}, {"role": "user", "content": "d"}]
    inc.extend(more)
    with pytest.raises(RenderError, match="message 3"):
        inc.render()
    with pytest.raises(RenderError, match="message 3"):
        render(msgs + more, tok, str(path))
    assert inc.render(add_generation_prompt=True) == render(msgs + more, tok, str(path), add_generation_prompt=True)


@pytest.mark.parametrize("policy", ["allow", "escape"])
def test_a_token_shared_by_two_contents_keeps_its_first_label_in_both_paths(policy):
    """Found by the property above: a tool output ':' followed by a user turn '\\n'. cl100k merges ':' with
    the template's newline into one token, and the user's '\\n' is also found there; the full render and the
    incremental one (which never relabels tokens before its first new one) must label that token alike."""
    tok = load_tokenizer("tiktoken:cl100k_base")
    msgs = [{"role": "assistant", "content": "", "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c0", "content": ":"}]
    inc = IncrementalRenderer(tok, "chatml-tools-v1", special_tokens=policy)
    inc.extend(msgs)
    inc.render()
    msgs.append({"role": "user", "content": "\n"})
    inc.append(msgs[-1])
    full = render(msgs, tok, "chatml-tools-v1", special_tokens=policy)
    assert inc.render() == full
    shared = next(i for i, t in enumerate(full.token_ids) if tok.decode([t]) == ":\n")
    assert full.roles[shared] == "tool"


def test_hash_resumes_from_checkpoints_over_long_contexts():
    """The context hash is resumed from checkpoints every `HASH_STEP` tokens: over a context of many steps,
    with appends, cuts back to an earlier message and sampled ids, every render's hash equals
    `context_hash` of its ids, and a fresh full render's."""
    from ctxkit.text.rendering.output import HASH_STEP

    tok = load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))
    rng = random.Random("hash-checkpoints")
    msgs = [{"role": "system", "content": "You are terse."}]
    for i in range(40):
        msgs.append({"role": "user", "content": " ".join(f"word{rng.randint(0, 999)}" for _ in range(rng.randint(5, 120)))})
        reply = {"role": "assistant", "content": f"reply {i} " + "ok " * rng.randint(1, 40)}
        if i % 3 == 0:
            reply["token_ids"] = list(encode_assistant_turn(reply, tok))
        msgs.append(reply)
    inc = IncrementalRenderer(tok)
    longest = 0
    k = 0
    while k < len(msgs):
        inc.append(msgs[k])
        k += 1
        if k > 8 and rng.random() < 0.15:  # forget a few messages and append them again
            back = rng.randint(1, 6)
            inc.cut(k - back)
            k -= back
            continue
        agp = rng.random() < 0.5
        got = inc.render(add_generation_prompt=agp)
        assert got.hash == context_hash(got.token_ids), k
        if rng.random() < 0.2:
            assert got == render(msgs[:k], tok, add_generation_prompt=agp), k
        longest = max(longest, len(got))
    assert longest > 8 * HASH_STEP


# Tool results written as JSON text (Llama 3.2 writes `message.content | tojson`): a result holding a quote is
# never found in the render, so its message stays unresolved.
JSON_TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'tool' %}{{ m.content | tojson }}{% else %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_message_never_found_is_searched_again_only_in_changed_text(tmp_path):
    """An unresolved message (its text is nowhere in the render) is not searched for again in text that did not
    change: later renders keep the earlier regions, and each equals a one-shot render. When its text does
    appear in new text (a later user message quotes it), the render locates as a full render does: here both
    take the quote for the result and then find no later turn, so both refuse alike."""
    path = tmp_path / "json_tool.jinja"
    path.write_text(JSON_TOOL_TEMPLATE)
    tok = load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))
    inc = IncrementalRenderer(tok, str(path))
    held = [{"role": "user", "content": "task"}]
    inc.extend(held)
    inc.render(add_generation_prompt=True)
    for k in range(6):
        quote = k == 5  # the last user message holds the first tool result's text verbatim
        call = {"id": f"c{k}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        turn = [{"role": "assistant", "content": f"call {k}", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"c{k}", "content": f'say "r{k}"'},
                {"role": "user", "content": 'you said say "r0"' if quote else f"next {k}"}]
        inc.extend(turn)
        held += turn
        if quote:
            with pytest.raises(RenderError, match="message 4: no end-of-turn") as one_shot:
                render(held, tok, str(path), add_generation_prompt=True)
            with pytest.raises(RenderError) as incremental:
                inc.render(add_generation_prompt=True)
            assert str(incremental.value) == str(one_shot.value)
            break
        assert inc.render(add_generation_prompt=True) == render(held, tok, str(path), add_generation_prompt=True), k
        assert inc.state.unresolved == [2 + 3 * j for j in range(k + 1)]
        assert inc.state.new_at >= 3 * k  # the earlier messages' regions were kept, not located again
