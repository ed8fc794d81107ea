"""The closed vocabulary of drift reasons: one real template/tokenizer case per reason, with its exact reason.

Each case renders with a real chat template (the shared tokenizers' own, or TRL's stock template on the
family tokenizer `template_families` builds) and tokenizes with that tokenizer; the old/sampled side is what a
policy or a client really produces in that situation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import shared_path, tokenizer_dir
from ctxkit.text.rendering.drift_reasons import (DRIFT_REASONS, UNEXPLAINED, classify_drift, classify_transition,
                                                 count_reasons, template_default_system)
from ctxkit.text.rendering.output import Drift
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.tokenizer.loader import load_tokenizer


@pytest.fixture(scope="module")
def qwen25():
    tok = load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))
    return tok, load_template(None, tok)


@pytest.fixture(scope="module")
def qwen3():
    tok = load_tokenizer(str(tokenizer_dir("qwen3")))
    return tok, load_template(None, tok)


@pytest.fixture(scope="module")
def mistral():
    tok = load_tokenizer(str(tokenizer_dir("mistral-7b-instruct-v0.3")))
    return tok, load_template(None, tok)


def _turn(template, messages, opener: str) -> str:
    """The text of the last assistant turn of `messages` as `template` renders it (after its opener)."""
    text = template.render_text(messages)
    return text[text.rindex(opener) + len(opener):].rstrip("\n")


def _mask(old: list[int], sampled: list[int]) -> list[int]:
    return [0] * len(old) + [1] * len(sampled)


def test_vocabulary_is_closed_and_ordered():
    assert DRIFT_REASONS == ("compaction", "bos_duplication", "context_truncated", "special_token_escape", "bpe_merge",
                             "thinking_stripped", "value_roundtrip", "tool_call_reformat", "whitespace_normalized",
                             "default_system_prompt", "history_edited", "template_rewrite", "unexplained")
    assert Drift(1, 5, (1,), (2,)).reason == UNEXPLAINED == "unexplained"  # constructors without a reason still work
    assert count_reasons(["bpe_merge", "bpe_merge", "no-such"]) == {
        **dict.fromkeys(DRIFT_REASONS, 0), "bpe_merge": 2, "unexplained": 1}


def test_bpe_merge(qwen25):
    tok, _ = qwen25
    eot = tok.special_tokens["<|im_end|>"]
    sampled = tok.encode("Hel") + tok.encode("lo world") + [eot]  # the policy stopped mid-word once
    assert classify_drift(sampled, tok.encode("Hello world<|im_end|>"), tok) == "bpe_merge"


def test_special_token_escape(qwen25):
    tok, tpl = qwen25
    calls = [{"type": "function", "function": {"name": "read_file", "arguments": {"path": "a.txt"}}}]
    turn = _turn(tpl, [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": calls}],
                 "<|im_start|>assistant\n")
    rendered = tok.encode(turn)
    assert rendered[0] == tok.special_tokens["<tool_call>"]
    sampled = tok.encode("<") + tok.encode(turn[1:])  # `<tool_call>` spelled in ordinary pieces
    assert tok.decode(sampled) == tok.decode(rendered)
    assert classify_drift(sampled, rendered, tok) == "special_token_escape"


def test_thinking_stripped(qwen3):
    tok, tpl = qwen3
    history = [{"role": "user", "content": "Is 17 prime?"},
               {"role": "assistant", "content": "Yes.", "reasoning_content": "17 has no divisors."},
               {"role": "user", "content": "And 21?"}]
    text = tpl.render_text(history)
    assert "<|im_start|>assistant\nYes.<|im_end|>" in text  # Qwen3 drops the earlier turn's reasoning
    sampled = tok.encode("<think>\n17 has no divisors.\n</think>\n\nYes.<|im_end|>")
    assert classify_drift(sampled, tok.encode("Yes.<|im_end|>"), tok) == "thinking_stripped"


def test_value_roundtrip(tmp_path_factory):
    from ctxkit.benchmarks.template_families import family_tokenizer

    folder = family_tokenizer("qwen3_5_think", shared_path(), tmp_path_factory.mktemp("fam"))
    tok = load_tokenizer(str(folder))
    tpl = load_template(None, tok)
    calls = [{"type": "function", "function": {"name": "grep", "arguments": {"pattern": "a", "recursive": False}}}]
    turn = _turn(tpl, [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": calls}],
                 "<|im_start|>assistant\n")
    assert "<parameter=recursive>\nFalse\n</parameter>" in turn  # the parsed bool re-rendered with `| string`
    sampled = tok.encode(turn.replace("\nFalse\n", "\nfalse\n"))  # what the model wrote
    assert classify_drift(sampled, tok.encode(turn), tok) == "value_roundtrip"


def test_tool_call_reformat(qwen25):
    tok, tpl = qwen25
    calls = [{"type": "function", "function": {"name": "read_file", "arguments": {"path": "a.txt"}}}]
    turn = _turn(tpl, [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": calls}],
                 "<|im_start|>assistant\n")
    compact = turn.replace('{"name": "read_file", "arguments": {"path": "a.txt"}}',
                           '{"name":"read_file","arguments":{"path":"a.txt"}}')  # the model's compact JSON
    assert compact != turn
    assert classify_drift(tok.encode(compact), tok.encode(turn), tok) == "tool_call_reformat"


def test_whitespace_normalized(qwen3):
    tok, tpl = qwen3
    turn = _turn(tpl, [{"role": "user", "content": "Is 17 prime?"},
                       {"role": "assistant", "content": "\n\nYes.", "reasoning_content": "17 has no divisors."}],
                 "<|im_start|>assistant\n")
    assert turn == "<think>\n17 has no divisors.\n</think>\n\nYes.<|im_end|>"  # Qwen3 lstrips the content
    sampled = tok.encode("<think>\n17 has no divisors.\n</think>\n\n\n\nYes.<|im_end|>")
    assert classify_drift(sampled, tok.encode(turn), tok) == "whitespace_normalized"


def test_history_edited(qwen25):
    tok, _ = qwen25
    # a scaffold rewrote the assistant message it sends back; the sampled ids are what the policy wrote
    assert classify_drift(tok.encode("The answer is 4.<|im_end|>"), tok.encode("The answer is four.<|im_end|>"),
                          tok) == "history_edited"


def _first_turn(tok, tpl, messages, reply_text):
    prompt = tok.encode(tpl.render_text(messages, add_generation_prompt=True))
    sampled = tok.encode(reply_text)
    return prompt + sampled, _mask(prompt, sampled)


def test_default_system_prompt(qwen25):
    tok, tpl = qwen25
    default = template_default_system(tpl)
    assert default == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    first = [{"role": "user", "content": "Hi"}]
    old, mask = _first_turn(tok, tpl, first, "Hello!<|im_end|>")
    # the client adds its system message from the second turn on: the default one is gone from the history
    new = tok.encode(tpl.render_text([{"role": "system", "content": "Be brief."}, *first,
                                      {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}],
                                     add_generation_prompt=True))
    assert classify_transition(old, mask, new, tok, default_system=default) == "default_system_prompt"
    assert template_default_system(load_template(None, load_tokenizer(str(tokenizer_dir("qwen3"))))) is None


def test_template_rewrite_and_unexplained(mistral):
    tok, tpl = mistral
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    old, mask = _first_turn(tok, tpl, first, " Hello</s>")
    new = tok.encode(tpl.render_text(first + [{"role": "assistant", "content": "Hello"},
                                              {"role": "user", "content": "Bye"}], add_generation_prompt=True))
    assert tok.decode(new).startswith("<s>[INST] Hi[/INST] Hello</s>[INST] Be brief.")  # the system prompt moved
    assert classify_transition(old, mask, new, tok) == "template_rewrite"
    assert classify_transition(old, None, new, tok) == "unexplained"  # no mask: sampled or rendered is unknown


def test_bos_duplication(mistral):
    tok, tpl = mistral
    text = tpl.render_text([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    # an engine that tokenizes the rendered text with the tokenizer's own BOS: <s><s>[INST] ...
    engine = tok.encode_model_input(text)
    assert engine[:2] == [tok.special_tokens["<s>"]] * 2
    assert classify_transition(tok.encode(text), None, engine, tok) == "bos_duplication"


def test_context_truncated(qwen25):
    tok, tpl = qwen25
    old, mask = _first_turn(tok, tpl, [{"role": "user", "content": "Summarize the file for me please."}],
                            "It is short.<|im_end|>")
    assert classify_transition(old, mask, old[:12], tok) == "context_truncated"  # a client's max-length cut


def test_compaction(qwen25):
    tok, tpl = qwen25
    chat = [{"role": "user", "content": "Read a.txt"}, {"role": "assistant", "content": "It says alpha."}]
    old, mask = _first_turn(tok, tpl, chat[:1], "It says alpha.<|im_end|>")
    summary = [{"role": "user", "content": "[summary] a.txt says alpha."}, {"role": "user", "content": "Next?"}]
    new = tok.encode(tpl.render_text(summary, add_generation_prompt=True))
    assert classify_transition(old, mask, new, tok) == "template_rewrite"  # unrecorded, it looks like a rewrite
    assert classify_transition(old, mask, new, tok, compacted=True) == "compaction"


@pytest.fixture(scope="module")
def gptoss(tmp_path_factory):
    from ctxkit.benchmarks.template_families import family_tokenizer

    tok = load_tokenizer(str(family_tokenizer("gptoss", shared_path(), tmp_path_factory.mktemp("gptoss"))))
    return tok, load_template(None, tok)


def test_gptoss_analysis_after_a_final_and_its_closer(gptoss):
    """gpt-oss writes the latest turn as analysis + final ending `<|return|>`; once a user turn follows, the
    analysis is dropped and the final ends `<|end|>`."""
    tok, tpl = gptoss
    chat = [{"role": "user", "content": "Is 17 prime?"},
            {"role": "assistant", "content": "Yes.", "reasoning_content": "No divisors."}]
    latest = tpl.render_text(chat)
    history = tpl.render_text(chat + [{"role": "user", "content": "And 21?"}])
    opener = "<|start|>user<|message|>Is 17 prime?<|end|><|start|>assistant"
    sampled = latest[latest.index(opener) + len(opener):]
    rendered = history[history.index(opener) + len(opener): history.index("<|start|>user<|message|>And 21?")]
    assert sampled.startswith("<|channel|>analysis<|message|>No divisors.<|end|>") and sampled.endswith("<|return|>")
    assert rendered == "<|channel|>final<|message|>Yes.<|end|>"
    assert classify_drift(tok.encode(sampled), tok.encode(rendered), tok) == "thinking_stripped"
    final = sampled[sampled.index("<|channel|>final"):]  # the final alone: only its closer differs
    assert classify_drift(tok.encode(final), tok.encode(rendered), tok) == "template_rewrite"
