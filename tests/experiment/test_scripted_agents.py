"""Scripted agents: decisions from visible text only, token-exact turns, re-queries, honoured pins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import tokenizer_dir
from ctxkit.errors import ConfigError
from ctxkit.experiment.agents.base import AGENTS, AgentTurn, make_agent
from ctxkit.experiment.agents.scripts import POLICIES, chain_position, constraint_edit, calculator_chain, multi_hop, needle_recall
from ctxkit.experiment.tasks.base import TASKS

RULE = "Never modify the file settings; make every change in a copy named settings-local instead."


def test_every_task_has_a_script():
    assert sorted(POLICIES) == sorted(TASKS)
    assert set(AGENTS) >= {"scripted", "transformers", "openai"}


def test_chain_position_takes_the_highest_visible_file():
    text = "FILE logs/03.log\nnext: logs/04.log\n...\nFILE logs/01.log\nnext: logs/02.log\n"
    assert chain_position(text, "logs") == (3, "logs/03.log", "logs/04.log")
    assert chain_position("nothing here", "logs") == (-1, None, None)
    assert chain_position("FILE logs/05.log\n[... 80 tokens truncated ...]", "logs") == (5, "logs/05.log", None)


def test_needle_policy_follows_answers_and_requeries():
    assert needle_recall("start").arguments == {"path": "logs/00.log"}
    assert needle_recall("FILE logs/02.log\nnext: logs/03.log\n").arguments == {"path": "logs/03.log"}
    q = "FILE logs/05.log\nnext: none\nQUESTION: What is the access code for vault-7? It was logged in logs/01.log. Answer with the code only.\n"
    d = needle_recall(q)
    assert (d.tool, dict(d.arguments)) == ("read_file", {"path": "logs/01.log"})
    assert d.note.startswith("QUESTION: What is the access code for vault-7?")
    # after the re-read the code is still not visible (a truncating compressor cut it): search instead
    d = needle_recall(q + "FILE logs/01.log\nnext: logs/02.log\n[... 120 tokens truncated ...]\n")
    assert (d.tool, dict(d.arguments)) == ("search", {"query": "ACCESS CODE for vault-7 is"})
    # a distractor code for another vault is not the answer
    assert needle_recall(q + "ACCESS CODE for vault-70 is AAAA-BBBB\n").tool == "read_file"
    assert needle_recall("ACCESS CODE for vault-7 is K3F9-22QX\n" + q).answer == "K3F9-22QX"


def test_multi_hop_policy_hops_and_searches_what_is_missing():
    q = "QUESTION: In which city is the manager of Hiro's department based? Answer with the city only."
    assert dict(multi_hop(q).arguments) == {"query": "Hiro works in"}
    t = q + "\nFACT: Hiro works in the Vega department."
    assert dict(multi_hop(t).arguments) == {"query": "The Vega department is managed by"}
    t += "\nrecords/04.txt:9: FACT: The Vega department is managed by Sato."
    d = multi_hop(t)
    assert dict(d.arguments) == {"query": "Sato is based in"}
    assert d.note.splitlines() == [q.split(" Answer")[0], "FACT: Hiro works in the Vega department.",
                                   "FACT: The Vega department is managed by Sato."]
    assert multi_hop(t + "\nFACT: Sato is based in Oslo.").answer == "Oslo"


def test_calculator_policy_multiplies_recalls_and_reads_on():
    assert dict(calculator_chain("").arguments) == {"path": "sheet/01.txt"}
    s1 = "STEP 1 of 4: r1 = 12 * 34\n"
    assert (calculator_chain(s1).tool, dict(calculator_chain(s1).arguments)) == ("multiply", {"a": 12, "b": 34, "name": "r1"})
    done1 = s1 + "RESULT r1 = 12 * 34 = 408\n"
    assert dict(calculator_chain(done1).arguments) == {"path": "sheet/02.txt"}
    s4 = "STEP 4 of 4: r4 = r1 * 3\n"
    d = calculator_chain(s4)  # r1 is not visible: recall it
    assert (d.tool, dict(d.arguments), d.note) == ("recall", {"name": "r1"}, "STEP 4 of 4: r4 = r1 * 3")
    assert dict(calculator_chain(s4 + "RESULT r1 = 408\n").arguments) == {"a": 408, "b": 3, "name": "r4"}
    q = "QUESTION: Answer with the value of r4."
    assert dict(calculator_chain(q).arguments) == {"name": "r4"}
    assert calculator_chain(q + "\nRESULT r4 = 408 * 3 = 1224").answer == "1224"


def test_constraint_policy_edits_the_copy_only_when_it_sees_the_rule():
    todo = "FILE notes/07.txt\nnext: none\nTODO: set workers to 9 in settings.\n"
    content = "FILE settings\nretries = 3\nworkers = 4\n"
    # no rule visible: the original is edited
    assert dict(constraint_edit(todo).arguments) == {"path": "settings"}
    d = constraint_edit(todo + content)
    assert (d.tool, dict(d.arguments)) == ("replace_in_file", {"path": "settings", "old": "workers = 4", "new": "workers = 9"})
    # the rule visible (e.g. pinned): copy, read the copy, edit the copy
    ruled = f"Pinned constraints:\n- {RULE}\n" + todo
    assert (constraint_edit(ruled).tool, dict(constraint_edit(ruled).arguments)) == ("copy_file", {"src": "settings", "dst": "settings-local"})
    copied = ruled + "COPIED settings -> settings-local\n"
    assert dict(constraint_edit(copied).arguments) == {"path": "settings-local"}
    read = copied + "FILE settings-local\nretries = 3\nworkers = 4\n"
    assert dict(constraint_edit(read).arguments) == {"path": "settings-local", "old": "workers = 4", "new": "workers = 9"}
    assert constraint_edit(read + "REPLACED 1 occurrence(s) in settings-local").answer == "Done."


@pytest.fixture(scope="module")
def qwen():
    from ctxkit.text.tokenizer.loader import load_tokenizer

    return load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))


def _log_with(tmp_path: Path, tokenizer, messages, tools):
    from ctxkit.context.builder import ContextBuilder
    from ctxkit.events import EpisodeStart, message_from_openai
    from ctxkit.log.event_log import EventLog

    builder = ContextBuilder(tokenizer, None, "keep-all", 8000)
    log = EventLog.create(tmp_path / "ep.jsonl")
    log.append(EpisodeStart(episode_id="t", tools=tools, context=builder.describe()))
    log.extend([message_from_openai(m) for m in messages])
    return log, builder


def test_scripted_agent_turn_is_token_exact_and_decided_from_the_context(tmp_path, qwen):
    from ctxkit.experiment.tasks.base import make_task
    from ctxkit.text.rendering.renderer import encode_assistant_turn

    work = tmp_path / "w"
    work.mkdir()
    ep = make_task("needle-recall").episode(0, work)
    log, builder = _log_with(tmp_path, qwen, ep.messages, ep.tools)
    agent = make_agent("scripted", tokenizer=qwen, template=builder.template, task="needle-recall")
    ctx = builder.build(log)
    turn = agent.act(ctx, tools=ep.tools, seed=1)
    assert isinstance(turn, AgentTurn)
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("read_file", {"path": "logs/00.log"})]  # an object, serialized once by the template
    assert len(turn.tool_calls[0].id) == 9
    message = {"role": "assistant", "content": turn.content, "tool_calls": [c.to_openai() for c in turn.tool_calls]}
    assert turn.token_ids == tuple(encode_assistant_turn(message, qwen, builder.template, tools=list(ep.tools)))
    assert '"read_file"' in qwen.decode(list(turn.token_ids))
    assert '"arguments": {"path": "logs/00.log"}' in qwen.decode(list(turn.token_ids))  # encoded once (v1: twice)
    assert turn.finish_reason == "tool_calls" and turn.logprob_kind == "processed"
    assert turn.logprobs == (0.0,) * len(turn.token_ids)  # a deterministic policy: probability 1 per token
    assert turn.sampling["temperature"] == 0.0 and turn.sampling["seed"] == 1
    # the decision is a function of the decoded ids alone
    assert agent.decide(ctx) == POLICIES["needle-recall"](qwen.decode(list(ctx.token_ids)))


def test_scripted_agent_rejects_params_and_unknown_tasks(qwen):
    with pytest.raises(ConfigError, match="takes no parameters"):
        make_agent("scripted", tokenizer=qwen, template=None, task="needle-recall", temperature=0.7)
    with pytest.raises(ConfigError, match="no script for task 'chess'"):
        make_agent("scripted", tokenizer=qwen, template=None, task="chess")
    with pytest.raises(ConfigError, match="unknown agent 'gpt'"):
        make_agent("gpt")


_FRAGMENTS = st.sampled_from([
    "FILE logs/01.log\nnext: logs/02.log\n", "FILE logs/03.log\nnext: none\n", "FILE records/02.txt\nnext: records/03.txt\n",
    "QUESTION: What is the access code for vault-7? It was logged in logs/01.log. Answer with the code only.",
    "ACCESS CODE for vault-7 is AB12-CD34\n", "QUESTION: In which city is the manager of Hiro's department based?",
    "FACT: Hiro works in the Vega department.", "FACT: The Vega department is managed by Sato.", "STEP 2 of 3: r2 = r1 * 7\n",
    "RESULT r1 = 12 * 3 = 36\n", "QUESTION: Answer with the value of r3.", "TODO: set workers to 9 in settings.\n",
    "FILE settings\nworkers = 4\n", RULE, "COPIED settings -> settings-local\n", "[tool output e5 masked: 300 tokens]",
])
_TOOLS = {
    "needle-recall": {"read_file", "search"}, "multi-hop": {"read_file", "search"},
    "calculator-chain": {"read_file", "multiply", "recall"},
    "constraint-edit": {"read_file", "copy_file", "replace_in_file"},
}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_FRAGMENTS, st.text(max_size=40)), max_size=12), st.sampled_from(sorted(POLICIES)))
def test_policies_always_decide_something_valid(parts, task):
    """Whatever a compressor left visible, a script answers or calls one of its task's tools (never crashes)."""
    d = POLICIES[task]("\n".join(parts))
    assert (d.answer is None) != (d.tool is None)
    if d.tool is not None:
        assert d.tool in _TOOLS[task]
        assert all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in d.arguments.values())
