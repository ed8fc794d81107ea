"""Summarizers: transcript formatting, the registry, real SmolLM2 (LM) and real MiniLM (extractive)."""

from __future__ import annotations

import pytest

from conftest import require_module
from ctxkit.errors import ConfigError
from ctxkit.context.summarizers import (
    SUMMARIZERS,
    CallableSummarizer,
    ExtractiveSummarizer,
    LMSummarizer,
    Summarizer,
    SummarizerError,
    format_transcript,
    make_summarizer,
    message_text,
    split_sentences,
)

CONVERSATION = [
    {"role": "user", "content": "Please fix the failing test in tests/test_io.py. Do not modify src/config.yaml."},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "run_tests", "arguments": '{"path": "tests/test_io.py"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "run_tests",
     "content": "FAILED tests/test_io.py::test_read - FileNotFoundError: data/input.csv"},
    {"role": "assistant", "content": "The test fails because data/input.csv is missing. I will create it."},
]


def test_message_text_includes_tool_calls():
    assert message_text(CONVERSATION[1]) == 'calls run_tests({"path": "tests/test_io.py"})'
    both = {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "a", "function": {"name": "ls", "arguments": {"dir": "."}}},
        {"id": "b", "function": {"name": "cat", "arguments": "{}"}}]}
    assert message_text(both) == 'Checking.\ncalls ls({"dir": "."}); cat({})'
    assert message_text({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}) == "ab"
    assert message_text({"role": "user", "content": None}) == ""


def test_format_transcript_caps_messages_and_total():
    msgs = [{"role": "user", "content": "x" * 50}, {"role": "tool", "name": "grep", "content": "hit"},
            {"role": "assistant", "content": "done"}]
    assert format_transcript(msgs, max_chars_per_message=30, max_chars=1000) == (
        "[user] " + "x" * 25 + " [..]\n[tool grep] hit\n[assistant] done"
    )
    # The third line would pass the total: it is left out and counted.
    out = format_transcript(msgs, max_chars_per_message=30, max_chars=60)
    assert out == "[user] " + "x" * 25 + " [..]\n[tool grep] hit\n[... 1 more message(s) left out]"


def test_split_sentences():
    assert split_sentences("One. Two!  Three? Four\nFive.\n\n Six") == ["One.", "Two!", "Three?", "Four", "Five.", "Six"]
    assert split_sentences("v1.2 is out.Next") == ["v1.2 is out.Next"]  # no whitespace after the dot: one sentence
    assert split_sentences("   \n ") == []


def test_registry_and_errors():
    assert SUMMARIZERS == {"lm": LMSummarizer, "extractive": ExtractiveSummarizer}
    with pytest.raises(ConfigError, match=r"unknown summarizer 'abstractive'; registered summarizers: \['extractive', 'lm'\]"):
        make_summarizer("abstractive")
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) \['temperature'\]"):
        make_summarizer("lm", temperature=0.7)
    with pytest.raises(ConfigError, match="'max_new_tokens' is 0"):
        make_summarizer("lm", max_new_tokens=0)
    with pytest.raises(ConfigError, match="'n_sentences' is -1"):
        make_summarizer("extractive", n_sentences=-1)
    s = make_summarizer("extractive", n_sentences=2)
    assert isinstance(s, Summarizer) and s.n_sentences == 2 and s.version == 1


def test_callable_summarizer():
    calls = []

    def first_words(messages):
        calls.append(len(messages))
        return " ".join(message_text(m).split()[0] for m in messages if message_text(m))

    s = CallableSummarizer(first_words, id="first-words", version=3)
    assert isinstance(s, Summarizer)
    assert (s.id, s.version) == ("first-words", 3)
    assert s.summarize(CONVERSATION) == "Please calls FAILED The"
    assert calls == [4]
    with pytest.raises(SummarizerError, match="returned int"):
        CallableSummarizer(lambda m: 3, id="bad").summarize(CONVERSATION)
    with pytest.raises(ConfigError, match="not callable"):
        CallableSummarizer("nope", id="x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="non-empty string"):
        CallableSummarizer(first_words, id="")


def test_lm_prompt_is_small_and_capped():
    s = LMSummarizer(max_chars_per_message=40, max_prompt_chars=200, sentences=2)
    long = [{"role": "tool", "name": "cat", "content": "y" * 500}] * 10
    prompt = s.prompt_messages(long)
    assert [m["role"] for m in prompt] == ["system", "user"]
    assert "at most 2 sentences" in prompt[1]["content"]
    transcript = prompt[1]["content"].split("Conversation:\n", 1)[1]
    assert transcript.splitlines()[0] == "[tool cat] " + "y" * 35 + " [..]"
    assert transcript.splitlines()[-1].startswith("[... ") and len(transcript) < 320


@pytest.mark.slow
def test_extractive_picks_the_central_sentences_in_order():
    require_module("sentence_transformers")
    s = ExtractiveSummarizer(n_sentences=2)
    # Two paraphrases of one fact and three unrelated sentences: the centroid leans to the pair.
    sentences = [
        "Bananas are rich in potassium.",
        "The deploy failed because the disk was full.",
        "The orchestra played Beethoven last night.",
        "Quantum computers use qubits.",
        "Deployment failed since the disk ran out of space.",
    ]
    msgs = [{"role": "user", "content": " ".join(sentences[:3])}, {"role": "tool", "content": "\n".join(sentences[3:])}]
    assert s.sentences(msgs) == sentences
    assert s.select(sentences) == [1, 4]
    assert s.summarize(msgs) == sentences[1] + "\n" + sentences[4]  # original order kept
    assert s.id.startswith("extractive:model@sha256:")
    # Re-summarizing reuses the cached sentence vectors: nothing new reaches the model.
    before = s.embedder.texts_encoded
    assert s.summarize(msgs) == sentences[1] + "\n" + sentences[4]
    assert s.embedder.texts_encoded == before
    # Fewer sentences than asked for: all of them, deduplicated, without loading anything new.
    few = [{"role": "user", "content": "Alpha. Beta. Alpha."}]
    assert ExtractiveSummarizer(n_sentences=5).summarize(few) == "Alpha.\nBeta."


@pytest.mark.slow
def test_extractive_caps_the_number_of_scored_sentences():
    require_module("sentence_transformers")
    s = ExtractiveSummarizer(n_sentences=1, max_sentences=4)
    msgs = [{"role": "user", "content": " ".join(f"Sentence number {i} here." for i in range(10))}]
    assert s.sentences(msgs) == [f"Sentence number {i} here." for i in (0, 2, 5, 7)]
    assert s.summarize(msgs) in s.sentences(msgs)


@pytest.mark.slow
def test_lm_summarizer_real_smollm2_is_deterministic():
    require_module("gguf")
    s = LMSummarizer(max_new_tokens=24)
    assert s.id.startswith("lm:SmolLM2-135M-Instruct.Q4_1@sha256:")
    first = s.summarize(CONVERSATION)
    second = s.summarize(CONVERSATION)
    assert first == second
    assert first.strip() and "<|im_end|>" not in first
    from ctxkit.context.models import load_causal_lm

    tok = load_causal_lm().hf_tokenizer
    assert len(tok.encode(first, add_special_tokens=False)) <= 24 + 1
    assert s.summarize([]) == ""
