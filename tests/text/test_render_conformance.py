"""Conformance: `render` gives exactly `apply_chat_template`'s ids (and tiktoken's for ChatML), and its
loss mask equals the independently derived "end of generation prompt .. end-of-turn" span."""

from __future__ import annotations

import random

import pytest

from conftest import tokenizer_dir
from ctxkit.text.rendering.renderer import render
from ctxkit.text.tokenizer.loader import load_tokenizer
from render_cases import conversation

N_CONVERSATIONS = 300

FAMILIES = {
    "qwen2.5-instruct": "qwen",
    "qwen3": "qwen3",
    "mistral-7b-instruct-v0.3": "mistral",
    "smollm2-135m-instruct": "smollm",
}
PREFIX_PRESERVING = {"qwen2.5-instruct": True, "qwen3": False, "mistral-7b-instruct-v0.3": False, "smollm2-135m-instruct": True}
END_OF_TURN = {"qwen2.5-instruct": "<|im_end|>", "qwen3": "<|im_end|>", "mistral-7b-instruct-v0.3": "</s>",
               "smollm2-135m-instruct": "<|im_end|>"}


def _hf_ids(hf, msgs, tools, agp):
    return list(hf.apply_chat_template(msgs, tools=tools, tokenize=True, add_generation_prompt=agp, return_dict=False))


def _expected_mask_hf(hf, msgs, tools, agp, eot):
    """Mask from transformers alone: for each assistant turn i, the text between the end of
    render(msgs[:i], generation prompt) and the end-of-turn token closing render(msgs[:i+1]), mapped to
    tokens through the HF tokenizer's own offsets."""
    text = hf.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=agp)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before = hf.apply_chat_template(msgs[:i], tools=tools, tokenize=False, add_generation_prompt=True)
        after = hf.apply_chat_template(msgs[: i + 1], tools=tools, tokenize=False)
        assert after.startswith(before) and text.startswith(after)
        end = after.index(eot, len(before)) + len(eot)
        spans.append((len(before), end))
    enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = []
    for start, _ in enc["offset_mapping"]:
        mask.append(int(any(a <= start < b for a, b in spans)))
    return enc["input_ids"], mask


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_identical_ids_and_masks(name):
    tok = load_tokenizer(str(tokenizer_dir(name)))
    hf = tok.hf
    eot = END_OF_TURN[name]
    eot_id = tok.special_tokens[eot]
    rng = random.Random(f"conformance-{name}")
    checked = {"renders": 0, "assistant_turns": 0, "masks_vs_reference": 0}
    for n in range(N_CONVERSATIONS):
        msgs, tools = conversation(rng, FAMILIES[name])
        for agp in (False, True):
            expected = _hf_ids(hf, msgs, tools, agp)
            ctx = render(msgs, tok, tools=tools, add_generation_prompt=agp)
            assert list(ctx.token_ids) == expected, (name, n, agp)
            assert len(ctx.loss_mask) == len(ctx.roles) == len(ctx.token_ids)
            assert ctx.prefix_preserving is PREFIX_PRESERVING[name]
            checked["renders"] += 1
            asst = [s for s in ctx.spans if s.role == "assistant"]
            assert len(asst) == sum(m["role"] == "assistant" for m in msgs)
            for span in asst:
                run = ctx.token_ids[span.start : span.end]
                assert run and run[-1] == eot_id, (name, n, span)  # each turn ends with its end-of-turn token
                assert all(ctx.loss_mask[span.start : span.end])
                checked["assistant_turns"] += 1
            assert sum(ctx.loss_mask) == sum(s.end - s.start for s in asst)
            if PREFIX_PRESERVING[name]:
                ref_ids, ref_mask = _expected_mask_hf(hf, msgs, tools, agp, eot)
                assert ref_ids == expected
                assert list(ctx.loss_mask) == ref_mask, (name, n, agp)
                checked["masks_vs_reference"] += 1
            else:
                # what is rendered is masked: each masked turn decodes to the assistant's own text
                for span in asst:
                    msg = msgs[span.index]
                    decoded = tok.decode(ctx.token_ids[span.start : span.end])
                    body = (msg.get("content") or "").strip()
                    assert decoded.endswith(eot)
                    if body and not (name == "mistral-7b-instruct-v0.3" and msg.get("tool_calls")):
                        assert body in decoded, (name, n, decoded, body)
    assert checked["renders"] == 2 * N_CONVERSATIONS
    assert checked["assistant_turns"] > N_CONVERSATIONS


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_chatml_tiktoken_matches_tiktoken(encoding, tiktoken_dir):
    """chatml-tools-v1 through a tiktoken encoding: ids equal tiktoken's own encoding of the rendered text;
    the mask equals the generation-prompt .. <|im_end|> span of every assistant turn."""
    tok = load_tokenizer(f"tiktoken:{encoding}")
    from ctxkit.text.template.chat_template import load_template

    tpl = load_template("chatml-tools-v1", tok)
    enc = tok.encoding
    im_end = tok.special_tokens["<|im_end|>"]
    rng = random.Random(f"chatml-{encoding}")
    for n in range(N_CONVERSATIONS):
        msgs, tools = conversation(rng, "chatml")
        for agp in (False, True):
            text = tpl.render_text(msgs, tools=tools, add_generation_prompt=agp)
            expected = enc.encode(text, allowed_special="all")
            ctx = render(msgs, tok, "chatml-tools-v1", tools=tools, add_generation_prompt=agp)
            assert list(ctx.token_ids) == expected, (n, agp)
            assert ctx.prefix_preserving
            # reference mask from text prefixes and tiktoken's own offsets
            spans = []
            for i, m in enumerate(msgs):
                if m["role"] == "assistant":
                    before = tpl.render_text(msgs[:i], tools=tools, add_generation_prompt=True)
                    after = tpl.render_text(msgs[: i + 1], tools=tools)
                    assert after.startswith(before) and text.startswith(after)
                    spans.append((len(before), after.index("<|im_end|>", len(before)) + len("<|im_end|>")))
            _, offsets = enc.decode_with_offsets(expected)
            ref = [int(any(a <= o < b for a, b in spans)) for o in offsets]
            assert list(ctx.loss_mask) == ref, (n, agp)
            assert ctx.loss_mask.count(1) == 0 or im_end in [t for t, k in zip(ctx.token_ids, ctx.loss_mask) if k]
