"""The `retrieve` compressor and its embedding index: real MiniLM, real faiss, real builder and logs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import require_module, tokenizer_dir
from ctxkit.context.builder import ContextBuilder, rebuild
from ctxkit.context.compress import compressor_defaults, make_compressor
from ctxkit.context.compress.retrieve import BLOCK_HEADER, Retrieve, RetrieveV2, documents, latest_query
from ctxkit.context.embeddings import PassageIndex, TextEmbedder, chunk_text
from ctxkit.errors import BudgetError, ConfigError
from ctxkit.events import Compaction, EpisodeStart, Message, ToolCall, ToolResult
from ctxkit.log.event_log import EventLog, MemoryLog
from ctxkit.context.view import Provenance, ViewMessage, build_view, find_orphans

WORDS = "parser token buffer index value return error state module config field record stream offset cache".split()
NEEDLE = "The vault access code is 4417-ZEBRA."
QUESTION = "What is the vault access code that appeared earlier?"


class CountingModel:
    """Wraps the real sentence-transformers model and counts what reaches it."""

    def __init__(self, model):
        self.model = model
        self.calls = 0
        self.texts = 0

    def encode(self, texts, **kwargs):
        self.calls += 1
        self.texts += len(texts)
        return self.model.encode(texts, **kwargs)


@pytest.fixture(scope="module")
def qwen():
    from ctxkit.text.tokenizer.loader import load_tokenizer

    return load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))


@pytest.fixture(scope="module")
def minilm():
    require_module("sentence_transformers")
    require_module("faiss")
    from ctxkit.context.models import load_embedder

    return load_embedder()


def _filler(t: int, n_words: int = 60) -> str:
    return " ".join(f"{WORDS[(t + 3 * i) % len(WORDS)]}{(t * 7 + i) % 89}" for i in range(n_words))


def start(log) -> None:
    log.extend([EpisodeStart(episode_id="ep-retrieve"), Message(role="system", content="You are a careful agent."),
                Message(role="user", content="Investigate the incident using the tools.")])


def turn(log, t: int, content: str | None = None) -> None:
    call = ToolCall(id=f"call_{t}", name="read_file", arguments=f'{{"path": "logs/{t}.txt"}}')
    log.extend([Message(role="assistant", content=f"Reading log {t}.", tool_calls=(call,)),
                ToolResult(tool_call_id=call.id, name="read_file", content=content or _filler(t))])


def compactions(log) -> list[Compaction]:
    return [e for e in log.events() if isinstance(e, Compaction)]


# ------------------------------------------------------------------------------------------- no model


def test_chunk_text_exact():
    assert chunk_text("a b c\nd", 3) == ["a b", "c\nd"]
    assert chunk_text("abcdefgh", 3) == ["abc", "def", "gh"]
    assert chunk_text("one\ntwo\nthree", 100) == ["one\ntwo\nthree"]
    assert chunk_text("  \n\n ", 10) == []
    with pytest.raises(ConfigError, match="max_chars is 0"):
        chunk_text("x", 0)


@settings(max_examples=100, deadline=None)
@given(lines=st.lists(st.lists(st.text(alphabet="abcxyz", min_size=1, max_size=12), max_size=12), max_size=10),
       max_chars=st.integers(min_value=12, max_value=80))
def test_chunk_text_keeps_every_word_in_order(lines, max_chars):
    text = "\n".join(" ".join(words) for words in lines)
    chunks = chunk_text(text, max_chars)
    assert all(0 < len(c) <= max_chars for c in chunks)
    assert " ".join(chunks).split() == text.split()


def test_defaults_and_parameter_errors():
    d = compressor_defaults()["retrieve"]
    assert d["trigger"] == "every_turn" and d["top_k"] == 3 and d["keep_last"] == 1 and d["embedder"] is None
    assert make_compressor("retrieve").spec.name == "retrieve-v1"
    with pytest.raises(ConfigError, match="'top_k' is 0"):
        Retrieve(top_k=0)
    with pytest.raises(ConfigError, match="'max_chars_per_item' is 10"):
        Retrieve(max_chars_per_item=10)
    with pytest.raises(ConfigError, match="expected a model path or an object with encode"):
        Retrieve(embedder=3.5)
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) \['k'\]"):
        make_compressor("retrieve", k=2)


def test_documents_and_query():
    log = MemoryLog()
    start(log)
    turn(log, 0, content="first output")
    docs = documents(log.events())
    assert [(text, label) for _, text, label in docs] == [
        ("You are a careful agent.", "system"),
        ("Investigate the incident using the tools.", "user"),
        ('Reading log 0.\ncalls read_file({"path": "logs/0.txt"})', "assistant"),
        ("first output", "tool result read_file"),
    ]
    msgs = [ViewMessage("user", "old question", provenance=Provenance("verbatim", ("a",))),
            ViewMessage("user", "new question", provenance=Provenance("verbatim", ("b",))),
            ViewMessage("assistant", "thinking", provenance=Provenance("verbatim", ("c",))),
            ViewMessage("tool", "tool says hi", tool_call_id="x", provenance=Provenance("verbatim", ("d",))),
            ViewMessage("user", "block", provenance=Provenance("retrieved", ("a",)))]
    assert latest_query(msgs) == "new question\ntool says hi"
    assert latest_query(msgs[:2]) == "new question"


# ------------------------------------------------------------------------------------- real MiniLM


@pytest.mark.slow
def test_text_embedder_encodes_each_text_once(minilm):
    import numpy as np

    counting = CountingModel(minilm)
    emb = TextEmbedder(model=counting)
    a = emb.encode(["alpha text", "beta text"])
    assert a.shape == (2, 384) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    b = emb.encode(["beta text", "alpha text", "gamma text"])
    assert counting.calls == 2 and counting.texts == 3  # only "gamma text" was new
    assert np.array_equal(b[0], a[1]) and np.array_equal(b[1], a[0])
    assert (emb.calls, emb.texts_encoded) == (2, 3)


@pytest.mark.slow
def test_passage_index_is_incremental_and_searchable(minilm):
    counting = CountingModel(minilm)
    index = PassageIndex(TextEmbedder(model=counting), max_chars=80)
    docs = [
        ("d1", "Paris is the capital of France. The Eiffel Tower stands there."),
        ("d2", "The stock market fell sharply on Monday after the interest rate decision."),
        ("d3", "Photosynthesis turns sunlight, water and carbon dioxide into sugar.\n" + "Leaves are green. " * 6),
    ]
    added = index.add(docs)
    assert added == sum(len(chunk_text(t, 80)) for _, t in docs) == len(index) == 5
    assert index.n_documents == 3 and counting.calls == 1
    assert index.add(docs) == 0 and counting.calls == 1  # known documents cost nothing
    assert index.add([("d2", "The market rose on Tuesday.")]) == 1 and len(index) == 6  # same id, new text
    hits = index.search("Which city has the Eiffel Tower?", 2)
    assert [h.passage.doc_id for h in hits][0] == "d1"
    assert hits[0].score > hits[1].score and hits[0].score == round(hits[0].score, 6)
    from ctxkit.context.embeddings import text_sha

    allowed = {("d2", text_sha(docs[1][1])): 0, ("d3", text_sha(docs[2][1])): 1}
    only = index.search("Which city has the Eiffel Tower?", 3, allowed)
    assert {h.passage.doc_id for h in only} == {"d2", "d3"} and len(only) == 2
    green = index.search("What colour are leaves?", 1)
    assert green[0].passage.doc_id == "d3" and green[0].passage.chunk in (1, 2)


@pytest.mark.slow
def test_needle_is_retrieved_recorded_and_replayed_without_embedding(qwen, minilm, tmp_path):
    counting = CountingModel(minilm)
    comp = Retrieve(embedder=counting, top_k=2)
    assert comp.spec.params["embedder"].startswith("model@sha256:")
    builder = ContextBuilder(qwen, compressor=comp, budget=700)
    log = EventLog.create(tmp_path / "ep.jsonl")
    start(log)
    turn(log, 0, content=_filler(0, 30) + " " + NEEDLE + " " + _filler(100, 30))
    needle_id = log.events()[-1].id
    for t in range(1, 10):
        turn(log, t)
        ctx = builder.build(log)
        assert ctx.n_tokens <= 700 and not find_orphans(ctx.view.messages)
    log.append(Message(role="user", content=QUESTION))
    ctx = builder.build(log)
    last = compactions(log)[-1]
    block = [e for e in last.edits if e.kind == "retrieved"]
    assert len(block) == 1
    edit = block[0]
    assert edit.event_ids[0] == needle_id and len(edit.event_ids) == 2
    assert NEEDLE in edit.text and edit.text.startswith(BLOCK_HEADER + "\n[1] tool result read_file (event " + needle_id)
    assert edit.scores == tuple(sorted(edit.scores, reverse=True)) and edit.scores[0] > 0.3
    assert last.details["retrieved"][0] == {"event_id": needle_id, "chunk": 0, "score": edit.scores[0]}
    assert last.details["embedder"] == comp.embedder.id and last.details["query"] == QUESTION
    assert NEEDLE in qwen.decode(ctx.token_ids)
    block_msg = [m for m in ctx.view.messages if m.provenance.how == "retrieved"]
    assert len(block_msg) == 1 and block_msg[0].content == edit.text
    assert ctx.view.messages[-1].content == QUESTION and ctx.view.messages[-2] is block_msg[0]
    # Replay from the saved file: same view and ids, and nothing reaches the embedding model.
    calls = counting.calls
    reopened = EventLog.open(tmp_path / "ep.jsonl")
    assert build_view(reopened).hash == ctx.view.hash
    assert rebuild(reopened.events(), tokenizer=qwen).token_ids == ctx.token_ids
    # The same builder again: same block, nothing recorded, nothing embedded (the query is cached).
    n = len(log)
    assert builder.build(log).token_ids == ctx.token_ids and len(log) == n
    assert counting.calls == calls


@pytest.mark.slow
def test_index_grows_by_exactly_the_events_that_left_the_window(qwen, minilm):
    counting = CountingModel(minilm)
    comp = Retrieve(embedder=counting, top_k=2, max_chars_per_item=200)
    builder = ContextBuilder(qwen, compressor=comp, budget=650, detect_pins=False)
    log = MemoryLog()
    start(log)
    prev_out: set[str] = set()
    prev_len, prev_texts = 0, 0
    grew = 0
    for t in range(10):
        turn(log, t)
        ctx = builder.build(log)
        shown = {i for m in ctx.view.messages if m.provenance.how == "verbatim" for i in m.provenance.event_ids}
        docs = {eid: text for eid, text, _ in documents(log.events())}
        out = {eid for eid in docs if eid not in shown}
        assert out >= prev_out  # what left the window stays out
        index = comp.index_for(log.events())
        new_passages = sum(len(chunk_text(docs[eid], 200)) for eid in out - prev_out)
        assert len(index) - prev_len == new_passages
        assert index.n_documents == len(out)
        # The model saw exactly the new passages, plus this turn's query when there was anything to search.
        assert counting.texts - prev_texts == new_passages + (1 if out else 0)
        grew += bool(new_passages)
        prev_out, prev_len, prev_texts = out, len(index), counting.texts
    assert grew >= 3 and compactions(log)
    assert rebuild(log.events(), tokenizer=qwen).token_ids == ctx.token_ids


@pytest.mark.slow
def test_short_episode_records_nothing_and_tight_budget_errors(qwen, minilm):
    comp = Retrieve(embedder=CountingModel(minilm))
    builder = ContextBuilder(qwen, compressor=comp, budget=4000)
    log = MemoryLog()
    start(log)
    turn(log, 0)
    builder.build(log)
    assert not compactions(log) and len(comp.index_for(log.events())) == 0
    tight = ContextBuilder(qwen, compressor=Retrieve(embedder=CountingModel(minilm)), budget=120, detect_pins=False)
    log2 = MemoryLog()
    start(log2)
    turn(log2, 0, content=_filler(0, 200))
    with pytest.raises(BudgetError, match="120"):
        tight.build(log2)


@pytest.mark.slow
def test_v2_keeps_fewer_newest_turns_where_v1_fails_the_build(qwen, minilm, tmp_path):
    # The first two messages and the newest two turns take 470 tokens: over the 450-token budget.
    def episode(comp, path=None):
        builder = ContextBuilder(qwen, compressor=comp, budget=450, detect_pins=False)
        log = EventLog.create(path) if path else MemoryLog()
        start(log)
        layouts = []
        for t in range(3):
            turn(log, t)
            ctx = builder.build(log)
            assert ctx.n_tokens <= 450 and not find_orphans(ctx.view.messages)
            layouts.append([(m.role, m.provenance.how, m.provenance.event_ids) for m in ctx.view.messages])
        return log, layouts, ctx

    with pytest.raises(BudgetError, match=r"retrieve-v1: even the first 2 message\(s\), the pinned constraints and "
                                          r"the newest 2 turn\(s\) take 470 tokens, over the budget of 450"):
        episode(Retrieve(embedder=CountingModel(minilm), keep_last=2, top_k=1, max_chars_per_item=200))
    comp = RetrieveV2(embedder=CountingModel(minilm), keep_last=2, top_k=1, max_chars_per_item=200)
    assert comp.spec.name == "retrieve-v2" and make_compressor("retrieve-v2").spec.name == "retrieve-v2"
    log, layouts, ctx = episode(comp, tmp_path / "ep.jsonl")
    ids = [e.id for e in log.events()]
    head = [("system", "verbatim", (ids[1],)), ("user", "verbatim", (ids[2],))]
    first_turn = (ids[3], ids[4])  # the turn let go at the second build
    assert layouts == [
        head + [("assistant", "verbatim", (ids[3],)), ("tool", "verbatim", (ids[4],))],
        head + [("user", "retrieved", (ids[4],)), ("assistant", "verbatim", (ids[5],)), ("tool", "verbatim", (ids[6],))],
        head + [("user", "retrieved", (ids[4],)), ("assistant", "verbatim", (ids[8],)), ("tool", "verbatim", (ids[9],))],
    ]
    first, second = compactions(log)
    assert [(e.kind, e.event_ids) for e in first.edits] == [("drop", first_turn), ("retrieved", (ids[4],))]
    assert [(e.kind, e.event_ids) for e in second.edits] == [("drop", (ids[5], ids[6])), ("retrieved", (ids[4],))]
    assert [c.details["keep_last"] for c in (first, second)] == [1, 1]
    assert [c.details["candidates"] for c in (first, second)] == [2, 4]  # the turns let go are documents
    reopened = EventLog.open(tmp_path / "ep.jsonl")
    assert rebuild(reopened.events(), tokenizer=qwen).token_ids == ctx.token_ids


@pytest.mark.slow
def test_retrieve_passes_the_registry_check_at_a_small_budget(qwen, minilm):
    from ctxkit.context.compressor_check import check_compressor

    report = check_compressor("retrieve", tokenizer=qwen, budgets=(1024,), max_examples=2)
    assert report.compactions > 0 and report.max_tokens[1024] <= 1024


@pytest.mark.slow
def test_over_budget_trigger_with_target_fraction_batches_compactions(qwen, minilm):
    with pytest.raises(ConfigError, match="'target_fraction' is 0"):
        Retrieve(target_fraction=0)
    comp = Retrieve(embedder=CountingModel(minilm), trigger="over_budget", target_fraction=0.6, top_k=1)
    builder = ContextBuilder(qwen, compressor=comp, budget=800, detect_pins=False)
    log = MemoryLog()
    start(log)
    recorded = []
    for t in range(14):
        turn(log, t)
        n = len(log)
        ctx = builder.build(log)
        recorded.append(len(log) > n)
        assert ctx.n_tokens <= 800 and not find_orphans(ctx.view.messages)
    first = recorded.index(True)
    # After a compaction the window sits near 60% of the budget, so the next turn needs none.
    assert sum(recorded) >= 2 and not recorded[first + 1]
    from ctxkit.context.view import make_view

    for c in compactions(log):
        view = build_view(log.events(), upto_seq=c.seq)
        window_part = [m for m in view.messages if m.provenance.how not in ("retrieved", "pinned")]
        window_only = make_view(window_part, view.tools, view.active_pins, view.upto_seq)
        assert builder.measure(window_only) <= 480 < c.details["tokens_before"]
        assert c.details["tokens_after"] <= 800
    assert rebuild(log.events(), tokenizer=qwen).token_ids == ctx.token_ids
