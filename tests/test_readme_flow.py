"""The README's library walk-through, run for real: log -> build -> step -> samples -> replay."""

from __future__ import annotations

import json

import ctxkit
from ctxkit.events import ToolCall

from conftest import tokenizer_dir

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def test_readme_walkthrough(tmp_path):
    tok = ctxkit.load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))
    builder = ctxkit.ContextBuilder(tok, template=None, compressor="mask-observations", budget=1200,
                                    params={"keep_last": 1}, detect_pins=True)
    log = ctxkit.EventLog.create(tmp_path / "ep-0001.jsonl")
    log.append(ctxkit.EpisodeStart(episode_id="ep-1", tools=TOOLS, context=builder.describe()))
    log.append(ctxkit.Message(role="system", content="You are a careful assistant."))
    log.append(ctxkit.Message(role="user", content="Summarize the notes. Do not modify the original file notes.txt."))
    hashes = []
    for turn in range(6):
        ctx = builder.build(log)
        hashes.append(ctx.hash)
        call = ToolCall(id=f"call{turn:05d}", name="read_file", arguments=json.dumps({"path": f"notes-{turn}.txt"}))
        msg = {"role": "assistant", "content": "", "tool_calls": [call.to_openai()]}
        ids = ctxkit.encode_assistant_turn(msg, tok, tools=TOOLS)
        log.append(ctxkit.Step(context_hash=ctx.hash, context_length=ctx.n_tokens, token_ids=ids,
                               logprobs=tuple(-0.5 for _ in ids), logprob_kind="processed",
                               sampling={"temperature": 0.7, "seed": turn}, policy_version=12,
                               finish_reason="tool_calls", content="", tool_calls=(call,)))
        log.append(ctxkit.ToolResult(tool_call_id=call.id, name="read_file",
                                     content=" ".join(f"line {turn}.{i} of the notes" for i in range(60))))
        assert ctx.n_tokens <= 1200
        assert "Do not modify the original file notes.txt." in tok.decode(list(ctx.token_ids))
    log.append(ctxkit.EpisodeEnd(outcome="truncated", cause="max_steps", reward=None, reward_kind="unscored"))
    log.close()

    compactions = [e for e in log.events() if e.kind == "compaction"]
    assert compactions, "the 1200-token budget must force at least one compaction"
    samples = ctxkit.samples(tmp_path / "ep-0001.jsonl")
    assert sum(sum(s.loss_mask) for s in samples) == sum(len(e.token_ids) for e in log.events() if e.kind == "step")
    assert all(s.reward_kind == "unscored" and s.outcome == "truncated" for s in samples)
    for k in range(6):
        assert ctxkit.replay(tmp_path / "ep-0001.jsonl", step=k).ok
