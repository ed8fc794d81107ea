"""The importers added for issue 22 (mini-swe-agent, OpenHands, tau2-bench, legacy function calls, ShareGPT)
and the episode-by-episode reading (JSONL line by line, malformed episodes skipped or refused with
--strict, mixed formats): golden event sequences on small hand-written snippets of each format, the real
shared file of each, and every error path with its exact message."""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import shared_path
from ctxkit.cli.parser import main
from ctxkit.errors import ImportFormatError
from ctxkit.events import EpisodeEnd, EpisodeStart, Message, ToolResult
from ctxkit.log.event_log import read_events
from ctxkit.log.importers import import_file, read_episodes


def golden(episode) -> list[tuple]:
    """The events as short tuples: messages (role, content, calls, answered id), tool results, the end."""
    out = []
    for e in episode.events:
        if isinstance(e, Message):
            out.append((e.role, e.content, [(c.id, c.name, c.arguments) for c in e.tool_calls], e.tool_call_id))
        elif isinstance(e, ToolResult):
            out.append(("tool_result", e.content, e.tool_call_id, e.name, e.status))
        elif isinstance(e, EpisodeEnd):
            out.append(("end", e.outcome, e.cause, e.reward, e.reward_kind))
        else:
            assert isinstance(e, EpisodeStart)
    return out


def write(tmp_path, name, obj) -> str:
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


def call(id_, name, args, index=None):
    out = {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}
    return out if index is None else {"index": index, **out}


MINI_V2 = {"trajectory_format": "mini-swe-agent-1.1", "instance_id": "demo-1", "info": {"exit_status": "Submitted"},
           "messages": [
               {"role": "system", "content": "You are a shell agent."},
               {"role": "user", "content": "Fix it."},
               {"role": "assistant", "content": "Look first.", "reasoning_content": "ls is cheap",
                "tool_calls": [call("c1", "bash", '{"command": "ls"}', 0)], "function_call": None,
                "extra": {"cost": 0.1}},
               {"role": "tool", "tool_call_id": "c1", "content": "<returncode>0</returncode>\n<output>\na.py\n</output>",
                "extra": {"returncode": 0, "exception_info": ""}},
               {"role": "assistant", "content": "Two at once.", "tool_calls": [
                   call("c2", "bash", '{"command": "grep x a.py"}', 0), call("c3", "bash", '{"command": "sleep 99"}', 1)]},
               {"role": "tool", "tool_call_id": "c2", "content": "<returncode>1</returncode>\n<output>\n</output>",
                "extra": {"returncode": 1, "exception_info": ""}},
               {"role": "tool", "tool_call_id": "c3", "content": "timed out",
                "extra": {"returncode": -1, "exception_info": "TimeoutExpired: 60 s"}},
               {"role": "assistant", "content": "Done.", "tool_calls": [call("c4", "bash", '{"command": "submit"}', 0)]},
               {"role": "exit", "content": "diff", "extra": {"exit_status": "Submitted", "submission": "diff"}}]}


def test_mini_swe_agent_v2_golden(tmp_path):
    [ep] = read_episodes(write(tmp_path, "demo.traj.json", MINI_V2))
    assert (ep.entry_id, ep.source.format, ep.source.variant) == ("demo-1", "mini-swe-agent", "tool-calling")
    assert golden(ep) == [
        ("system", "You are a shell agent.", [], None),
        ("user", "Fix it.", [], None),
        ("assistant", "Look first.", [("c1", "bash", '{"command": "ls"}')], None),
        ("tool", "<returncode>0</returncode>\n<output>\na.py\n</output>", [], "c1"),
        ("assistant", "Two at once.", [("c2", "bash", '{"command": "grep x a.py"}'), ("c3", "bash", '{"command": "sleep 99"}')], None),
        ("tool_result", "<returncode>1</returncode>\n<output>\n</output>", "c2", None, "error"),
        ("tool_result", "timed out", "c3", None, "timeout"),
        ("assistant", "Done.", [("c4", "bash", '{"command": "submit"}')], None),
        ("end", "terminated", "submitted", None, "unscored"),
    ]
    messages = [e for e in ep.events if isinstance(e, Message)]
    assert messages[2].reasoning_content == "ls is cheap" and messages[2].extra == {"extra": {"cost": 0.1}}
    assert messages[3].extra == {"extra": {"returncode": 0, "exception_info": ""}}
    source = ep.events[0].metadata["source"]
    assert source["exit"] == MINI_V2["messages"][-1]
    assert source["tool_result_extra"] == {"5": {"extra": {"returncode": 1, "exception_info": ""}},
                                           "6": {"extra": {"returncode": -1, "exception_info": "TimeoutExpired: 60 s"}}}


def test_mini_swe_agent_v1_text_actions_and_limit_exit(tmp_path):
    text = "I list.\n\n```bash\nls -la\n```"
    doc = {"trajectory_format": "mini-swe-agent-1", "instance_id": "v1", "info": {"exit_status": "LimitsExceeded"},
           "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "T"},
                        {"role": "assistant", "content": text}, {"role": "user", "content": "<returncode>0</returncode>"}]}
    [ep] = read_episodes(write(tmp_path, "v1.traj.json", doc))
    assert ep.source.variant == "text-actions"
    assert golden(ep) == [("system", "S", [], None), ("user", "T", [], None),
                          ("assistant", "I list.\n\n", [("call_2", "bash", '{"command": "ls -la"}')], None),
                          ("tool", "<returncode>0</returncode>", [], "call_2"),
                          ("end", "truncated", "LimitsExceeded", None, "unscored")]
    assert [e for e in ep.events if isinstance(e, Message)][2].extra == {"source_text": text}


def oh_event(id_, source, **kw):
    return {"id": id_, "source": source, "timestamp": "t", **kw}


def oh_meta(call_id, fn, response_id, message):
    return {"tool_call_id": call_id, "function_name": fn,
            "model_response": {"id": response_id, "choices": [{"message": message}]}}


RESPONSE = {"role": "assistant", "content": "Run both.", "function_call": None,
            "tool_calls": [call("t1", "execute_bash", '{"command": "make"}', 1), call("t2", "think", '{"thought": "hm"}', 2)]}
OH_EVENTS = [
    oh_event(0, "agent", action="system", message="sys", args={"content": "You are OpenHands.", "tools": [
        {"type": "function", "function": {"name": "execute_bash"}}]}),
    oh_event(1, "user", action="message", message="Fix the bug.", args={"content": "Fix the bug."}),
    oh_event(2, "user", action="recall", message="Retrieving", args={"query": "Fix the bug."}),
    oh_event(3, "environment", observation="recall", cause=2, content="Added workspace context", extras={}),
    oh_event(4, "agent", action="run", message="Running make", args={"command": "make"},
             tool_call_metadata=oh_meta("t1", "execute_bash", "r1", RESPONSE)),
    oh_event(5, "agent", action="think", message="hm", args={"thought": "hm"},
             tool_call_metadata=oh_meta("t2", "think", "r1", RESPONSE)),
    oh_event(6, "agent", observation="run", cause=4, content="make: *** Error 2", success=False,
             extras={"metadata": {"exit_code": 2}}, tool_call_metadata=oh_meta("t1", "execute_bash", "r1", RESPONSE)),
    oh_event(7, "agent", observation="think", cause=5, content="Your thought has been logged.", extras={},
             tool_call_metadata=oh_meta("t2", "think", "r1", RESPONSE)),
    oh_event(8, "agent", observation="error", content="Parameter 'command' is expected to be one of ['view'].",
             extras={"error_id": ""}),
    oh_event(9, "agent", action="finish", message="done", args={"final_thought": "done"},
             tool_call_metadata=oh_meta("t3", "finish", "r2", {"role": "assistant", "content": "Finished.",
                                                               "tool_calls": [call("t3", "finish", "{}", 1)]})),
]


def test_openhands_event_list_golden(tmp_path):
    [ep] = read_episodes(write(tmp_path, "events.json", OH_EVENTS))
    assert ep.source.format == "openhands" and ep.events[0].tools == ({"type": "function", "function": {"name": "execute_bash"}},)
    assert golden(ep) == [
        ("system", "You are OpenHands.", [], None),
        ("user", "Fix the bug.", [], None),
        ("assistant", "Run both.", [("t1", "execute_bash", '{"command": "make"}'), ("t2", "think", '{"thought": "hm"}')], None),
        ("tool_result", "make: *** Error 2", "t1", "execute_bash", "error"),
        ("tool", "Your thought has been logged.", [], "t2"),
        ("user", "Parameter 'command' is expected to be one of ['view'].", [], None),
        ("assistant", "Finished.", [("t3", "finish", "{}")], None),
        ("end", "terminated", "finish", None, "unscored"),
    ]
    source = ep.events[0].metadata["source"]
    assert [e["id"] for e in source["not_in_view"]] == [2, 3]
    assert source["tool_result_extra"] == {"3": {"openhands_observation": "run"}}


def test_openhands_jsonl_rows_name_their_lines_and_a_row_error_is_a_truncation(tmp_path):
    rows = [{"instance_id": "a", "history": OH_EVENTS, "error": None},
            {"instance_id": "b", "history": OH_EVENTS[:8], "error": "RuntimeError: Agent reached maximum iteration"}]
    path = write(tmp_path, "output.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    a, b = read_episodes(path)
    assert [(a.entry_id, a.source.line), (b.entry_id, b.source.line)] == [("a", 1), ("b", 2)]
    assert a.events[0].metadata["import"]["line"] == 1
    assert golden(b)[-1] == ("end", "truncated", "agent_error", None, "unscored")
    assert b.events[-1].scores == {"error": "RuntimeError: Agent reached maximum iteration"}


TAU2 = {"timestamp": "t", "tasks": [{"id": "task-1", "description": "roaming"}],
        "info": {"agent_info": {"llm": "gpt-4o"}, "environment_info": {"domain_name": "telecom", "policy": "Be nice."}},
        "simulations": [{"id": "uuid-1", "task_id": "task-1", "trial": 0, "termination_reason": "user_stop",
                         "reward_info": {"reward": 1.0, "db_check": {"db_match": True}}, "messages": [
            {"role": "assistant", "content": "Hi! How can I help you today?", "tool_calls": None, "turn_idx": 0},
            {"role": "user", "content": "My data is slow.", "tool_calls": None, "turn_idx": 1},
            {"role": "assistant", "content": None, "turn_idx": 2, "tool_calls": [
                {"id": "a1", "name": "get_line", "arguments": {"phone": "555"}, "requestor": "assistant"}]},
            {"id": "a1", "role": "tool", "content": "no such line", "requestor": "assistant", "error": True, "turn_idx": 3},
            {"role": "user", "content": None, "turn_idx": 4, "tool_calls": [
                {"id": "u1", "name": "toggle_roaming", "arguments": {}, "requestor": "user"}]},
            {"id": "u1", "role": "tool", "content": "Roaming ON", "requestor": "user", "error": False, "turn_idx": 5},
            {"role": "user", "content": "I turned roaming on.", "tool_calls": None, "turn_idx": 6},
            {"role": "assistant", "content": "Great.", "tool_calls": None, "turn_idx": 7}]}]}


def test_tau2_golden_the_user_simulator_side_stays_out_of_the_view(tmp_path):
    [ep] = read_episodes(write(tmp_path, "results.json", TAU2))
    assert (ep.entry_id, ep.source.format) == ("task-1-trial-0", "tau2")
    assert golden(ep) == [
        ("system", "Be nice.", [], None),
        ("assistant", "Hi! How can I help you today?", [], None),
        ("user", "My data is slow.", [], None),
        ("assistant", None, [("a1", "get_line", {"phone": "555"})], None),
        ("tool_result", "no such line", "a1", "get_line", "error"),
        ("user", "I turned roaming on.", [], None),
        ("assistant", "Great.", [], None),
        ("end", "terminated", "user_stop", 1.0, "scored"),
    ]
    source = ep.events[0].metadata["source"]
    assert [(m["turn_idx"], m["role"]) for m in source["user_side"]] == [(4, "user"), (5, "tool")]
    assert source["task"] == {"id": "task-1", "description": "roaming"}
    assert ep.events[-1].scores == {"reward_info": {"reward": 1.0, "db_check": {"db_match": True}}}


def test_tau2_limit_ends_are_truncations_whose_reward_is_not_the_task_score(tmp_path):
    doc = json.loads(json.dumps(TAU2))
    doc["simulations"][0]["termination_reason"] = "max_steps"
    doc["simulations"][0]["reward_info"]["reward"] = 0.0
    [ep] = read_episodes(write(tmp_path, "results.json", doc))
    assert golden(ep)[-1] == ("end", "truncated", "max_steps", 0.0, "limit_truncation")


def test_adp_entries_keyed_id_messages_with_legacy_function_calls(tmp_path):
    doc = [{"id": "toucan-0", "question": "q", "messages": [
        {"role": "system", "content": "tools: search"}, {"role": "user", "content": "Research X."},
        {"role": "assistant", "content": "Let me search."},
        {"role": "assistant", "content": "", "function_call": {"name": "search", "arguments": '{"q": "X"}'}},
        {"role": "function", "name": "search", "content": "X is a company."},
        {"role": "assistant", "content": "X is a company."}]}]
    [ep] = read_episodes(write(tmp_path, "toucan.json", doc))
    assert (ep.entry_id, ep.source.format, ep.source.variant) == ("toucan-0", "adp", "legacy-function-call")
    assert golden(ep) == [
        ("system", "tools: search", [], None), ("user", "Research X.", [], None),
        ("assistant", "Let me search.", [("call_3", "search", '{"q": "X"}')], None),
        ("tool", "X is a company.", [], "call_3"),
        ("assistant", "X is a company.", [], None),
        ("end", "truncated", "source_ended", None, "unscored"),
    ]
    assert [e for e in ep.events if isinstance(e, Message)][2].extra == {"source_split": {"content": ""}}


def test_sharegpt_golden(tmp_path):
    doc = [{"id": "ca-1", "system": "You are CodeAct.", "conversations": [
        {"from": "human", "value": "Compute 2+2."},
        {"from": "function_call", "value": "Let me run it.\n<function=python>\n<parameter=code>print(2+2)</parameter>\n</function>"},
        {"from": "observation", "value": "EXECUTION RESULT of [python]:\n4"},
        {"from": "gpt", "value": "The answer is 4."},
        {"from": "function_call", "value": "<function=finish>\n<parameter=message>\n4\n</parameter>\n</function>"}]}]
    [ep] = read_episodes(write(tmp_path, "sft.json", doc))
    assert (ep.entry_id, ep.source.format) == ("ca-1", "sharegpt")
    assert golden(ep) == [
        ("system", "You are CodeAct.", [], None), ("user", "Compute 2+2.", [], None),
        ("assistant", "Let me run it.\n", [("call_1", "python", '{"code": "print(2+2)"}')], None),
        ("tool", "4", [], "call_1"),
        ("assistant", "The answer is 4.", [], None),
        ("assistant", "", [("call_4", "finish", '{"message": "4"}')], None),
        ("end", "truncated", "source_ended", None, "unscored"),
    ]
    assert [e for e in ep.events if isinstance(e, Message)][3].extra == {"source_prefix": "EXECUTION RESULT of [python]:\n"}


def test_an_openai_import_states_its_end(tmp_path):
    [ep] = read_episodes(write(tmp_path, "chat.json", {"messages": [{"role": "user", "content": "hi"},
                                                                     {"role": "assistant", "content": "hello"}]}))
    assert golden(ep) == [("user", "hi", [], None), ("assistant", "hello", [], None),
                          ("end", "truncated", "source_ended", None, "unscored")]


# -- the real shared files -------------------------------------------------------------------------------

REAL = {
    "minisweagent__deepseek-chat__pydicom-901.traj.json":
        ("mini-swe-agent", 1, "pydicom__pydicom-901", 123, 61, 5, ("terminated", "submitted", None, "unscored")),
    "openhands__multi_swe_bench_output.jsonl":
        ("openhands", 3, "ponylang__ponyc-4595", 0, 0, 5, ("terminated", "finish", None, "unscored")),
    "tau2__telecom_gpt-4o_20sims.json":
        ("tau2", 20, "[mobile_data_issue]user_abroad_roaming_enabled_off[PERSONA:None]-trial-0", 0, 0, 0,
         ("terminated", "user_stop", 0.0, "scored")),
    "adp__toucan_1_5m__sample_raw.json": ("adp", 1, "toucan_sample_0", 5, 1, 0, ("truncated", "source_ended", None, "unscored")),
    "adp__codeactinstruct__sample_sft.json":
        ("sharegpt", 5, "oct28_full6728/reasoning/intermediate_algebra/3078/gpt-3.5-turbo-0613/max5_p2+tool+cd", 9, 4, 0,
         ("truncated", "source_ended", None, "unscored")),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_shared_files(name):
    fmt, count, first_id, n_chat, n_calls, n_errors, end = REAL[name]
    result = import_file(shared_path("trajectories", name))
    assert result.skipped == () and len(result.episodes) == count
    ep = result.episodes[0]
    assert (ep.source.format, ep.entry_id) == (fmt, first_id)
    chat = [e for e in ep.events if isinstance(e, (Message, ToolResult))]
    if n_chat:
        assert (len(chat), sum(len(getattr(e, "tool_calls", ())) for e in chat)) == (n_chat, n_calls)
    assert sum(isinstance(e, ToolResult) and e.status == "error" for e in ep.events) == n_errors
    last = ep.events[-1]
    assert (last.outcome, last.cause, last.reward, last.reward_kind) == end


def test_real_tau2_rewards_and_user_side():
    episodes = read_episodes(shared_path("trajectories", "tau2__telecom_gpt-4o_20sims.json"))
    assert sorted(e.events[-1].reward for e in episodes) == [0.0] * 6 + [1.0] * 14
    user_side = sum(len(e.events[0].metadata["source"].get("user_side", [])) for e in episodes)
    assert user_side == 99 + 125  # user turns that only call tools, and the results they get
    assert sum(isinstance(x, ToolResult) for e in episodes for x in e.events) == 1


# -- errors: bad JSONL lines, malformed episodes, mixed formats -----------------------------------------

def rows_file(tmp_path, rows: list[str]) -> str:
    return write(tmp_path, "rows.jsonl", "\n".join(rows) + "\n")


def test_a_bad_jsonl_line_is_skipped_and_named_or_refused_with_strict(tmp_path, capsys):
    good = json.dumps({"instance_id": "a", "history": OH_EVENTS})
    path = rows_file(tmp_path, [good, '{"instance_id": "b", "history": [', json.dumps({"instance_id": "c", "history": OH_EVENTS})])
    result = import_file(path)
    assert [e.entry_id for e in result.episodes] == ["a", "c"]
    assert [(s.index, s.entry_id) for s in result.skipped] == [(1, "")]
    message = f"{path}:2: episode #1: invalid JSON: unexpected end of data (column 34)"
    assert result.skipped[0].reason == message
    with pytest.raises(ImportFormatError) as info:
        read_episodes(path)
    assert str(info.value) == message and info.value.line == 2
    again = pickle.loads(pickle.dumps(info.value))  # crosses process pools whole, its location once
    assert (str(again), again.path, again.line, again.episode) == (message, path, 2, "#1")
    out = tmp_path / "logs"
    assert main(["import", path, "--out-dir", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"ctxkit import: skipped episode #1: {message}\n"
    assert captured.out == f"wrote 2 logs (18 events) to {out}; skipped 1 malformed episode (see stderr)\n"
    assert sorted(p.name for p in out.iterdir()) == ["a.jsonl", "c.jsonl"]
    assert main(["import", path, "--out-dir", str(tmp_path / "strict"), "--strict"]) == 2
    assert capsys.readouterr().err == f"ctxkit: error: {message}\n"
    assert not (tmp_path / "strict").exists()
    first_bad = rows_file(tmp_path, ["{oops", good])
    result = import_file(first_bad)  # the format is told from the lines that parse
    assert [e.entry_id for e in result.episodes] == ["a"] and result.episodes[0].source.line == 2
    assert [s.reason for s in result.skipped] == [f"{first_bad}:1: episode #0: invalid JSON: unexpected character, expected a string key (column 2)"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(good=st.lists(st.booleans(), min_size=1, max_size=8).filter(any))
def test_jsonl_rows_import_in_order_and_exactly_the_bad_lines_are_skipped(tmp_path, good):
    rows = [json.dumps({"instance_id": f"r{i}", "history": OH_EVENTS[:2]}) if ok else f'{{"instance_id": "r{i}"'
            for i, ok in enumerate(good)]
    path = rows_file(tmp_path, rows)
    result = import_file(path)
    assert [(e.entry_id, e.source.line) for e in result.episodes] == [(f"r{i}", i + 1) for i, ok in enumerate(good) if ok]
    assert [s.index for s in result.skipped] == [i for i, ok in enumerate(good) if not ok]
    assert all(s.reason.startswith(f"{path}:{s.index + 1}: episode #{s.index}: invalid JSON: ") for s in result.skipped)


def smith_with_a_stripped_closing_tag(tmp_path) -> tuple[str, str]:
    """The SWE-smith sample with one turn of episode #2 cut as a stop word would cut it: no `</function>`."""
    source = json.loads(shared_path("trajectories", "adp__swe-smith__sample_raw.json").read_text())
    turn = source[2]["messages"][2]
    turn["content"] = turn["content"].replace("</function>", "")
    return write(tmp_path, "smith.json", source), source[2]["id"]


def test_a_malformed_episode_is_skipped_the_rest_imports_and_strict_refuses(tmp_path, capsys):
    path, bad_id = smith_with_a_stripped_closing_tag(tmp_path)
    message = (f"{path}: episode {bad_id} (#2): turn 2: a <function=...> block at character 276 has no closing "
               "</function> (or no '>' after the name)")
    result = import_file(path)
    assert len(result.episodes) == 4 and [s.reason for s in result.skipped] == [message]
    with pytest.raises(ImportFormatError) as info:
        read_episodes(path)
    assert str(info.value) == message
    assert len(read_episodes(path, select="0,1,3,4")) == 4  # --select skips it before it is read, even strict
    assert main(["import", path, "--select", "2", "-o", str(tmp_path / "x.jsonl")]) == 2
    assert capsys.readouterr().err == f"ctxkit: error: {message}\n"  # the one episode chosen: its own error
    assert main(["import", path, "--select", "2", "-o", str(tmp_path / "x.jsonl")]) == 2
    capsys.readouterr()
    with pytest.raises(ImportFormatError) as info:
        import_file(rows_file(tmp_path, [json.dumps({"instance_id": "a", "history": OH_EVENTS}), "{", "[1"]), select="1:")
    assert str(info.value) == (f"{tmp_path / 'rows.jsonl'}: no episode could be read; 2 malformed, the first: "
                               f"{tmp_path / 'rows.jsonl'}:2: episode #1: invalid JSON: unexpected end of data (column 2)")
    assert main(["import", path, "--strict", "--out-dir", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err == f"ctxkit: error: {message}\n"
    assert main(["import", path, "--out-dir", str(tmp_path / "ok")]) == 0
    assert capsys.readouterr().err == f"ctxkit import: skipped episode #2: {message}\n"
    assert len(list((tmp_path / "ok").iterdir())) == 4


def test_a_file_that_mixes_formats_is_refused_naming_entry_and_field(tmp_path):
    tau = json.loads(shared_path("trajectories", "tau-bench__gpt-4o-airline.json").read_text())[:2]
    sharegpt = {"id": "s", "conversations": [{"from": "human", "value": "hi"}]}
    path = write(tmp_path, "mixed.json", [*tau, sharegpt])
    with pytest.raises(ImportFormatError) as info:
        import_file(path)  # not skippable: the file is not one format
    assert str(info.value) == (f"{path}: episode #2: not a tau-bench entry: field(s) ['task_id', 'reward', 'traj'] "
                               "missing (a tau-bench result needs ['task_id', 'reward', 'traj']); it is a sharegpt entry "
                               "in a tau-bench file (the file mixes formats)")
    broken = write(tmp_path, "broken.json", [*tau, {"task_id": 9, "reward": 1, "traj": "no"}])
    with pytest.raises(ImportFormatError, match=r"episode task-9 \(#2\): not a tau-bench entry: field 'traj' is not a list$"):
        import_file(broken)


def test_repeated_entry_ids_are_refused(tmp_path):
    row = json.dumps({"instance_id": "a", "history": OH_EVENTS})
    path = rows_file(tmp_path, [row, row])
    with pytest.raises(ImportFormatError) as info:
        import_file(path)
    assert str(info.value) == f"{path}:2: entry id 'a' repeats (entries #0 and #1)"


def test_cli_writes_a_typed_end_for_each_new_format(tmp_path):
    out = tmp_path / "tau2"
    assert main(["import", str(shared_path("trajectories", "tau2__telecom_gpt-4o_20sims.json")), "--select", "0:2",
                 "--out-dir", str(out)]) == 0
    ends = [read_events(p)[-1] for p in sorted(out.iterdir())]
    assert [(e.outcome, e.cause, e.reward_kind) for e in ends] == [("terminated", "user_stop", "scored")] * 2


@pytest.mark.parametrize("name, doc, error", [
    ("toucan.json", [{"id": "t", "messages": [{"role": "user", "content": "q"},
                                              {"role": "function", "name": "search", "content": "r"}]}],
     "episode t (#0): turn 1: a 'function' result answers no function_call"),
    ("sft.json", [{"id": "s", "conversations": [{"from": "human", "value": "q"}, {"from": "observation", "value": "r"}]}],
     "episode s (#0): turn 1: a 'observation' turn answers no call"),
    ("sft2.json", [{"id": "s", "conversations": [{"from": "narrator", "value": "q"}]}],
     "episode s (#0): turn 0: field 'from': 'narrator' is not one of ['assistant', 'function_call', 'function_response', "
     "'gpt', 'human', 'observation', 'system', 'tool', 'user']"),
    ("m.traj.json", {**MINI_V2, "messages": [MINI_V2["messages"][-1], *MINI_V2["messages"][:2]]},
     "episode demo-1 (#0): turn 0: an 'exit' message may only come last (found at [0])"),
    ("r.json", {**TAU2, "simulations": [{**TAU2["simulations"][0], "messages": [{"role": "system", "content": "x"}]}]},
     "episode task-1-trial-0 (#0): turn 0: role 'system' is not assistant, user or tool"),
])
def test_a_malformed_turn_names_file_episode_and_turn(tmp_path, name, doc, error):
    path = write(tmp_path, name, doc)
    with pytest.raises(ImportFormatError) as info:
        import_file(path)  # the file's one episode is malformed: its own error
    assert str(info.value) == f"{path}: {error}"


def test_an_imported_chat_passes_audit(tmp_path, capsys):
    """The stated end is what lets `ctxkit audit` pass a chat import (no end failed `rewards` and `ends`)."""
    log = tmp_path / "logs" / "chat.jsonl"
    log.parent.mkdir()
    chat = write(tmp_path, "chat.json", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    assert main(["import", chat, "-o", str(log), "--tokenizer", str(shared_path("tokenizers", "qwen2.5-instruct"))]) == 0
    capsys.readouterr()
    assert main(["audit", str(log.parent)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("audit: ok")


ADP_STD = [{"schema_version": "1.3.1", "id": "std-1", "details": {"dataset": "demo"}, "content": [
    {"class_": "text_observation", "content": "Find 2+2.", "name": None, "source": "user"},
    {"tool_call_id": "call_000001", "class_": "code_action", "language": "python", "content": "print(2+2)",
     "description": "Compute it."},
    {"tool_call_id": "call_000001", "class_": "text_observation", "content": "4", "name": None, "source": "environment"},
    {"class_": "api_action", "function": "lookup", "kwargs": {"q": "four"}, "description": "", "reasoning_content": "check"},
    {"class_": "text_observation", "content": "four = 4", "source": "environment"},
    {"class_": "message_action", "content": "<solution> 4 </solution>", "description": "The answer is"}]}]


def test_adp_standardized_golden(tmp_path):
    [ep] = read_episodes(write(tmp_path, "sample_std.json", ADP_STD))
    assert (ep.entry_id, ep.source.format) == ("std-1", "adp-std")
    assert golden(ep) == [
        ("user", "Find 2+2.", [], None),
        ("assistant", "Compute it.", [("call_000001", "python", {"code": "print(2+2)"})], None),
        ("tool", "4", [], "call_000001"),
        ("assistant", "", [("call_3", "lookup", {"q": "four"})], None),
        ("tool", "four = 4", [], "call_3"),
        ("assistant", "<solution> 4 </solution>", [], None),
        ("end", "truncated", "source_ended", None, "unscored"),
    ]
    messages = [e for e in ep.events if isinstance(e, Message)]
    assert messages[3].reasoning_content == "check" and messages[5].extra == {"description": "The answer is"}
    assert ep.events[0].metadata["source"] == {"schema_version": "1.3.1", "id": "std-1", "details": {"dataset": "demo"}}
    bad = json.loads(json.dumps(ADP_STD))
    bad[0]["content"][2]["tool_call_id"] = "call_9"
    with pytest.raises(ImportFormatError) as info:
        read_episodes(write(tmp_path, "bad_std.json", bad))
    assert str(info.value) == (f"{tmp_path / 'bad_std.json'}: episode std-1 (#0): turn 2: an observation answers "
                               "tool_call_id 'call_9', which no unanswered action called")
