"""Locating assistant turns that the template re-renders once later messages follow (issue 21).

The minimal Qwen3 case: a user message holding `<|im_end|>` text turns structural location off, and two
assistant turns in a row make Qwen3's template drop the first turn's empty think block, so its prefix
renders do not show the turn; ctxkit takes the turn the render writes between the generation prompt and
the end-of-turn token instead of refusing.
"""

from __future__ import annotations

import pytest

from conftest import tokenizer_dir
from ctxkit.benchmarks.family_conformance import masked_runs
from ctxkit.text.rendering.renderer import IncrementalRenderer, render
from ctxkit.text.tokenizer.loader import load_tokenizer

QWEN3_RUN = [
    {"role": "user", "content": "hi <|im_end|> there"},
    {"role": "assistant", "content": "a1"},
    {"role": "assistant", "content": "a2"},
]


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer(str(tokenizer_dir("qwen3")))


@pytest.mark.parametrize("agp", [False, True])
def test_qwen3_im_end_in_user_text_then_two_assistant_turns(qwen3, agp):
    ctx = render(QWEN3_RUN, qwen3, add_generation_prompt=agp)
    expected = qwen3.hf.apply_chat_template(QWEN3_RUN, tokenize=True, add_generation_prompt=agp, return_dict=False)
    assert list(ctx.token_ids) == list(expected)
    # a1 as history (Qwen3 drops its empty think block), a2 as the last turn (with it)
    assert masked_runs(qwen3, ctx) == ["a1<|im_end|>", "<think>\n\n</think>\n\na2<|im_end|>"]
    assert [(s.index, s.role) for s in ctx.spans] == [(0, "user"), (1, "assistant"), (2, "assistant")]
    inc = IncrementalRenderer(qwen3)
    for m in QWEN3_RUN:
        inc.append(m)
        inc.render(add_generation_prompt=agp)
    again = inc.render(add_generation_prompt=agp)
    assert again.token_ids == ctx.token_ids and again.loss_mask == ctx.loss_mask


REWRITES_USER = (
    "{% for m in messages %}{% if m.role == 'user' %}<|im_start|>user\n{{ m.content }}"
    "{% if not loop.last and messages[loop.index0 + 1].role == 'assistant' %} (answered){% endif %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""A template that rewrites the user message once an assistant turn follows it (text, not a closer, changes)."""


def test_a_rewritten_last_message_is_not_taken_for_the_turn(tmp_path):
    """Where the render without the turn ends otherwise than the render with it, the turn is taken from the
    common prefix only when all that changed is dropped special tokens (DeepSeek V3's tool block closer): a
    rewritten message's text stays out of the mask, and ids equal transformers'."""
    from ctxkit.text.template.chat_template import load_template

    qwen = load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))
    path = tmp_path / "rewrites_user.jinja"
    path.write_text(REWRITES_USER)
    # `<|im_end|>` text in the user message turns structural location off, so the turn is found from prefix renders
    msgs = [{"role": "user", "content": "hi <|im_end|> there"}, {"role": "assistant", "content": "a1"}]
    ctx = render(msgs, qwen, load_template(path, qwen))
    expected = qwen.hf.apply_chat_template(msgs, chat_template=REWRITES_USER, tokenize=True, return_dict=False)
    assert list(ctx.token_ids) == list(expected)
    assert masked_runs(qwen, ctx) == ["a1<|im_end|>"]
