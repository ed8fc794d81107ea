"""render(): golden ids and masks, token-in-token-out drift, typed errors, encode_assistant_turn, hashes."""

from __future__ import annotations

import hashlib
import struct

import pytest

from conftest import shared_path, tokenizer_dir
from ctxkit.errors import MessageFormatError, RenderError, TemplateError
from ctxkit.text.rendering.renderer import Drift, MessageSpan, context_hash, encode_assistant_turn, render
from ctxkit.text.tokenizer.loader import load_tokenizer

PLAIN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
]
TOOL = [
    {"role": "user", "content": "ls"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "abcdefghi", "type": "function", "function": {"name": "sh", "arguments": {"c": "ls"}}}]},
    {"role": "tool", "tool_call_id": "abcdefghi", "content": "a.txt"},
    {"role": "assistant", "content": "One file."},
]


def tok(name):
    return load_tokenizer(str(tokenizer_dir(name)))


# Golden lists, derived once and checked by hand: Qwen <|im_start|>=151644, <|im_end|>=151645, "\n"=198,
# "assistant"=77091, <tool_call>=151657, </tool_call>=151658, <think>=151667, </think>=151668;
# Mistral <s>=1, [INST]=3, [/INST]=4, [TOOL_CALLS]=5, </s>=2, [TOOL_RESULTS]=8, [/TOOL_RESULTS]=9;
# SmolLM2 <|im_start|>=1, <|im_end|>=2.
GOLDEN = {
    ("qwen2.5-instruct", "plain"): (
        [151644, 8948, 198, 3430, 9814, 13, 151645, 198, 151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198,
         9707, 0, 151645, 198],
        [0] * 17 + [1, 1, 1, 0],
    ),
    ("qwen2.5-instruct", "tool"): (
        [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525, 264, 10950, 17847, 13,
         151645, 198, 151644, 872, 198, 4730, 151645, 198, 151644, 77091, 198, 151657, 198, 4913, 606, 788, 330, 927,
         497, 330, 16370, 788, 5212, 66, 788, 330, 4730, 95642, 151658, 151645, 198, 151644, 872, 198, 27, 14172,
         9655, 397, 64, 3909, 198, 522, 14172, 9655, 29, 151645, 198, 151644, 77091, 198, 3966, 1034, 13, 151645, 198],
        [0] * 30 + [1] * 19 + [0] * 20 + [1, 1, 1, 1, 0],
    ),
    ("qwen3", "plain"): (
        [151644, 8948, 198, 3430, 9814, 13, 151645, 198, 151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198,
         151667, 271, 151668, 271, 9707, 0, 151645, 198],
        [0] * 17 + [1] * 7 + [0],
    ),
    ("qwen3", "tool"): (
        [151644, 872, 198, 4730, 151645, 198, 151644, 77091, 198, 151657, 198, 4913, 606, 788, 330, 927, 497, 330,
         16370, 788, 5212, 66, 788, 330, 4730, 95642, 151658, 151645, 198, 151644, 872, 198, 151665, 198, 64, 3909,
         198, 151666, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271, 3966, 1034, 13, 151645, 198],
        [0] * 9 + [1] * 19 + [0] * 15 + [1] * 8 + [0],
    ),
    ("mistral-7b-instruct-v0.3", "plain"): ([1, 3, 16127, 4, 23325, 29576, 2], [0, 0, 0, 0, 1, 1, 1]),
    ("mistral-7b-instruct-v0.3", "tool"): (
        [1, 3, 1073, 29481, 4, 5, 1501, 7567, 1629, 2032, 1113, 1579, 1316, 1113, 17452, 2032, 10598, 29485, 2032,
         1113, 5679, 8474, 1113, 1081, 2032, 1113, 17380, 2038, 1359, 29478, 29507, 10925, 2, 8, 10598, 4557, 2032,
         1032, 29491, 7856, 29493, 1113, 3613, 29498, 1081, 2032, 1113, 17380, 2038, 1359, 29478, 18163, 9, 3155,
         2497, 29491, 2],
        [0] * 5 + [1] * 28 + [0] * 20 + [1] * 4,
    ),
    ("smollm2-135m-instruct", "plain"): (
        [1, 9690, 198, 6077, 5453, 30, 2, 198, 1, 4093, 198, 26843, 2, 198, 1, 520, 9531, 198, 19556, 17, 2, 198],
        [0] * 18 + [1, 1, 1, 0],
    ),
}


@pytest.mark.parametrize("name,conv", sorted(GOLDEN))
def test_golden_ids_and_masks(name, conv):
    t = tok(name)
    msgs = PLAIN if conv == "plain" else TOOL
    ids, mask = GOLDEN[(name, conv)]
    assert len(ids) == len(mask)
    ctx = render(msgs, t)
    assert list(ctx.token_ids) == ids
    assert list(ctx.loss_mask) == mask
    assert list(ctx.token_ids) == t.hf.apply_chat_template(msgs, tokenize=True, return_dict=False)
    assert ctx.hash == context_hash(ids)
    assert ctx.tokenizer_id == t.id and ctx.template_id.startswith("tokenizer@sha256:")


def test_roles_and_spans_qwen():
    t = tok("qwen2.5-instruct")
    ctx = render(PLAIN, t, add_generation_prompt=False)
    assert ctx.spans == (MessageSpan(0, "system", 3, 6), MessageSpan(1, "user", 11, 12), MessageSpan(2, "assistant", 17, 20))
    assert ctx.roles[:3] == ("scaffold",) * 3
    assert ctx.roles[14:17] == ("generation_prompt",) * 3  # <|im_start|>assistant\n before the turn
    assert ctx.roles[17:20] == ("assistant",) * 3 and ctx.roles[20] == "scaffold"
    gen = render(PLAIN[:2], t, add_generation_prompt=True)
    assert gen.token_ids[-3:] == (151644, 77091, 198)
    assert gen.roles[-3:] == ("generation_prompt",) * 3 and gen.loss_mask[-3:] == (0, 0, 0)
    assert gen.token_ids == ctx.token_ids[:17]


def test_context_hash_definition():
    ids = [1, 151645, 0, 2**31 - 1]
    expected = hashlib.sha256(b"ctxkit-context-v1" + struct.pack("<4i", *ids)).hexdigest()
    assert context_hash(ids) == expected
    assert context_hash([]) == hashlib.sha256(b"ctxkit-context-v1").hexdigest()


def test_trl_training_template_marks_two_extra_tokens_per_turn():
    """TRL's Qwen2.5 training template (generation markers) masks the generation prompt's newline and the
    newline after <|im_end|>; ctxkit's marker-free mask does not, and is otherwise identical."""
    t = tok("qwen2.5-instruct")
    training = shared_path("tokenizers", "qwen2.5-instruct", "chat_template_training.jinja").read_text()
    msgs = PLAIN + [{"role": "user", "content": "More?"}, {"role": "assistant", "content": "No, that is all."}]
    ref = t.hf.apply_chat_template(msgs, chat_template=training, tokenize=True, return_dict=True,
                                   return_assistant_tokens_mask=True)
    ctx = render(msgs, t)
    assert list(ctx.token_ids) == ref["input_ids"]
    theirs, ours = ref["assistant_masks"], list(ctx.loss_mask)
    extra = [i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b]
    assert all(theirs[i] == 1 and ours[i] == 0 for i in extra)
    asst = [s for s in ctx.spans if s.role == "assistant"]
    expected_extra = sorted([s.start - 1 for s in asst] + [s.end for s in asst])
    assert extra == expected_extra and len(extra) == 2 * len(asst)
    assert all(ctx.token_ids[i] == 198 for i in extra)  # both are "\n"
    # the same template via ctxkit (markers ignored) renders the same ids and the same marker-free mask
    path = shared_path("tokenizers", "qwen2.5-instruct", "chat_template_training.jinja")
    again = render(msgs, t, template=str(path))
    assert again.token_ids == ctx.token_ids and again.loss_mask == ctx.loss_mask


# ------------------------------------------------------------------------------ token-in-token-out


def test_tito_keeps_sampled_ids_and_reports_drift():
    t = tok("qwen2.5-instruct")
    plain = t.encode("Hello world")
    assert plain == [9707, 1879]
    odd = t.encode("Hel") + t.encode("lo") + t.encode(" world")  # same text, different split
    assert t.decode(odd) == "Hello world" and odd != plain
    msgs = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello world", "token_ids": odd + [151645]},
            {"role": "user", "content": "Again"}]
    ctx = render(msgs, t, add_generation_prompt=True)
    reference = render([{k: v for k, v in m.items() if k != "token_ids"} for m in msgs], t, add_generation_prompt=True)
    span = ctx.spans[1]
    assert ctx.token_ids[span.start : span.end] == tuple(odd + [151645])
    assert all(ctx.loss_mask[span.start : span.end])
    assert len(ctx.token_ids) == len(reference.token_ids) + 1
    assert ctx.drifts == (Drift(1, span.start, tuple(odd[:2]), (9707,), "bpe_merge"),)
    # everything after the turn is the template's, shifted by one
    assert ctx.token_ids[span.end :] == reference.token_ids[reference.spans[1].end :]
    assert ctx.spans[2].start == reference.spans[2].start + 1
    assert ctx.hash == context_hash(ctx.token_ids) != reference.hash


def test_tito_identical_sampled_ids_have_no_drift():
    t = tok("qwen2.5-instruct")
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello world", "token_ids": [9707, 1879, 151645]}]
    ctx = render(msgs, t)
    assert ctx.drifts == ()
    assert ctx.token_ids == render([msgs[0], {"role": "assistant", "content": "Hello world"}], t).token_ids


def test_tito_finish_by_length_keeps_end_of_turn_as_scaffold():
    t = tok("qwen2.5-instruct")
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello world", "token_ids": [9707, 1879]},
            {"role": "user", "content": "Go on"}]
    ctx = render(msgs, t)
    span = ctx.spans[1]
    assert ctx.token_ids[span.start : span.end] == (9707, 1879)
    assert ctx.token_ids[span.end] == 151645 and ctx.loss_mask[span.end] == 0 and ctx.roles[span.end] == "scaffold"
    assert ctx.drifts == ()
    assert list(ctx.token_ids) == t.hf.apply_chat_template(
        [msgs[0], {"role": "assistant", "content": "Hello world"}, msgs[2]], tokenize=True, return_dict=False)


def test_encode_assistant_turn_matches_masked_ids():
    for name in ("qwen2.5-instruct", "mistral-7b-instruct-v0.3", "smollm2-135m-instruct"):
        t = tok(name)
        msgs = TOOL if name != "smollm2-135m-instruct" else PLAIN
        ctx = render(msgs, t)
        for span in ctx.spans:
            if span.role == "assistant":
                ids = encode_assistant_turn(msgs[span.index], t)
                assert ids == ctx.token_ids[span.start : span.end]
    t = tok("qwen2.5-instruct")
    assert encode_assistant_turn({"role": "assistant", "content": "Hello world"}, t) == (9707, 1879, 151645)
    with pytest.raises(MessageFormatError):
        encode_assistant_turn({"role": "user", "content": "x"}, t)


# ----------------------------------------------------------------------------------- typed errors


@pytest.mark.parametrize(
    "msgs,match",
    [
        ([{"role": "robot", "content": "x"}], r"message 0: unknown role 'robot'"),
        ([{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "nope", "content": "r"}],
         r"message 1: tool result answers tool_call_id 'nope'"),
        ([{"role": "tool", "content": "r"}], r"message 0: tool result without a tool_call_id"),
        ([{"role": "user", "content": 42}], r"message 0: content of type int is not supported"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], r"message 0: content part 0 is 'image_url'"),
        ([{"role": "user", "content": "x", "token_ids": [1]}], r"message 0: only assistant messages may carry token_ids"),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "token_ids": [-1]}], r"message 1: token_ids"),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "token_ids": [10**9]}], r"message 1: token_ids"),
        ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": {"id": 1}}], r"message 1: tool_calls must be a list"),
        (["not a dict"], r"message 0: expected a dict"),
    ],
)
def test_malformed_messages_raise_typed_errors(msgs, match):
    with pytest.raises(MessageFormatError, match=match):
        render(msgs, tok("qwen2.5-instruct"))


def test_template_exception_is_typed():
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]  # Mistral requires alternation
    with pytest.raises(TemplateError, match="alternate"):
        render(bad, tok("mistral-7b-instruct-v0.3"))


def test_unlocatable_turn_raises_render_error(tmp_path):
    """A template that renders an assistant turn differently from how it is produced when last: the
    per-turn locator cannot find it and says so, instead of returning a zero mask."""
    path = tmp_path / "rewrite.jinja"
    path.write_text(
        "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}<|im_start|>assistant\n[hidden]"
        "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    t = tok("qwen2.5-instruct")
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    with pytest.raises(RenderError, match="message 1"):
        render(msgs, t, template=str(path))
