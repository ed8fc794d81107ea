"""Conformance suite over every stock chat template TRL ships (`ctxkit.benchmarks.family_conformance`).

Each family renders through the shared Qwen2.5 BPE plus the special tokens it uses (`FAMILIES`); the
templates are read from the installed `trl` at test time. ids must equal `apply_chat_template` (or both
refuse), and the mask must cover no user or tool text; a conversation ctxkit still refuses is a strict
xfail naming why, so the suite flips when it is fixed. Masks against TRL's `_training` variants differ
where TRL marks tokens the policy never samples: each family's differences are pinned in `MASK_DIFFS`.
"""

from __future__ import annotations

import pytest

from conftest import require_module, shared_path
from ctxkit.benchmarks.family_conformance import masked_runs
from ctxkit.benchmarks.family_conversations import family_conversations
from ctxkit.benchmarks.template_families import FAMILIES, family_spec, stock_templates, training_name
from ctxkit.errors import ConfigError, RenderError

try:
    SHIPPED = stock_templates()
except ConfigError:  # trl not installed: test_every_stock_template_has_an_entry says so
    SHIPPED = []

KNOWN_FAILURES: dict[tuple[str, str], str] = {}
"""(family, conversation) -> why ctxkit still refuses it (a typed `RenderError`, never a silent mask)."""

KNOWN_MASK_FAILURES: dict[tuple[str, str], str] = {}
"""(family, conversation) -> why ctxkit refuses the `_training` variant's render (pinned: a fix flips the test)."""

_TRL_HEADER = "TRL marks the generation prompt's tokens, which the policy never samples"
_TRL_NEWLINE = "TRL marks the newline after the end-of-turn token, which the policy never samples"
_TRL_THINK = "the training variant prefills <think> in the prompt but marks it inside the turn"
MASK_DIFFS: dict[str, tuple[frozenset, str]] = {
    "deepseek_r1_distill": (frozenset({("<｜Assistant｜>", "trl"), ("<｜tool▁outputs▁end｜>", "trl")}), _TRL_HEADER),
    "deepseekv3": (frozenset({("<｜Assistant｜>", "trl"), ("<｜tool▁outputs▁end｜>", "trl")}), _TRL_HEADER),
    "diffusion_gemma": (frozenset({("\n", "trl"), ("Let", "trl"), (" me", "trl"), (" look", "trl"), (".", "trl"),
                                   ("<|tool_response>", "ctxkit")}),
                        f"{_TRL_NEWLINE}; TRL marks a tool-call turn's content, which the template writes after the tool "
                        "responses, where it was never sampled, and not the <|tool_response> that ends the calls as "
                        "the turn is rendered last"),
    "gemma3": (frozenset({("\n", "trl")}), _TRL_NEWLINE),
    "gptoss": (frozenset({("<|start|>", "trl"), ("assistant", "trl")}), _TRL_HEADER),
    "idefics3": (frozenset({("\n", "trl")}), _TRL_NEWLINE),
    "lfm2": (frozenset({("\n", "trl")}), _TRL_NEWLINE),
    "lfm2_v2": (frozenset({("\n", "trl")}), _TRL_NEWLINE),
    "muse_glimmer": (frozenset({("<|start|>", "trl"), ("assistant", "trl")}), _TRL_HEADER),
    **{f: (frozenset({("\n", "trl"), ("<think>", "trl")}), f"{_TRL_NEWLINE}; {_TRL_THINK}")
       for f in ("nemotron_3_5_lightning", "nemotron_3_nano", "nemotron_3_super", "nemotron_3_ultra")},
    "phi3": (frozenset({("\n", "trl"), ("<|endoftext|>", "trl")}), "TRL marks the newline and <|endoftext|> after <|end|>"),
    "phi3_5": (frozenset({("\n", "trl"), ("<|endoftext|>", "trl")}), "TRL marks the newline and <|endoftext|> after <|end|>"),
    "qwen2_5": (frozenset({("\n", "trl")}), _TRL_NEWLINE),
    "qwen2_5_vl": (frozenset({("\n", "trl")}), _TRL_NEWLINE),
    "qwen3": (frozenset({("\n", "trl")}), _TRL_NEWLINE),
    "qwen3_5_nothink": (frozenset({("\n", "trl"), ("\n\n", "trl"), ("</think>", "trl"), ("<think>", "trl")}),
                        f"{_TRL_NEWLINE}; the training variant's empty think block is prompt text TRL marks"),
    **{f: (frozenset({("\n", "trl"), ("\n\n", "trl"), ("<think>", "trl")}), f"{_TRL_NEWLINE}; {_TRL_THINK}")
       for f in ("qwen3_5_think", "qwen3_6", "qwen3_8")},
    "qwen3_instruct_2507": (frozenset({("\n", "trl")}), _TRL_NEWLINE),
    "qwen3_vl": (frozenset({("\n", "trl")}), _TRL_NEWLINE),
    "smolvlm": (frozenset({("\n", "trl")}), _TRL_NEWLINE),
}
"""family -> (every `(token text, side)` where ctxkit's mask and the `_training` variant's differ, why)."""


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """Family tokenizers written once for the module and loaded once each (ctxkit and transformers)."""
    from ctxkit.benchmarks.family_conformance import FamilyHarness

    require_module("transformers")
    require_module("trl")
    return FamilyHarness(shared_path("tokenizers").parent, tmp_path_factory.mktemp("families"))


FAST_FAMILIES = frozenset({"gptoss", "qwen3", "qwen3_5_think", "qwen3_6", "deepseek_r1_distill", "nemotron_3_nano",
                           "llama3_2", "gemma3", "gemma4", "qwen2_5"})
"""The families the fast lane renders (the most used, and one per renderer fix); the rest run in the slow
lane: building and loading a family's tokenizer twice costs about a second each."""


def _cases():
    for family in SHIPPED:
        for conversation in family_conversations(family_spec(family)):
            reason = KNOWN_FAILURES.get((family, conversation))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            if family not in FAST_FAMILIES:
                marks.append(pytest.mark.slow)
            yield pytest.param(family, conversation, id=f"{family}-{conversation}", marks=marks)


def test_every_stock_template_has_an_entry():
    require_module("trl")
    assert SHIPPED and set(SHIPPED) <= set(FAMILIES), set(SHIPPED) - set(FAMILIES)  # a new template needs an entry
    assert set(MASK_DIFFS) <= {f for f in SHIPPED if training_name(f)}


@pytest.mark.parametrize(("family", "conversation"), list(_cases()))
def test_ids_equal_apply_chat_template(harness, family, conversation):
    from ctxkit.benchmarks.family_conformance import check_ids, today

    for agp in (False, True):
        r = check_ids(harness, family, conversation, agp)
        assert r.outcome in ("equal", "both refuse"), (agp, r.outcome, r.error)
        assert r.date == today().date().isoformat()
        if r.outcome == "both refuse":
            assert r.error.startswith("TemplateError: ")  # the template's own refusal, typed


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in SHIPPED if training_name(f)])
def test_masks_equal_training_variant_or_pinned(harness, family):
    from ctxkit.benchmarks.family_conformance import check_mask

    seen: set = set()
    for conversation in family_conversations(family_spec(family)):
        for agp in (False, True):
            m = check_mask(harness, family, conversation, agp)
            if (family, conversation) in KNOWN_FAILURES:
                assert m.outcome in ("ctxkit refuses", "equal", "masks differ"), m
                continue
            if (family, conversation) in KNOWN_MASK_FAILURES:
                assert m.outcome == "ctxkit refuses" and m.error.startswith("RenderError: "), m
                continue
            assert m.outcome in ("equal", "masks differ", "both refuse"), (conversation, agp, m)
            seen.update(m.diffs)
    expected, _why = MASK_DIFFS.get(family, (frozenset(), ""))
    assert seen == expected


def test_gptoss_closes_turns_with_return_end_and_call(harness):
    """gpt-oss ends only the last final turn with <|return|>; history with <|end|>, a tool call with <|call|>."""
    from ctxkit.text.template.chat_template import load_template
    from ctxkit.text.template.profile import template_profile

    tok, _, _ = harness.load("gptoss")
    profile = template_profile(tok, load_template(None, tok))
    assert profile.end_of_turn == "<|return|>"
    assert set(profile.turn_closers) == {"<|return|>", "<|end|>", "<|call|>"}


_G4_CALLS = '<|tool_call>call:read_file{path:<|"|>a.txt<|"|>}<tool_call|><|tool_call>call:read_file{path:<|"|>b.txt<|"|>}<tool_call|>'
_G4_MAKE = '<|tool_call>call:run_shell{cmd:<|"|>make<|"|>}<tool_call|>'
_G4_READ = '<|channel>thought\nRead the file.\n<channel|><|tool_call>call:read_file{path:<|"|>main.c<|"|>}<tool_call|>'


@pytest.mark.parametrize("family", ["gemma4", "gemma4_v5", "diffusion_gemma"])
def test_gemma4_tool_responses_inside_the_model_turn_are_left_out_of_the_mask(harness, family):
    """Gemma 4 writes tool responses inside the model turn, after the calls: a tool-call turn rendered last ends
    with `<|tool_response>`, which is its closer (the model stops there), so the mask holds the calls and that
    token and none of the response; the reply after the responses is masked as rendered (v5 drops its
    reasoning there). The content of a turn with calls ("Let me look.") is written after the responses in
    history, where no turn of it was sampled: it stays unmasked (the template rewrote the turn)."""
    from ctxkit.text.rendering.renderer import render

    tok, hf, _ = harness.load(family)
    masked = {}
    for conversation in ("tools", "tool-chain"):
        msgs, tools = family_conversations(family_spec(family))[conversation]
        ctx = render(msgs, tok, tools=tools)
        assert list(ctx.token_ids) == list(hf.apply_chat_template(msgs, tools=tools, tokenize=True, return_dict=False))
        masked[conversation] = masked_runs(tok, ctx)
    assert masked["tools"] == [_G4_CALLS + "<|tool_response>", "a.txt says alpha; b.txt is missing.<turn|>"]
    assert masked["tool-chain"] == [_G4_MAKE + "<|tool_response>", _G4_READ + "<|tool_response>"]


@pytest.mark.parametrize("family", ["gemma4", "gemma4_v5"])
def test_gemma4_sampled_calls_then_content_as_the_next_message(harness, family):
    """How a Gemma 4 policy samples a tool turn: the calls (ending at `<|tool_response>`, where it stops), then,
    once the results are in, the rest of its turn, which the template writes as the next assistant message's
    content without opening a turn. Given so with sampled ids, the ids equal `apply_chat_template` and the
    mask holds both samples and no result. One message holding the calls and that content with one set of
    sampled ids is refused with a typed error saying how to give it (the template writes the content after
    the results, so no single sample was rendered so)."""
    from ctxkit.text.rendering.renderer import IncrementalRenderer, encode_assistant_turn

    tok, hf, _ = harness.load(family)
    call = {"id": "c1", "type": "function", "function": {"name": "run_shell", "arguments": {"cmd": "make"}}}
    calls = {"role": "assistant", "content": None, "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "c1", "name": "run_shell", "content": "error: missing semicolon"}
    reply = {"role": "assistant", "content": "Fixed it."}
    inc = IncrementalRenderer(tok, special_tokens="allow")
    inc.append({"role": "user", "content": "Fix the build."})
    for msg in (calls, result, reply):
        ids = list(encode_assistant_turn(msg, tok, inc.template)) if msg["role"] == "assistant" else None
        inc.append(dict(msg, token_ids=ids) if ids else msg)
    ctx = inc.render()
    msgs = [{"role": "user", "content": "Fix the build."}, calls, result, reply]
    assert list(ctx.token_ids) == list(hf.apply_chat_template(msgs, tokenize=True, return_dict=False))
    assert masked_runs(tok, ctx) == [_G4_MAKE + "<|tool_response>", "Fixed it.<turn|>"]
    both = dict(calls, content="Let me look.")
    inc = IncrementalRenderer(tok, special_tokens="allow")
    inc.extend([{"role": "user", "content": "Fix the build."},
                dict(both, token_ids=list(encode_assistant_turn(both, tok, inc.template))), result])
    with pytest.raises(RenderError, match=r"message 2 \(tool\): .* and that turn's content after it .* give the calls "
                                          r"with their sampled ids, then the content as the next assistant message"):
        inc.render()


def _history_with_content_beside_the_calls() -> list[dict]:
    """Two tool-call turns in OpenAI form (content beside the calls), their results and a final reply."""
    call = lambda k: {"id": f"c{k}", "type": "function", "function": {"name": "run_shell", "arguments": {"cmd": f"make {k}"}}}
    return [{"role": "user", "content": "Fix the build."},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [call(1)]},
            {"role": "tool", "tool_call_id": "c1", "name": "run_shell", "content": "error 1"},
            {"role": "assistant", "content": "Once more.\n\n", "tool_calls": [call(2)]},
            {"role": "tool", "tool_call_id": "c2", "name": "run_shell", "content": "ok"},
            {"role": "assistant", "content": "Fixed it."}]


@pytest.mark.parametrize("family", ["gemma4", "gemma4_v3"])
def test_gemma4_history_with_content_beside_the_calls(harness, family):
    """OpenAI-form history, every assistant turn with content and calls: Gemma 4 writes a later turn's content
    after its tool responses (trimmed), where no sample of it was rendered, so the turn is located by its calls
    alone: ids equal `apply_chat_template`, the mask holds each turn's calls and `<|tool_response>` and the final
    reply, none of the responses or the moved content. A reply sampled after such history is the policy's ids,
    masked. With sampled ids on a turn whose content moves the render is refused, saying how to give it."""
    from ctxkit.text.rendering.renderer import IncrementalRenderer, encode_assistant_turn, render

    tok, hf, _ = harness.load(family)
    msgs = _history_with_content_beside_the_calls()
    ctx = render(msgs, tok)
    assert list(ctx.token_ids) == list(hf.apply_chat_template(msgs, tokenize=True, return_dict=False))
    make = lambda k: f'<|tool_call>call:run_shell{{cmd:<|"|>make {k}<|"|>}}<tool_call|><|tool_response>'
    assert masked_runs(tok, ctx) == [make(1), make(2), "Fixed it.<turn|>"]
    sampled = IncrementalRenderer(tok, special_tokens="allow")
    sampled.extend(msgs[:5])
    reply = list(encode_assistant_turn(msgs[5], tok, sampled.template))
    sampled.append(dict(msgs[5], token_ids=reply))
    ctx = sampled.render()
    assert list(ctx.token_ids) == list(hf.apply_chat_template(msgs, tokenize=True, return_dict=False))
    assert masked_runs(tok, ctx) == [make(1), make(2), "Fixed it.<turn|>"]
    assert [t for t, m in zip(ctx.token_ids, ctx.loss_mask) if m][-len(reply):] == reply
    inc = IncrementalRenderer(tok, special_tokens="allow")
    inc.extend(msgs[:3])
    inc.extend([dict(msgs[3], token_ids=list(encode_assistant_turn(msgs[3], tok, inc.template))), msgs[4]])
    with pytest.raises(RenderError, match=r"message 3: .* writes the assistant turn's content after the messages that "
                                          r"follow it .* then the content as the next assistant message"):
        inc.render()


def test_gemma4_v5_reply_right_after_moved_content(harness):
    """Gemma 4 v5 writes the reply after a tool-call turn's moved content with no turn opened (`Once more.Fixed
    it.<turn|>`; a render without the reply closes the content with `<turn|>\n` instead). As history: ids equal
    `apply_chat_template` and the mask holds the reply's tokens that start inside it (the BPE merges `.F`, a
    token that is half history, left out). With sampled ids the reply is refused with a typed error: a rendered
    token spans its start, so the ids could not be put there without repeating text (before, the render
    repeated `Fixed`)."""
    from ctxkit.text.rendering.renderer import IncrementalRenderer, encode_assistant_turn, render

    tok, hf, _ = harness.load("gemma4_v5")
    msgs = _history_with_content_beside_the_calls()
    text = hf.apply_chat_template(msgs, tokenize=False)
    assert text.endswith('<tool_response|>Once more.Fixed it.<turn|>\n')
    for n in (4, 6):  # the reply after one and after two moved contents
        chat = msgs[:3] + msgs[5:] if n == 4 else msgs
        ctx = render(chat, tok)
        assert list(ctx.token_ids) == list(hf.apply_chat_template(chat, tokenize=True, return_dict=False))
        make = lambda k: f'<|tool_call>call:run_shell{{cmd:<|"|>make {k}<|"|>}}<tool_call|><|tool_response>'
        assert masked_runs(tok, ctx) == ([make(1)] if n == 4 else [make(1), make(2)]) + [" it.<turn|>"]
    inc = IncrementalRenderer(tok, special_tokens="allow")
    inc.extend(msgs[:5])
    inc.append(dict(msgs[5], token_ids=list(encode_assistant_turn(msgs[5], tok, inc.template))))
    with pytest.raises(RenderError, match=r"message 5: template .* writes the assistant turn right after text it "
                                          r"merges with \(rendered token \d+ at char \d+ spans the turn's start"):
        inc.render()


def test_qwen3_5_turn_whose_first_newline_joins_the_prompt_keeps_its_sampled_ids(harness):
    """Qwen 3.5's prompt ends `<think>\n` and the rendered turn's next `\n` joins it in one token (`\n\n`), so the
    turn starts inside a rendered token. Sampled ids equal to the render from the next token on are the render:
    ids equal `apply_chat_template` (a first version of the straddle refusal refused them)."""
    from ctxkit.text.rendering.renderer import IncrementalRenderer, encode_assistant_turn

    tok, hf, _ = harness.load("qwen3_5_think")
    msgs = [{"role": "user", "content": "Fix the build."}, {"role": "assistant", "content": "Done."}]
    inc = IncrementalRenderer(tok, special_tokens="allow")
    inc.append(msgs[0])
    prompt = inc.render(add_generation_prompt=True)
    assert tok.decode(prompt.token_ids).endswith("<|im_start|>assistant\n<think>\n")
    sampled = list(encode_assistant_turn(msgs[1], tok, inc.template))
    assert tok.decode(sampled).startswith("</think>\n\nDone.")
    inc.append(dict(msgs[1], token_ids=sampled))
    ctx = inc.render()
    assert list(ctx.token_ids) == list(hf.apply_chat_template(msgs, tokenize=True, return_dict=False))
    assert [t for t, m in zip(ctx.token_ids, ctx.loss_mask) if m] == sampled and not ctx.drifts


def test_locating_a_turn_takes_the_render_before_it_from_the_last_turn(harness, monkeypatch):
    """Gemma 4 is rendered whole every turn (its loop reads other messages), and its turns are located from
    prefix renders: the render of the messages before a new turn with the prompt is the last turn's context,
    taken from there, so a turn renders the template twice (the context, and the messages up to the turn as
    rendered last), not three times."""
    from ctxkit.text.rendering.renderer import IncrementalRenderer, encode_assistant_turn
    from ctxkit.text.template.chat_template import ChatTemplate

    tok, hf, _ = harness.load("gemma4_v5")
    calls: list[int] = []
    real = ChatTemplate.render_chat

    def counted(self, chat, **kwargs):
        calls.append(len(chat))
        return real(self, chat, **kwargs)

    inc = IncrementalRenderer(tok, special_tokens="allow")
    held = [{"role": "user", "content": "Fix the build."}]
    inc.extend(held)
    inc.render(add_generation_prompt=True)
    monkeypatch.setattr(ChatTemplate, "render_chat", counted)
    for k in range(4):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "run_shell", "arguments": {"cmd": f"make {k}"}}}
        turn = [{"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"c{k}", "name": "run_shell", "content": f"error {k}"}]
        inc.extend([dict(turn[0], token_ids=list(encode_assistant_turn(turn[0], tok, inc.template))), turn[1]])
        held += turn
        before = len(calls)
        ids = list(inc.render(add_generation_prompt=True).token_ids)
        assert calls[before:] == [len(held), len(held) - 1], calls[before:]
        assert ids == list(hf.apply_chat_template(held, tokenize=True, add_generation_prompt=True, return_dict=False))


def test_tool_result_inside_a_turn_with_no_closer_is_refused(harness, tmp_path):
    """Fault injection: a template that writes a tool result inside the assistant's turn with no token closing
    the calls, and closes a tool-call turn only when it is the last message: the turn cannot be told apart from
    the result, so ctxkit refuses with a typed error naming the message, never a mask over tool output."""
    from ctxkit.text.rendering.renderer import render
    from ctxkit.text.template.chat_template import load_template
    from ctxkit.text.tokenizer.loader import load_tokenizer

    path = tmp_path / "in_turn.jinja"
    path.write_text(
        "{%- for m in messages -%}{%- if m.role == 'assistant' -%}"
        "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}<|im_start|>assistant\n{% endif -%}"
        "{{ m.content }}{%- if m.tool_calls -%}{%- for c in m.tool_calls %} CALL {{ c.function.name }}{%- endfor -%}"
        "{%- if loop.last -%}<|im_end|>{%- endif -%}{%- else -%}<|im_end|>\n{% endif -%}"
        "{%- elif m.role == 'tool' -%} RESULT {{ m.content }} END"
        "{%- else -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n{% endif -%}", encoding="utf-8")
    tok = load_tokenizer(str(shared_path("tokenizers") / "qwen2.5-instruct"))
    call = {"id": "c1", "type": "function", "function": {"name": "run_shell", "arguments": {"cmd": "make"}}}
    msgs = [{"role": "user", "content": "Fix the build."}, {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "error: missing semicolon"},
            {"role": "assistant", "content": "Fixed it."}]
    with pytest.raises(RenderError, match=r"message 2 \(tool\): .* renders the tool result inside assistant turn 1"):
        render(msgs, tok, load_template(str(path), tok))


def test_dated_templates_record_the_date(harness):
    """Llama 3.2 prints the date: ctxkit equals transformers given today's date, and the id records it."""
    from ctxkit.benchmarks.family_conformance import today
    from ctxkit.text.rendering.renderer import render
    from ctxkit.text.template.chat_template import load_template

    tok, hf, _ = harness.load("llama3_2")
    msgs = [{"role": "user", "content": "What day is it?"}]
    dated = load_template(None, tok, clock=today())
    assert today().strftime("%d %b %Y") in dated.render_text(msgs)
    assert dated.options["strftime_now"] == today().isoformat() and dated.id != load_template(None, tok).id
    ctx = render(msgs, tok, dated, add_generation_prompt=True)
    assert list(ctx.token_ids) == list(hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True,
                                                              return_dict=False))


def test_glm_turn_ends_where_the_next_message_starts(harness):
    """GLM-4-MoE closes a turn with no token of its own: a turn it re-renders (reasoning dropped) ends where the
    next message's <|user|> or <|observation|> starts, as its _training variant marks it."""
    from ctxkit.text.rendering.renderer import render

    tok, hf, _ = harness.load("glm4moe")
    msgs, _t = family_conversations(family_spec("glm4moe"))["reasoning"]
    ctx = render(msgs, tok)
    assert list(ctx.token_ids) == list(hf.apply_chat_template(msgs, tokenize=True, return_dict=False))
    runs = masked_runs(tok, ctx)
    assert runs == ["\n<think></think>\nYes.", "\n<think>3 divides 21.</think>\nNo, 21 = 3 × 7."]


def test_command_r7b_mask_holds_both_closing_tokens(harness):
    """Command R7B (cohere2) ends a reply with <|END_RESPONSE|><|END_OF_TURN_TOKEN|>, both sampled: both masked."""
    from ctxkit.text.rendering.renderer import render

    tok, _, _ = harness.load("cohere2")
    msgs, _t = family_conversations(family_spec("cohere2"))["chat"]
    ctx = render(msgs, tok)
    runs = masked_runs(tok, ctx)
    assert runs == ["It is 4.<|END_RESPONSE|><|END_OF_TURN_TOKEN|>", "9 🎉<|END_RESPONSE|><|END_OF_TURN_TOKEN|>"]


def test_deepseek_v3_tool_call_after_tool_outputs_is_located(harness):
    """DeepSeek V3 ends a tool block with <｜tool▁outputs▁end｜> unless a tool-call turn follows, and writes a later
    tool-call turn with no header and without its content: the turn is what follows the common prefix of the
    renders, so ids equal transformers' and the mask holds exactly the turns as rendered (was a RenderError)."""
    from ctxkit.text.rendering.renderer import render

    tok, hf, _ = harness.load("deepseekv3")
    call = {"type": "function", "function": {"name": "read", "arguments": '{"p": "a"}'}}
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "first", "tool_calls": [call]},
            {"role": "tool", "content": "A"},
            {"role": "assistant", "content": "second", "tool_calls": [call]},
            {"role": "tool", "content": "B"},
            {"role": "assistant", "content": "done"}]
    ctx = render(msgs, tok)
    assert list(ctx.token_ids) == list(hf.apply_chat_template(msgs, tokenize=True, return_dict=False))
    block = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>read\n```json\n{\"p\": \"a\"}\n```<｜tool▁call▁end｜>"
    assert masked_runs(tok, ctx) == [
        f"first<｜tool▁calls▁begin｜>{block}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        f"\n{block}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        "done<｜end▁of▁sentence｜>"]
