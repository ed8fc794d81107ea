"""Vendor renderers (`ctxkit.text.vendor`): mistral-common and openai-harmony as oracles and as `render` templates.

Golden ids were computed once through each vendor (mistral-common 1.13.1, openai-harmony 0.0.8) on one small
tool conversation and pinned; the loss mask is pinned by its spans (the assistant turns' token ranges).
"""

from __future__ import annotations

import pickle

import pytest

from conftest import require_module, tokenizer_dir

from ctxkit.errors import ConfigError, RenderError, TemplateError, VendorRenderError

TOOLS = [{"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
MSGS = [
    {"role": "user", "content": "Read a.txt"},
    {"role": "assistant", "content": "", "reasoning_content": "Use read.", "tool_calls": [
        {"id": "call00001", "type": "function", "function": {"name": "read", "arguments": {"path": "a.txt"}}}]},
    {"role": "tool", "tool_call_id": "call00001", "name": "read", "content": "alpha"},
    {"role": "assistant", "content": "It says alpha."},
]
"""One tool round trip: a call (with reasoning beside it) and a final answer."""

GOLDEN = {
    "mistral-v3": (
        [
        1, 6, 1501, 7567, 1891, 2032, 1113, 3396, 1316, 1113, 3396, 2032, 10598, 1629, 2032, 1113, 1691, 1316,
        1113, 7286, 2032, 1113, 4158, 1032, 2497, 9959, 1113, 12206, 2032, 10598, 1891, 2032, 1113, 3582, 1316,
        1113, 11491, 2032, 10598, 2508, 2032, 10598, 1891, 2032, 1113, 2195, 29507, 11549, 1113, 11661, 2032,
        8135, 2508, 3010, 1743, 10925, 7, 3, 5707, 1032, 29491, 7856, 4, 5, 1501, 7567, 1629, 2032, 1113, 1691,
        1316, 1113, 17452, 2032, 10598, 2508, 2032, 1113, 29476, 29491, 7856, 8474, 1113, 1081, 2032, 1113,
        3613, 29502, 29502, 29502, 29502, 29508, 29507, 10925, 2, 8, 10598, 4557, 2032, 1113, 3075, 1316, 1113,
        3613, 29498, 1081, 2032, 1113, 3613, 29502, 29502, 29502, 29502, 29508, 18163, 9, 1429, 3395, 16695,
        29491, 2
        ],
        ((1, 63, 95), (3, 116, 121)),
    ),
    "mistral-v7": (
        [
        1, 6, 1501, 7567, 1891, 2032, 1113, 3396, 1316, 1113, 3396, 2032, 10598, 1629, 2032, 1113, 1691, 1316,
        1113, 7286, 2032, 1113, 4158, 1032, 2497, 9959, 1113, 12206, 2032, 10598, 1891, 2032, 1113, 3582, 1316,
        1113, 11491, 2032, 10598, 2508, 2032, 10598, 1891, 2032, 1113, 2195, 29507, 11549, 1113, 11661, 2032,
        8135, 2508, 3010, 1743, 10925, 7, 3, 5707, 1032, 29491, 7856, 4, 5, 1501, 7567, 1629, 2032, 1113, 1691,
        1316, 1113, 17452, 2032, 10598, 2508, 2032, 1113, 29476, 29491, 7856, 8474, 1113, 1081, 2032, 1113,
        3613, 29502, 29502, 29502, 29502, 29508, 29507, 10925, 2, 8, 1802, 29502, 29502, 29502, 29502, 29508,
        18, 16695, 9, 1429, 3395, 16695, 29491, 2
        ],
        ((1, 63, 95), (3, 105, 110)),
    ),
    "mistral-tekken": (
        [
        1, 5, 1091, 19227, 4994, 2811, 1429, 5165, 1897, 1429, 5165, 2811, 16753, 2391, 2811, 1429, 2633, 1897,
        1429, 14653, 2811, 1429, 10311, 1261, 3323, 39249, 1429, 26204, 2811, 16753, 4994, 2811, 1429, 6371,
        1897, 1429, 48649, 2811, 16753, 7368, 2811, 16753, 4994, 2811, 1429, 3607, 1034, 47579, 1429, 15760,
        2811, 12161, 7368, 4964, 2821, 27028, 6, 3, 10311, 1261, 13477, 4, 9, 1091, 19227, 2391, 2811, 1429,
        2633, 1897, 1429, 61906, 2811, 16753, 7368, 2811, 1429, 1097, 13477, 50666, 1429, 1327, 2811, 1429,
        19881, 1048, 1048, 1048, 1048, 1049, 1034, 27028, 2, 7, 19227, 5431, 2811, 1429, 6385, 1897, 1429,
        19881, 3384, 2811, 1429, 19881, 1048, 1048, 1048, 1048, 1049, 46005, 8, 2757, 8223, 17341, 1046, 2
        ],
        ((1, 62, 93), (3, 113, 118)),
    ),
    "harmony": (
        [
        200006, 17360, 200008, 3575, 553, 17554, 162016, 11, 261, 4410, 6439, 2359, 22203, 656, 7788, 17527,
        558, 87447, 100594, 25, 220, 1323, 19, 12, 3218, 198, 6576, 3521, 25, 220, 1323, 21, 12, 2290, 12, 2290,
        279, 30377, 289, 25, 14093, 279, 2, 13888, 18403, 25, 8450, 11, 49159, 11, 1721, 13, 21030, 2804, 413,
        7360, 395, 1753, 3176, 558, 63446, 316, 1879, 8437, 2804, 810, 316, 290, 49159, 9334, 25, 461, 44580,
        6120, 200007, 200006, 77944, 200008, 2, 20574, 279, 877, 9964, 279, 4797, 9964, 95359, 5405, 261, 1974,
        558, 2493, 1729, 314, 11350, 25, 405, 4189, 25, 1621, 412, 9263, 871, 1062, 502, 92, 602, 9819, 9964,
        200007, 200006, 1428, 200008, 4455, 261, 7186, 200007, 200006, 173781, 316, 28, 44580, 7211, 200005,
        12606, 815, 5701, 200008, 10848, 4189, 1243, 392, 64, 7186, 18583, 200012, 200006, 44580, 7211, 316, 28,
        173781, 200005, 12606, 815, 200008, 15453, 200007, 200006, 173781, 200005, 17196, 200008, 3206, 5003,
        17406, 13, 200002
        ],
        ((1, 119, 136), (3, 150, 158)),
    ),
}
"""vendor -> (ids, spans of the assistant turns as (message, start, end))."""


@pytest.fixture(scope="module", autouse=True)
def vendor_packages():
    require_module("mistral_common")
    require_module("sentencepiece")
    require_module("openai_harmony")


def _render(vendor: str, msgs=MSGS, tools=TOOLS, agp: bool = False, tokenizer=None):
    from ctxkit.text.rendering.renderer import render

    return render(msgs, tokenizer, template=f"vendor:{vendor}", tools=tools, add_generation_prompt=agp)


@pytest.mark.parametrize("vendor", sorted(GOLDEN))
def test_golden_ids_and_mask(vendor):
    ids, spans = GOLDEN[vendor]
    ctx = _render(vendor)
    assert list(ctx.token_ids) == ids
    assert tuple((s.index, s.start, s.end) for s in ctx.spans if s.end > s.start) == spans
    masked = {p for _, a, z in spans for p in range(a, z)}
    assert [p for p, m in enumerate(ctx.loss_mask) if m] == sorted(masked)
    assert all(r == ("assistant" if p in masked else "scaffold") for p, r in enumerate(ctx.roles))


def test_template_id_records_the_vendor_and_its_version():
    from importlib.metadata import version

    ctx = _render("mistral-v7")
    assert ctx.template_id.startswith(f"vendor:mistral-v7/mistral-common-{version('mistral-common')}@sha256:")
    assert ctx.tokenizer_id.startswith("mistral-common:mistral_instruct_tokenizer_241114.model.v7@sha256:")
    ctx = _render("harmony")
    assert ctx.template_id.startswith(f"vendor:harmony/openai-harmony-{version('openai-harmony')}@sha256:")
    assert ctx.tokenizer_id.startswith("openai-harmony:o200k_harmony@sha256:")
    assert _render("harmony-keep-analysis").template_id.split("@")[1] != ctx.template_id.split("@")[1]


def test_mask_text_is_what_the_policy_writes():
    from ctxkit.text.vendor.oracle import load_vendor

    oracle = load_vendor("vendor:harmony")
    ctx = _render("harmony")
    runs = [oracle.decode([t for t, m in zip(ctx.token_ids[s.start:s.end], ctx.loss_mask[s.start:s.end]) if m])
            for s in ctx.spans if s.end > s.start]
    # harmony drops the analysis of a tool-call turn that a later final closes; the opener is the prompt's
    assert runs == [' to=functions.read<|channel|>commentary json<|message|>{"path": "a.txt"}<|call|>',
                    "<|channel|>final<|message|>It says alpha.<|return|>"]
    kept = _render("harmony-keep-analysis")
    first = kept.spans[1]
    assert oracle.decode(kept.token_ids[first.start:first.end]).startswith(
        "<|channel|>analysis<|message|>Use read.<|end|><|start|>assistant to=functions.read")


def test_generation_prompt_tokens():
    ctx = _render("harmony", msgs=MSGS[:3], agp=True)
    assert ctx.roles[-2:] == ("generation_prompt", "generation_prompt")  # <|start|> assistant
    assert list(ctx.token_ids[-2:]) == [200006, 173781]
    assert _render("mistral-v3", msgs=MSGS[:3], agp=True).token_ids == _render("mistral-v3", msgs=MSGS[:3]).token_ids


def test_unknown_vendor_is_a_template_error():
    from ctxkit.text.template.chat_template import load_template
    from ctxkit.text.tokenizer.loader import load_tokenizer

    with pytest.raises(TemplateError, match=r"unknown vendor renderer 'vendor:mistral'; available: \['vendor:harmony'"):
        _render("mistral")
    tok = load_tokenizer(str(tokenizer_dir("mistral-7b-instruct-v0.3")))
    with pytest.raises(TemplateError, match="is a vendor renderer, not a chat template"):
        load_template("vendor:mistral-v3", tok)


def test_conversation_the_vendor_rejects():
    both = [{"role": "user", "content": "Fix it."},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "call00003", "type": "function", "function": {"name": "read", "arguments": {"path": "m.c"}}}]}]
    with pytest.raises(VendorRenderError, match="content or tool_calls, but not both") as info:
        _render("mistral-v3", msgs=both)
    assert isinstance(info.value, RenderError) and info.value.vendor == "mistral-v3"
    assert pickle.loads(pickle.dumps(info.value)).reason == info.value.reason
    from ctxkit.text.vendor.oracle import load_vendor

    ctx = _render("mistral-v7", msgs=both)  # v7 takes both: the content, then the calls
    assert load_vendor("vendor:mistral-v7").decode([t for t, m in zip(ctx.token_ids, ctx.loss_mask) if m]) == (
        '▁Let▁me▁look.[TOOL_CALLS]▁[{"name":▁"read",▁"arguments":▁{"path":▁"m.c"},▁"id":▁"call00003"}]</s>')
    bad_id = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]}]
    with pytest.raises(VendorRenderError, match="vendor:mistral-tekken"):
        _render("mistral-tekken", msgs=bad_id)


def test_sampled_ids_and_special_token_policy_are_refused():
    from ctxkit.text.rendering.renderer import render

    sampled = MSGS[:1] + [{"role": "assistant", "content": "hi", "token_ids": [1, 2]}]
    with pytest.raises(VendorRenderError, match=r"\(message 1\): sampled token_ids are not taken"):
        _render("harmony", msgs=sampled, tools=None)
    with pytest.raises(ConfigError, match="special_tokens='escape' does not apply"):
        render(MSGS, None, template="vendor:harmony", tools=TOOLS, special_tokens="escape")


def test_tokenizer_must_be_the_vendors():
    from ctxkit.text.tokenizer.loader import load_tokenizer

    v3 = load_tokenizer(str(tokenizer_dir("mistral-7b-instruct-v0.3")))  # converted from the same model.v3
    ctx = _render("mistral-v3", tokenizer=v3)
    assert list(ctx.token_ids) == GOLDEN["mistral-v3"][0] and ctx.tokenizer_id == v3.id
    assert list(_render("harmony", tokenizer="tiktoken:o200k_harmony").token_ids) == GOLDEN["harmony"][0]
    with pytest.raises(ConfigError, match="is not the vocabulary of vendor:mistral-v7"):
        _render("mistral-v7", tokenizer=load_tokenizer(str(tokenizer_dir("qwen2.5-instruct"))))


def test_harmony_reads_the_rank_file_offline(monkeypatch, tmp_path):
    from ctxkit.errors import TokenizerError
    from ctxkit.text.vendor import harmony

    monkeypatch.setattr(harmony, "tiktoken_search_dirs", lambda: [tmp_path])
    with pytest.raises(TokenizerError, match=f"needs 'o200k_base.tiktoken', not found offline in \\['{tmp_path}'\\]"):
        harmony.HarmonyOracle.load("harmony", keep_analysis=False)


def test_importing_the_renderer_loads_no_vendor_package():
    import subprocess
    import sys

    code = ("import sys, ctxkit; ctxkit.render; import ctxkit.text.vendor; "
            "print(sorted(m for m in ('mistral_common', 'openai_harmony', 'sentencepiece') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("vendor,special", [("harmony", 200007), ("mistral-v3", 3), ("mistral-tekken", 3)])
def test_special_token_text_in_content_stays_text(vendor, special):
    from ctxkit.text.vendor.oracle import load_vendor

    msgs = [{"role": "user", "content": "hi <|end|> [INST] there"}, {"role": "assistant", "content": "ok"}]
    ctx = _render(vendor, msgs=msgs, tools=None)
    oracle = load_vendor(f"vendor:{vendor}")
    assert "<|end|> [INST] there" in oracle.decode(ctx.token_ids).replace("▁", " ")  # sentencepiece writes ▁
    assert list(ctx.token_ids).count(special) == (2 if vendor == "harmony" else 1)  # the scaffold's own only
