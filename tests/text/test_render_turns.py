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
