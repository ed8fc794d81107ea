"""`history`: how a sampled turn the template re-renders otherwise enters the context. `sampled` (default)
keeps the sampled ids verbatim (a `thinking_stripped` drift); `template` keeps the template's render of a turn
whose reasoning it drops, so the context equals `apply_chat_template` there."""

from __future__ import annotations

import pytest

from conftest import tokenizer_dir
from ctxkit.errors import ConfigError
from ctxkit.text.rendering.renderer import IncrementalRenderer, render
from ctxkit.text.tokenizer.loader import load_tokenizer

THINK = "<think>\n17 has no divisors.\n</think>\n\nYes.<|im_end|>"


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer(str(tokenizer_dir("qwen3")))


def _chat(tok):
    return [{"role": "user", "content": "Is 17 prime?"},
            {"role": "assistant", "content": "Yes.", "reasoning_content": "17 has no divisors.",
             "token_ids": tok.encode(THINK)},
            {"role": "user", "content": "And 21?"}]


def _hf(tok, msgs):
    plain = [{k: v for k, v in m.items() if k != "token_ids"} for m in msgs]
    return tok.hf.apply_chat_template(plain, tokenize=True, add_generation_prompt=True, return_dict=False)


def test_template_history_equals_apply_chat_template(qwen3):
    msgs = _chat(qwen3)
    ctx = render(msgs, qwen3, add_generation_prompt=True, history="template")
    assert list(ctx.token_ids) == _hf(qwen3, msgs)
    assert ctx.drifts == ()
    assert qwen3.decode(list(ctx.token_ids)).count("<think>") == 0


def test_sampled_history_keeps_the_reasoning_with_its_reason(qwen3):
    msgs = _chat(qwen3)
    ctx = render(msgs, qwen3, add_generation_prompt=True)
    span = ctx.spans[1]
    assert ctx.token_ids[span.start:span.end] == tuple(qwen3.encode(THINK))
    (drift,) = ctx.drifts
    assert drift.reason == "thinking_stripped" and drift.rendered_ids == ()
    assert qwen3.decode(list(drift.sampled_ids)) == "<think>\n17 has no divisors.\n</think>\n\n"
    assert len(ctx.token_ids) == len(_hf(qwen3, msgs)) + len(drift.sampled_ids)


def test_template_history_keeps_sampled_ids_of_the_latest_turn(qwen3):
    """While no user turn follows, Qwen3 keeps the reasoning: the sampled ids stay, and so does the prefix."""
    r = IncrementalRenderer(qwen3, history="template")
    msgs = _chat(qwen3)
    r.extend(msgs[:2])
    first = r.render()
    assert first.token_ids[first.spans[1].start:first.spans[1].end] == tuple(qwen3.encode(THINK))
    r.append(msgs[2])
    after = r.render(add_generation_prompt=True)
    assert list(after.token_ids) == _hf(qwen3, msgs)  # now the template's render of the turn


def test_unknown_history_mode_is_refused(qwen3):
    with pytest.raises(ConfigError, match="history is 'verbatim'; expected one of \\['sampled', 'template'\\]"):
        IncrementalRenderer(qwen3, history="verbatim")
