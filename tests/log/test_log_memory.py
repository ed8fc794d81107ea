"""One log home and one id scheme: `MemoryLog` and `EventLog` share the sequencer (`ctxkit.log.event_log.stamp`), so
the same events get the same ids, views and token ids under every compressor; and the log layer has no
import cycle (an AST scan of every import, lazy ones inside functions and `TYPE_CHECKING` blocks included)."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pytest

from conftest import REPO_ROOT, require_module, tokenizer_dir
from ctxkit.context.compress import COMPRESSORS
from ctxkit.errors import BudgetError, ConfigError
from ctxkit.events import Compaction, EpisodeEnd, EpisodeStart, Message, Step, ToolCall, ToolResult
from ctxkit.log.event_log import EventLog, MemoryLog, read_events, stamp
from ctxkit.context.view import build_view

TOOLS = ({"type": "function", "function": {"name": "read", "description": "Read a file.",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},)


def head_events():
    return [EpisodeStart(episode_id="same", tools=TOOLS),
            Message(role="system", content="You are a careful agent."),
            Message(role="user", content="Fix the parser. Do not modify the original file.")]


def timeless(events):
    return [dataclasses.replace(e, ts=None) for e in events]


def assert_same_view(a, b):
    """Identical views: messages (text, provenance, sampled ids), tools, pins and hash. Only the pins'
    wall-clock `ts` may differ (a file log stamps the time, a memory log 0.0)."""
    assert a.hash == b.hash and a.upto_seq == b.upto_seq
    assert a.messages == b.messages and a.tools == b.tools
    assert timeless(a.active_pins) == timeless(b.active_pins)


# ------------------------------------------------------------------------------------------ ids


def test_the_same_message_gets_the_same_id_in_both_logs(tmp_path):
    # The case: one Message as the first event got e0-017caa51 in a MemoryLog, e0-934f2f62 in an
    # EventLog. Both now use events.event_id (content and seq; measured times left out).
    msg = Message(role="user", content="hi")
    with EventLog.create(tmp_path / "a.jsonl") as log:
        on_file = log.append(msg)
    in_memory = MemoryLog().append(msg)
    assert on_file.id == in_memory.id == "e0-934f2f62"
    assert in_memory.ts == 0.0 and isinstance(on_file.ts, float) and on_file.ts > 0
    assert dataclasses.replace(on_file, ts=0.0) == in_memory


def test_ids_ignore_measured_times_in_both_logs(tmp_path):
    fast = [Step(token_ids=(1, 2), timings={"decode": 0.01}), ToolResult(tool_call_id="c", content="x", duration_s=0.1)]
    slow = [Step(token_ids=(1, 2), timings={"decode": 9.0}), ToolResult(tool_call_id="c", content="x", duration_s=7.0)]
    with EventLog.create(tmp_path / "a.jsonl") as log:
        file_ids = [e.id for e in log.extend(fast)]
    assert file_ids == [e.id for e in MemoryLog().extend(slow)] == [e.id for e in MemoryLog().extend(fast)]
    assert file_ids == ["e0-28714ed7", "e1-5495b3e7"]


def test_stamp_is_what_both_logs_record(tmp_path):
    events = head_events() + [EpisodeEnd(outcome="terminated", cause="answered", reward=1.0, reward_kind="scored")]
    stamped = stamp(events, 0, 5.0)
    with EventLog.create(tmp_path / "a.jsonl") as log:
        log.extend(events)
    memory = MemoryLog()
    memory.extend(events)
    assert [e.id for e, _, _ in stamped] == [e.id for e in log.events()] == [e.id for e in memory.events()]
    assert [e.seq for e, _, _ in stamped] == [0, 1, 2, 3] and all(e.ts == 5.0 for e, _, _ in stamped)
    assert timeless(e for e, _, _ in stamped) == timeless(read_events(log.path)) == timeless(memory.events())
    # a recorded event is exactly what a reader of the file gets back (tuples, not lists)
    assert read_events(log.path)[0].tools == memory.events()[0].tools == TOOLS


@pytest.mark.parametrize("bad, pattern", [
    (Message(role="user", content="x", seq=3, id="e3-00000000"), r"already has seq=3"),
    ({"role": "user"}, r"event 0: dict is not an event type"),
    (Step(token_ids=(7,), logprobs=(math.nan,)), r"event 0 \(step\).logprobs\[0\] is nan"),
])
def test_both_logs_refuse_the_same_events_the_same_way(tmp_path, bad, pattern):
    memory = MemoryLog()
    with pytest.raises(ConfigError, match=pattern):
        memory.append(bad)
    with EventLog.create(tmp_path / "a.jsonl") as log, pytest.raises(ConfigError, match=pattern):
        log.append(bad)
    assert len(memory) == len(log) == 0 and read_events(tmp_path / "a.jsonl") == ()


def test_extend_is_all_or_nothing_in_memory_too():
    memory = MemoryLog()
    with pytest.raises(ConfigError):
        memory.extend([Message(role="user", content="kept?"), Step(token_ids=(7,), logprobs=(math.inf,))])
    assert memory.events() == ()


def test_memory_log_adopt_keeps_ids_and_renumbers_seq():
    source = MemoryLog()
    recorded = source.extend(head_events())
    copy = MemoryLog()
    copy.adopt(recorded[1:])
    assert [(e.seq, e.id) for e in copy.events()] == [(0, recorded[1].id), (1, recorded[2].id)]
    assert copy.append(Message(role="user", content="next")).seq == 2


# ------------------------------------------------------------------ the same episode through both logs


def output(t: int, words: int = 90) -> str:
    return " ".join(f"row{t}_{i} value" for i in range(words))


SLOW = {name for name in COMPRESSORS if "summarize" in name or "retrieve" in name}
"""Compressors that load a real model (the extractive summarizer and retrieval embed with MiniLM)."""


@pytest.fixture(scope="module")
def tok():
    from ctxkit.text.tokenizer.loader import load_tokenizer

    return load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))


def run_both(tmp_path, tok, name: str, *, turns: int = 7, budget: int = 1400):
    """The same episode through an EventLog and a MemoryLog, each with its own builder; every build is
    compared as it happens. Returns the two logs and the number of builds."""
    from ctxkit.context.builder import ContextBuilder

    if name in SLOW:
        require_module("sentence_transformers")
    file_log = EventLog.create(tmp_path / f"{name}.jsonl", episode_id="same")
    memory = MemoryLog()
    builders = [ContextBuilder(tok, compressor=name, budget=budget) for _ in range(2)]
    for log in (file_log, memory):
        log.extend(head_events())
    builds = 0
    for t in range(turns):
        outcome = []
        for builder, log in zip(builders, (file_log, memory)):
            try:
                outcome.append(builder.build(log))
            except BudgetError as exc:  # e.g. keep-all, or a v2 strategy that alone cannot fit
                outcome.append(str(exc))
        a, b = outcome
        if isinstance(a, str) or isinstance(b, str):
            assert a == b, f"{name}: turn {t}: one log fit, the other did not"
            break
        builds += 1
        assert a.token_ids == b.token_ids and a.hash == b.hash and a.loss_mask == b.loss_mask
        assert_same_view(a.view, b.view)
        assert a.compactions == b.compactions
        step = Step(context_hash=a.hash, context_length=a.n_tokens, content=f"Reading {t}.",
                    tool_calls=(ToolCall(f"c{t}", "read", f'{{"path": "f{t}"}}'),), timings={"build": 0.001 * t})
        result = ToolResult(tool_call_id=f"c{t}", name="read", content=output(t), duration_s=0.01 * (t + 1))
        for log in (file_log, memory):
            log.extend([step, result])
    file_log.close()
    return file_log, memory, builds


def check_same(file_log, memory, builds, name):
    recorded = read_events(file_log.path)
    assert recorded == file_log.events()
    assert [e.id for e in recorded] == [e.id for e in memory.events()]
    assert timeless(recorded) == timeless(memory.events())
    for upto in range(len(recorded)):
        assert_same_view(build_view(recorded, upto_seq=upto), build_view(memory.events(), upto_seq=upto))
    assert builds >= 1, f"{name}: no context was built"
    if name != "keep-all":  # the compressor acted, so its recorded decisions were compared too
        assert any(isinstance(e, Compaction) for e in recorded), f"{name}: no compaction"


@pytest.mark.parametrize("name", sorted(n for n in COMPRESSORS if n not in SLOW))
def test_same_events_same_ids_views_and_tokens_under_every_compressor(tmp_path, tok, name):
    file_log, memory, builds = run_both(tmp_path, tok, name)
    check_same(file_log, memory, builds, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLOW))
def test_same_events_same_ids_views_and_tokens_with_real_models(tmp_path, tok, name):
    file_log, memory, builds = run_both(tmp_path, tok, name)
    check_same(file_log, memory, builds, name)


def test_masked_placeholders_name_the_same_ids_in_both_logs(tmp_path, tok):
    file_log, memory, builds = run_both(tmp_path, tok, "mask-observations-v2", budget=100_000 // 50)
    check_same(file_log, memory, builds, "mask-observations-v2")
    masks = [(edit.event_id, edit.text) for e in memory.events() if isinstance(e, Compaction) for edit in e.edits
             if edit.kind == "mask"]
    assert masks, "no tool output was masked"
    results = {e.id for e in memory.events() if isinstance(e, ToolResult)}
    assert all(event_id in results and f"[tool output {event_id} masked:" in text for event_id, text in masks)


# ------------------------------------------------------------------------------------------ layering


def module_imports(path: Path, package_root: Path) -> set[str]:
    """Every ctxkit module `path` imports anywhere in its body (top level, functions, TYPE_CHECKING)."""
    name = ".".join(path.relative_to(package_root.parent).with_suffix("").parts)
    if name.endswith(".__init__"):
        name = name[: -len(".__init__")]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("ctxkit"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.rsplit(".", node.level - (1 if path.name == "__init__.py" else 0))[0]
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module.startswith("ctxkit"):
                out.add(module)
                out.update(f"{module}.{a.name}" for a in node.names)  # `from ctxkit import log` names a module
    return out


def import_graph() -> dict[str, set[str]]:
    root = REPO_ROOT / "ctxkit"
    modules = {}
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
        modules[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return {name: {m for m in module_imports(path, root) if m in modules and m != name}
            for name, path in modules.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), list(graph[start])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen


LOG_LAYER = ("ctxkit.events", "ctxkit.errors", "ctxkit.log.event_log", "ctxkit.log.file_format", "ctxkit.log.locks", "ctxkit.log.sequencer",
             "ctxkit.log.file_writes", "ctxkit.log.conversation", "ctxkit.log.state")


def test_the_log_layer_has_no_import_cycle():
    graph = import_graph()
    assert "ctxkit.log.conversation" in graph["ctxkit.log.event_log"]  # the scan sees imports at all
    for name in LOG_LAYER:
        assert name not in reachable(graph, name), f"{name} imports itself through {sorted(reachable(graph, name))}"
    assert "ctxkit.log.event_log" not in reachable(graph, "ctxkit.log.conversation")


def test_the_log_layer_imports_only_below_or_beside_it():
    graph = import_graph()
    allowed = {"ctxkit.events": {"ctxkit.errors", "ctxkit.edits", "ctxkit.kept_set", "ctxkit.content"}, "ctxkit.errors": set(),
               "ctxkit.log.locks": {"ctxkit.errors"},
               "ctxkit.log.file_format": {"ctxkit.events", "ctxkit.errors", "ctxkit.edits", "ctxkit.kept_set", "ctxkit.content", "ctxkit.log.locks"},
               "ctxkit.log.file_writes": {"ctxkit.events", "ctxkit.errors", "ctxkit.edits", "ctxkit.kept_set", "ctxkit.content", "ctxkit.log.file_format",
                                     "ctxkit.log.locks"},
               "ctxkit.log.sequencer": {"ctxkit.events", "ctxkit.errors", "ctxkit.edits", "ctxkit.kept_set", "ctxkit.content", "ctxkit.log.file_format",
                                    "ctxkit.log.locks"},
               "ctxkit.log.conversation": {"ctxkit.events", "ctxkit.errors", "ctxkit.edits", "ctxkit.kept_set", "ctxkit.content"},
               "ctxkit.log.event_log": {"ctxkit.events", "ctxkit.errors", "ctxkit.edits", "ctxkit.kept_set", "ctxkit.log.file_format", "ctxkit.log.locks",
                              "ctxkit.log.sequencer", "ctxkit.log.file_writes", "ctxkit.log.conversation", "ctxkit.content"},
               "ctxkit.log.state": {"ctxkit.events", "ctxkit.errors", "ctxkit.edits", "ctxkit.kept_set", "ctxkit.content"}}
    for name, ok in allowed.items():
        assert reachable(graph, name) <= ok, f"{name} reaches {sorted(reachable(graph, name) - ok)}"


def test_memory_log_lives_in_the_log_layer():
    import ctxkit.context.builder
    import ctxkit.log.event_log

    assert ctxkit.log.event_log.MemoryLog.__module__ == "ctxkit.log.event_log"
    assert ctxkit.context.builder.MemoryLog is ctxkit.log.event_log.MemoryLog  # the builder's old name is the same class


def test_both_logs_follow_the_log_protocols(tmp_path):
    """`EventLog` and `MemoryLog` share one reading and recording face, declared once (`ReadableLog`,
    `EpisodeLog`); what is not a log is refused by the builder and read as events by replay."""
    from ctxkit.log.protocols import EpisodeLog, ReadableLog
    from ctxkit.training.context_replay import load_events

    file_log = EventLog.create(tmp_path / "a.jsonl", episode_id="same")
    memory_log = MemoryLog()
    for log in (file_log, memory_log):
        log.extend(head_events())
        assert isinstance(log, EpisodeLog) and isinstance(log, ReadableLog)
    assert [e.id for e in load_events(file_log)[0]] == [e.id for e in load_events(memory_log)[0]]
    assert len(memory_log.events()) == 3
    events = memory_log.events()
    assert not isinstance(events, ReadableLog) and not isinstance(str(tmp_path / "a.jsonl"), ReadableLog)
    assert load_events(list(events))[0] == events
    file_log.close()
