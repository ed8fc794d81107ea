"""Pending calls vs. broken pairing, on the shapes real episodes have (issue 9): an episode ending with an
unanswered `submit` call builds at every step and keeps the call; a duplicated result, an orphaned result
and a call left unanswered before a later turn are typed errors naming the event and the call."""

from __future__ import annotations

import json

import pytest

from conftest import tokenizer_dir
from ctxkit.context.builder import ContextBuilder, rebuild
from ctxkit.cli.parser import main
from ctxkit.context.compress.base import BaseCompressor
from ctxkit.log.conversation import import_conversation
from ctxkit.edits import DropEdit
from ctxkit.errors import InvariantError, MessageFormatError, ToolPairingError
from ctxkit.log.event_log import EventLog, MemoryLog
from ctxkit.text.rendering.renderer import render


def call(cid: str, name: str, args: dict) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def swe_episode() -> dict:
    """The shape of a SWE-agent function-calling episode: it ends with a `submit` call and no result."""
    return {
        "tools": [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                                    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}},
                  {"type": "function", "function": {"name": "submit", "description": "submit the patch",
                                                    "parameters": {"type": "object", "properties": {}}}}],
        "messages": [
            {"role": "system", "content": "You are a software engineer."},
            {"role": "user", "content": "Fix the failing test in tests/test_fields.py."},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [call("call_1", "bash", {"command": "ls"})]},
            {"role": "tool", "tool_call_id": "call_1", "content": "src\ntests\n"},
            {"role": "assistant", "content": "Patched; submitting.", "tool_calls": [call("call_2", "submit", {})]},
        ],
    }


@pytest.fixture(scope="module")
def tok() -> str:
    return str(tokenizer_dir("qwen2.5-instruct"))


def memory_log(conversation) -> MemoryLog:
    log = MemoryLog()
    log.extend(import_conversation(conversation))
    return log


def test_episode_ending_in_submit_builds_at_every_step_and_keeps_the_call(tok):
    events = import_conversation(swe_episode())
    builder = ContextBuilder(tok, budget=4000, detect_pins=False)
    log = MemoryLog()
    sizes = []
    for e in events:
        if getattr(e, "role", None) == "assistant":
            sizes.append(builder.build(log).n_tokens)  # the decision point before each assistant turn
        log.append(e)
    final = builder.build(log)
    last = final.view.messages[-1]
    assert (last.role, [tc.id for tc in last.tool_calls]) == ("assistant", ["call_2"])
    assert len(sizes) == 2 and sizes[0] < sizes[1] < final.n_tokens
    # the final context is the plain render of the messages (the pending call included)
    assert final.token_ids == render(swe_episode()["messages"], tok, tools=swe_episode()["tools"],
                                     add_generation_prompt=True).token_ids
    assert rebuild(log, tokenizer=tok).hash == final.hash


@pytest.mark.parametrize("compressor", ["window", "mask-observations", "truncate-tool-output", "keep-all"])
def test_compressors_keep_the_pending_call_with_its_turn(tok, compressor):
    log = memory_log(swe_episode())
    full = ContextBuilder(tok, budget=100_000, detect_pins=False).build(log).n_tokens
    ctx = ContextBuilder(tok, compressor=compressor, budget=full - 5, detect_pins=False,
                         params={"trigger": "every_turn"} if compressor != "keep-all" else None).build(log) \
        if compressor != "keep-all" else ContextBuilder(tok, budget=full, detect_pins=False).build(log)
    assert [tc.id for tc in ctx.view.messages[-1].tool_calls] == ["call_2"]


def test_duplicated_result_is_named_as_such(tok):
    conv = swe_episode()
    conv["messages"].insert(4, {"role": "tool", "tool_call_id": "call_1", "content": "src\ntests\n"})
    log = memory_log(conv)
    dup = log.events()[5]
    with pytest.raises(ToolPairingError, match=rf"tool result {dup.id} answers call 'call_1', which an earlier "
                                               r"result already answered \(duplicated result\)") as err:
        ContextBuilder(tok, budget=4000, detect_pins=False).build(log)
    assert (err.value.problem, err.value.event, err.value.call_id) == ("duplicated_result", dup.id, "call_1")
    assert isinstance(err.value, InvariantError)


def test_orphaned_result_is_named_at_import_render_and_build(tok):
    conv = swe_episode()
    conv["messages"][3]["tool_call_id"] = "call_9"
    with pytest.raises(ToolPairingError, match=r"messages\[3\]: tool message answers tool_call_id 'call_9'.*orphaned result") as err:
        import_conversation(conv)
    assert (err.value.problem, err.value.call_id) == ("orphaned_result", "call_9")
    with pytest.raises(ToolPairingError, match=r"message 3: .*'call_9'.*orphaned result") as err:
        render(conv["messages"], tok)
    assert isinstance(err.value, MessageFormatError) and err.value.problem == "orphaned_result"


def test_call_unanswered_before_a_later_turn(tok):
    conv = swe_episode()
    del conv["messages"][3]
    conv["messages"].insert(3, {"role": "user", "content": "Any news?"})
    log = memory_log(conv)
    caller, later = log.events()[3], log.events()[4]
    with pytest.raises(ToolPairingError, match=rf"tool call 'call_1' of {caller.id} has no result before the next "
                                               rf"message {later.id} \(unanswered call\)") as err:
        ContextBuilder(tok, budget=4000, detect_pins=False).build(log)
    assert err.value.problem == "unanswered_call"


class DropsLastResult(BaseCompressor):
    """Broken on purpose: drops the newest tool result, which would make its call look pending."""

    NAME = "drops-last-result"
    DEFAULTS: dict = {}

    def propose(self, request, n_tokens):
        last = [m for m in request.view.messages if m.role == "tool"][-1]
        return [DropEdit(last.provenance.event_ids)], {}


def test_a_compressor_cannot_turn_an_answered_call_into_a_pending_one(tok):
    conv = swe_episode()
    del conv["messages"][4]  # ends with call_1 answered
    log = memory_log(conv)
    with pytest.raises(ToolPairingError, match=r"tool call 'call_1' of .* lost its result to the compaction") as err:
        ContextBuilder(tok, compressor=DropsLastResult(trigger="every_turn"), budget=4000, detect_pins=False).build(log)
    assert err.value.problem == "unanswered_call"


def test_cli_build_on_a_log_ending_in_submit(tmp_path, tok, capsys):
    path = tmp_path / "swe.jsonl"
    log = EventLog.create(path)
    log.extend(import_conversation(swe_episode()))
    log.close()
    assert main(["build", str(path), "--tokenizer", tok, "--budget", "4000", "--all-steps", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[2]["n_tokens"] > rows[1]["n_tokens"] > rows[0]["n_tokens"]


def test_cli_build_names_a_duplicated_result(tmp_path, tok, capsys):
    conv = swe_episode()
    conv["messages"].insert(4, {"role": "tool", "tool_call_id": "call_1", "content": "again"})
    path = tmp_path / "dup.jsonl"
    log = EventLog.create(path)
    recorded = log.extend(import_conversation(conv))
    log.close()
    assert main(["build", str(path), "--tokenizer", tok, "--budget", "4000"]) != 0
    err = capsys.readouterr().err
    assert f"tool result {recorded[5].id} answers call 'call_1', which an earlier result already answered" in err
    assert len(err.strip().splitlines()) == 1
