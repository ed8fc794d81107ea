"""Vendor renderers against the Hugging Face templates on the generated family conversations, pinned.

Mistral v3 (mistral-common 1.13.1) against the stock Mistral 7B v0.3 template and tokenizer in shared/;
harmony (openai-harmony 0.0.8) against TRL's `gptoss` template on `tiktoken:o200k_harmony`. Each entry:
conversation, generation prompt -> (outcome, first differing token, its section, every differing section).
"""

from __future__ import annotations

import pytest

from conftest import SHARED, require_module, tokenizer_dir

MISTRAL_V3 = {
    "chat": ("different", 20, "user text", ("user text",)),  # HF drops the system prompt when an assistant ends
    "no-system": ("equal", None, None, ()),
    "reasoning": ("different", 13, "user text", ("user text",)),
    "tools": ("different", 82, "tool result", ("tool result",)),  # HF writes the result unquoted: {"content": alpha
    "tool-chain": ("vendor refuses", None, None, ()),  # content beside tool calls: mistral-common refuses, HF drops it
}
HARMONY = {
    "chat": ("different", 72, "developer (instructions, tools)", ("developer (instructions, tools)",)),
    "no-system": ("equal", None, None, ()),
    "reasoning": ("different", 72, "developer (instructions, tools)", ("developer (instructions, tools)",)),
    # HF renders one call per turn; its tool result is JSON-quoted from functions.x to=assistant
    "tools": ("different", 178, "assistant header", ("assistant header", "commentary", "between messages")),
    # content beside calls: harmony's commentary preamble, HF's analysis
    "tool-chain": ("different", 155, "assistant header", ("assistant header", "commentary", "between messages")),
}

HARMONY_PROMPT = dict(HARMONY, reasoning=("different", 72, "developer (instructions, tools)", (
    "developer (instructions, tools)", "analysis (reasoning)")))
"""With the generation prompt HF drops the last turn's analysis too; harmony keeps it."""


@pytest.fixture(scope="module")
def refs():
    require_module("mistral_common")
    require_module("sentencepiece")
    require_module("openai_harmony")
    require_module("trl")
    tokenizer_dir("mistral-7b-instruct-v0.3")
    from ctxkit.benchmarks.vendor_oracles import references

    return references(SHARED)


@pytest.mark.parametrize("vendor,agp,expected", [("mistral-v3", False, MISTRAL_V3), ("mistral-v3", True, MISTRAL_V3),
                                                  ("harmony", False, HARMONY), ("harmony", True, HARMONY_PROMPT)])
def test_vendor_against_hf_template(refs, vendor, agp, expected):
    from ctxkit.benchmarks.family_conversations import family_conversations
    from ctxkit.benchmarks.vendor_oracles import SPEC
    from ctxkit.text.vendor.compare import compare_vendor

    tok, tpl = refs[vendor]
    got = {}
    for name, (msgs, tools) in family_conversations(SPEC).items():
        c = compare_vendor(f"vendor:{vendor}", msgs, tok, tpl, tools=tools, add_generation_prompt=agp)
        got[name] = (c.outcome, c.position, c.kind, c.kinds)
    assert got == expected


def test_first_difference_snippets(refs):
    from ctxkit.benchmarks.family_conversations import family_conversations
    from ctxkit.benchmarks.vendor_oracles import SPEC
    from ctxkit.text.vendor.compare import compare_vendor

    tok, tpl = refs["mistral-v3"]
    msgs, tools = family_conversations(SPEC)["tools"]
    c = compare_vendor("vendor:mistral-v3", msgs, tok, tpl, tools=tools)
    assert c.vendor.startswith("vendor:mistral-v3/mistral-common-") and c.template == tpl.id
    assert c.lengths == (277, 275)
    assert c.vendor_text == '00002"}]</s>[TOOL_RESULTS]▁{"content":▁"alpha",▁"call_id":▁"call00'
    assert c.template_text == '00002"}]</s>[TOOL_RESULTS] {"content": alpha, "call_id": "call000'
    refused = compare_vendor("vendor:mistral-v3", *family_conversations(SPEC)["tool-chain"][:1], tok, tpl,
                             tools=tools)
    assert refused.outcome == "vendor refuses" and "content or tool_calls, but not both" in refused.error


def test_first_difference_positions():
    from ctxkit.text.vendor.compare import first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
