"""Trajectory importers on the real files in ../shared/trajectories: formats, counts, rewards, round trips,
text-call grammar errors, and `ctxkit import` with --select, --out-dir and --tools."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import shared_path
from ctxkit.cli.parser import main
from ctxkit.log.conversation import export_messages
from ctxkit.errors import ImportFormatError
from ctxkit.events import EpisodeEnd, EpisodeStart, Message
from ctxkit.log.importers import IMPORTERS, read_episodes, read_tools, select_episodes
from ctxkit.log.importers.adp import to_source_messages
from ctxkit.log.importers.common import drop_nulls
from ctxkit.log.importers.text_calls import format_text_call, parse_text_call
from ctxkit.log.event_log import EventLog, read_events
from ctxkit.log.file_format import read_header

TAU = "tau-bench__gpt-4o-airline.json"
TOOLS = "tau-bench__airline_tools.json"
SWE_FC = "sweagent__marshmallow-1867__function_calling_replace_from_source.traj"
SWE_TA = "sweagent__pydicom-1458.traj"
ADP_OH = "adp__swe-gym_openhands_sampled_trajectories__sample_raw.json"
ADP_SMITH = "adp__swe-smith__sample_raw.json"
FILES = {TAU: ("tau-bench", 200), SWE_FC: ("swe-agent", 1), SWE_TA: ("swe-agent", 1), ADP_OH: ("adp", 5),
         ADP_SMITH: ("adp", 5)}


def traj(name):
    return shared_path("trajectories", name)


def messages_of(episode):
    return [e for e in episode.events if isinstance(e, Message)]


def test_registry_is_explicit():
    assert list(IMPORTERS) == ["openai", "swe-agent", "tau-bench", "adp", "mini-swe-agent", "openhands", "tau2", "sharegpt",
                              "adp-std"]
    assert all(imp.name == name for name, imp in IMPORTERS.items())


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_file_imports_with_auto(name):
    fmt, count = FILES[name]
    episodes = read_episodes(traj(name))
    assert len(episodes) == count
    for ep in episodes:
        start, end = ep.events[0], ep.events[-1]
        assert isinstance(start, EpisodeStart) and isinstance(end, EpisodeEnd)
        assert start.metadata["import"]["format"] == fmt == ep.source.format
        assert start.metadata["import"]["entry_id"] == ep.entry_id == start.episode_id != ""
    assert len({ep.entry_id for ep in episodes}) == count


@pytest.mark.parametrize("name, index, entry, n_messages, n_calls, n_tool, end", [
    (TAU, 0, "task-0-trial-0", 32, 8, 8, ("terminated", "scored_by_source", 0.0, "scored")),
    (TAU, 5, "task-5-trial-0", 26, 6, 6, ("terminated", "scored_by_source", 0.0, "scored")),
    (SWE_FC, 0, "marshmallow-code__marshmallow-1867", 28, 13, 13, ("terminated", "submitted", None, "unscored")),
    (SWE_TA, 0, "sweagent__pydicom-1458", 26, 12, 11, ("terminated", "submitted", None, "unscored")),
    (ADP_OH, 0, "python__mypy-15976_0", 41, 21, 20, ("terminated", "scored_by_source", 1.0, "scored")),
    (ADP_SMITH, 0, "arrow-py__arrow.1d70d009.lm_rewrite__nuzjfyur.l13ggwmx_1", 31, 15, 14,
     ("terminated", "scored_by_source", 1.0, "scored")),
])
def test_exact_counts_and_ends(name, index, entry, n_messages, n_calls, n_tool, end):
    ep = read_episodes(traj(name))[index]
    msgs = messages_of(ep)
    assert ep.entry_id == entry
    assert (len(msgs), sum(len(m.tool_calls) for m in msgs), sum(m.role == "tool" for m in msgs)) == (n_messages, n_calls, n_tool)
    last = ep.events[-1]
    assert (last.outcome, last.cause, last.reward, last.reward_kind) == end


def test_tau_bench_rewards_and_tools():
    source = json.loads(traj(TAU).read_text())
    tools = read_tools(traj(TOOLS))
    episodes = read_episodes(traj(TAU), tools=tools)
    assert [ep.events[-1].reward for ep in episodes] == [float(item["reward"]) for item in source]
    assert sum(ep.events[-1].reward for ep in episodes) == 84.0
    assert [t["function"]["name"] for t in episodes[0].events[0].tools][:2] == ["book_reservation", "calculate"]
    assert len(episodes[7].events[0].tools) == 14


def test_pending_final_calls_are_kept():
    for name in (ADP_SMITH, ADP_OH, SWE_TA):
        for ep in read_episodes(traj(name)):
            msgs = messages_of(ep)
            assert msgs[-1].role == "assistant" and msgs[-1].tool_calls
    assert messages_of(read_episodes(traj(SWE_TA))[0])[-1].tool_calls[0].arguments == '{"command": "submit\\n"}'


def test_round_trip_openai_shaped():
    for item, ep in zip(json.loads(traj(TAU).read_text()), read_episodes(traj(TAU))):
        assert export_messages(ep.events) == item["traj"]
    for item, ep in zip(json.loads(traj(ADP_OH).read_text()), read_episodes(traj(ADP_OH))):
        assert drop_nulls(export_messages(ep.events)) == drop_nulls(item["messages"])
    history = json.loads(traj(SWE_FC).read_text())["history"]
    expected = [{**{k: v for k, v in m.items() if k != "tool_call_ids"},
                 **({"tool_call_id": m["tool_call_ids"][0]} if "tool_call_ids" in m else {})} for m in history]
    assert export_messages(read_episodes(traj(SWE_FC))[0].events) == expected


def test_text_calls_recover_the_source_exactly():
    for item, ep in zip(json.loads(traj(ADP_SMITH).read_text()), read_episodes(traj(ADP_SMITH))):
        exported = export_messages(ep.events)
        assert not any("source_text" in m for m in exported)  # the canonical writer reproduces every turn
        assert to_source_messages(exported) == item["messages"]
    first = messages_of(read_episodes(traj(ADP_SMITH))[0])
    call = first[2].tool_calls[0]
    assert (call.name, json.loads(call.arguments)) == ("bash", {"command": 'find /testbed -type f -name "*.py" | grep -v "__pycache__" | sort'})
    assert first[3].role == "tool" and first[3].extra == {"source_prefix": "OBSERVATION:\n"}


def test_thought_action_text_is_recoverable():
    history = json.loads(traj(SWE_TA).read_text())["history"]
    msgs = messages_of(read_episodes(traj(SWE_TA))[0])
    for src, msg in zip(history, msgs):
        if src["role"] == "assistant":
            command = json.loads(msg.tool_calls[0].arguments)["command"]
            assert msg.content + "```\n" + command + "```" == src["content"] and "source_text" not in msg.extra


def test_text_call_grammar():
    parsed = parse_text_call("Look.\n\n<function=edit>\n<parameter=path>/a.py</parameter>\n"
                             "<parameter=new_str>\nx = 1\ny = 2\n</parameter>\n</function>")
    assert (parsed.thought, parsed.name, dict(parsed.arguments)) == ("Look.\n\n", "edit", {"path": "/a.py", "new_str": "x = 1\ny = 2"})
    assert format_text_call(parsed.thought, parsed.name, parsed.arguments).endswith("y = 2\n</parameter>\n</function>")
    assert parse_text_call("no call here").name is None


@pytest.mark.parametrize("text, error", [
    ("x <function=bash>\n<parameter=command>ls</parameter>\n", "has no closing </function>"),
    ("<function=bash>\n<parameter=command>ls</parameter>\n</function>\n<function=bash>\n</function>", "more than one"),
    ("<function=bash>\n<parameter=a>1</parameter><parameter=a>2</parameter>\n</function>", "parameter 'a' is given twice"),
    ("<function=bash>\nstray<parameter=a>1</parameter>\n</function>", "unexpected text 'stray"),
    ("<function=bash>\n</function> and then", "text after </function>"),
])
def test_text_call_errors_name_file_episode_and_turn(tmp_path, text, error):
    source = json.loads(traj(ADP_SMITH).read_text())[:2]
    source[1]["messages"][4]["content"] = text
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(source))
    with pytest.raises(ImportFormatError) as info:
        read_episodes(bad)
    entry = source[1]["id"]
    assert str(info.value).startswith(f"{bad}: episode {entry} (#1): turn 4: ") and error in str(info.value)
    assert (info.value.episode, info.value.turn) == (f"{entry} (#1)", 4)


def test_unknown_shape_lists_formats(tmp_path):
    odd = tmp_path / "odd.json"
    odd.write_text('{"steps": []}')
    with pytest.raises(ImportFormatError, match="no known trajectory format matches an object with keys \\['steps'\\]; "
                                                "known formats: openai: .*swe-agent: .*tau-bench: .*adp: "):
        read_episodes(odd)
    assert main(["import", str(odd), "-o", str(tmp_path / "x.jsonl")]) == 2
    with pytest.raises(ImportFormatError, match="not a tau-bench file"):
        read_episodes(traj(ADP_OH), format="tau-bench")


def test_a_source_whose_name_is_not_utf8_is_recorded_as_readable_text(tmp_path):
    src = os.fsdecode(bytes(tmp_path) + b"/traj-\xff.json")  # surrogate-escaped: not UTF-8 text
    shutil.copyfile(traj(SWE_FC), src)  # its entry id comes from the file's content, not its name
    [episode] = read_episodes(src)
    expected = f"{tmp_path}/traj-\\xff.json"  # the odd byte kept as the four characters \xff
    assert episode.source.path == src  # errors still name the file as given
    assert episode.source.to_dict()["path"] == expected
    out = tmp_path / "imported.jsonl"
    with EventLog.create(out, episode_id=episode.entry_id, metadata={"import": episode.source.to_dict()}) as log:
        log.extend(episode.events)
    assert read_header(out)["metadata"]["import"]["path"] == expected
    assert read_events(out)[0].metadata["import"] == {"path": expected, "format": "swe-agent", "index": 0,
                                                      "entry_id": "marshmallow-code__marshmallow-1867",
                                                      "variant": "function-calling"}


def test_an_entry_id_taken_from_a_name_that_is_not_utf8_is_readable_text(tmp_path):
    """A SWE-agent thought-action file names its episode after the file: an odd byte in the name is kept
    as the characters `\\xff` in the entry id, so the log's header writes."""
    src = os.fsdecode(bytes(tmp_path) + b"/pydicom-\xff.traj")
    shutil.copyfile(traj(SWE_TA), src)
    [episode] = read_episodes(src)
    assert episode.entry_id == "pydicom-\\xff"
    out = tmp_path / "imported.jsonl"
    with EventLog.create(out, episode_id=episode.entry_id, metadata={"import": episode.source.to_dict()}) as log:
        log.extend(episode.events)
    assert read_header(out)["episode_id"] == "pydicom-\\xff"


def test_select():
    episodes = read_episodes(traj(TAU))
    picked = select_episodes(episodes, "task-3-trial-2,0,10:12")
    assert [e.entry_id for e in picked] == ["task-0-trial-0", "task-10-trial-0", "task-11-trial-0", "task-3-trial-2"]
    assert [e.source.index for e in read_episodes(traj(TAU), select=":3")] == [0, 1, 2]


def test_cli_out_dir_select_and_tools(tmp_path, capsys):
    out = tmp_path / "logs"
    assert main(["import", str(traj(TAU)), "--out-dir", str(out), "--select", "0:3,task-49-trial-3",
                 "--tools", str(traj(TOOLS))]) == 0
    assert capsys.readouterr().out.startswith(f"wrote 4 logs (")
    assert sorted(p.name for p in out.iterdir()) == ["task-0-trial-0.jsonl", "task-1-trial-0.jsonl",
                                                     "task-2-trial-0.jsonl", "task-49-trial-3.jsonl"]
    events = read_events(out / "task-0-trial-0.jsonl")
    assert events[0].episode_id == "task-0-trial-0" and len(events[0].tools) == 14
    assert (events[-1].reward_kind, events[-1].reward) == ("scored", 0.0)
    assert main(["import", str(traj(TAU)), "--out-dir", str(out), "--select", "0"]) == 2
    assert "task-0-trial-0.jsonl: already exists; pass --force to replace it" in capsys.readouterr().err


def test_cli_one_episode_and_errors(tmp_path, capsys):
    log = tmp_path / "ep.jsonl"
    assert main(["import", str(traj(SWE_FC)), "--format", "swe-agent", "-o", str(log)]) == 0
    assert capsys.readouterr().out == f"wrote 30 events to {log} (episode marshmallow-code__marshmallow-1867)\n"
    assert main(["import", str(traj(ADP_SMITH)), "-o", str(tmp_path / "many.jsonl")]) == 2
    assert "holds 5 episodes; use --out-dir DIR, or --select one" in capsys.readouterr().err
    assert main(["import", str(traj(ADP_SMITH)), "--select", "4", "-o", str(tmp_path / "one.jsonl")]) == 0
    capsys.readouterr()
    assert main(["import", str(traj(TAU)), "--select", "nope", "-o", str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ctxkit: error: --select 'nope': no episode has this id") and err.count("\n") == 1


def test_cli_offline_steps(tmp_path, capsys):
    pytest.importorskip("ctxkit.training.offline_steps")
    tok = shared_path("tokenizers", "qwen2.5-instruct")
    log = tmp_path / "tau.jsonl"
    assert main(["import", str(traj(TAU)), "--select", "task-5-trial-0", "--tools", str(traj(TOOLS)),
                 "--tokenizer", str(tok), "-o", str(log)]) == 0
    events = read_events(log)
    steps = [e for e in events if e.kind == "step"]
    assert len(steps) == sum(1 for m in read_episodes(traj(TAU))[5].events if isinstance(m, Message) and m.role == "assistant")
    assert all(s.token_ids and s.logprobs is None for s in steps)
