"""CLI: ctxkit render / inspect / template check / bench render, through cli.main and a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, require_module, shared_path, tokenizer_dir
from ctxkit.cli.parser import main

EXAMPLE = REPO_ROOT / "examples" / "agent_episode.json"


def _env(**extra):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="120")
    env.update(extra)
    return env


def test_render_json_matches_apply_chat_template(capsys):
    qwen = str(tokenizer_dir("qwen2.5-instruct"))
    assert main(["render", str(EXAMPLE), "--tokenizer", qwen]) == 0
    out = json.loads(capsys.readouterr().out)
    from transformers import AutoTokenizer

    conv = json.loads(EXAMPLE.read_text())
    hf = AutoTokenizer.from_pretrained(qwen)
    assert out["token_ids"] == hf.apply_chat_template(conv["messages"], tools=conv["tools"], tokenize=True, return_dict=False)
    assert len(out["loss_mask"]) == len(out["roles"]) == len(out["token_ids"])
    assert {"hash", "template_id", "tokenizer_id", "drifts", "spans", "prefix_preserving"} <= set(out)
    assert [s["role"] for s in out["spans"]] == [m["role"] for m in conv["messages"]]
    assert out["drifts"] == [] and out["prefix_preserving"] is True
    # the constraint the user gave is tokens of the user message, never loss-masked
    user = out["spans"][1]
    assert set(out["roles"][user["start"] : user["end"]]) == {"user"}
    assert not any(out["loss_mask"][user["start"] : user["end"]])
    # generation prompt at the end
    assert main(["render", str(EXAMPLE), "--tokenizer", qwen, "--add-generation-prompt"]) == 0
    gen = json.loads(capsys.readouterr().out)
    assert gen["token_ids"][-3:] == [151644, 77091, 198] and gen["roles"][-1] == "generation_prompt"


def test_render_event_log(tmp_path, capsys):
    log = tmp_path / "ep.jsonl"
    assert main(["import", str(EXAMPLE), "-o", str(log)]) == 0
    capsys.readouterr()
    qwen = str(tokenizer_dir("qwen2.5-instruct"))
    assert main(["render", str(log), "--tokenizer", qwen]) == 0
    out = json.loads(capsys.readouterr().out)
    from ctxkit.log.event_log import EventLog, export_conversation, export_messages
    from transformers import AutoTokenizer

    messages = export_messages(EventLog.open(log))
    tools = export_conversation(EventLog.open(log))["tools"]  # as the log holds them
    hf = AutoTokenizer.from_pretrained(qwen)
    assert out["token_ids"] == hf.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False)


def test_render_errors_are_typed(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "narrator", "content": "y"}]}))
    assert main(["render", str(bad), "--tokenizer", "tiktoken:cl100k_base", "--template", "chatml-tools-v1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ctxkit: error: {bad}: messages[1]: unknown role 'narrator'") and err.count("\n") == 1
    broken = tmp_path / "broken.json"
    broken.write_text('{"messages": [\n  {"role": "user",, }\n]}')
    assert main(["render", str(broken), "--tokenizer", "tiktoken:cl100k_base", "--template", "chatml-tools-v1"]) == 2
    assert "broken.json:2" in capsys.readouterr().err
    assert main(["render", str(EXAMPLE), "--tokenizer", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_inspect_default_example_subprocess():
    shared_path("tokenizers", "qwen2.5-instruct")
    proc = subprocess.run([sys.executable, "-m", "ctxkit.cli.parser", "inspect"], capture_output=True, text=True,
                          env=_env(CTXKIT_SHARED=str(shared_path())), timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    flat = " ".join(out.split())  # rich wraps long lines at spaces
    assert "<|im_start|>" in out and "Do not modify the original file data/sales.csv." in flat
    assert "qwen2.5-instruct@sha256:" in out and "loss-masked" in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") >= 4}
    assert {"system", "user", "assistant", "tool", "scaffold", "generation_prompt", "total"} <= set(rows)
    asst = [c.strip() for c in rows["assistant"].split("│")[1:4]]
    assert asst[1] == asst[2] != "0"  # every assistant token is loss-masked


def test_inspect_falls_back_to_tiktoken(tmp_path, tiktoken_dir):
    proc = subprocess.run([sys.executable, "-m", "ctxkit.cli.parser", "inspect", "--max-tokens", "40"],
                          capture_output=True, text=True, timeout=300,
                          env=_env(CTXKIT_SHARED=str(tmp_path), CTXKIT_TIKTOKEN_DIR=str(tiktoken_dir)))
    assert proc.returncode == 0, proc.stderr
    assert "o200k_base+chatml@sha256:" in proc.stdout and "chatml-tools-v1@sha256:" in proc.stdout
    assert "more tokens" in proc.stdout


def test_template_check_json(capsys):
    assert main(["template", "check", "--tokenizer", str(tokenizer_dir("qwen3")), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["prefix_preserving"] is False and report["supports_tools"] is True
    assert report["end_of_turn"] == "<|im_end|>"
    assert main(["template", "check", "--tokenizer", "tiktoken:o200k_base", "--template", "chatml-tools-v1"]) == 0
    assert "prefix_preserving" in capsys.readouterr().out
    assert main(["template", "list"]) == 0
    assert "chatml-tools-v1" in capsys.readouterr().out


def test_bench_render_small_run_reports_identical_ids(capsys):
    qwen = str(tokenizer_dir("qwen2.5-instruct"))
    assert main(["bench", "render", "--turns", "4", "--repeats", "1", "--tokenizer", qwen, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ids_identical"] is True and out["turns"] == 4 and out["final_tokens"] > 1000
    assert main(["bench", "render", "--turns", "0"]) == 2


@pytest.mark.parametrize("argv", [["render"], ["inspect"], ["template", "check"], ["template", "list"],
                                  ["bench", "render"], ["bench", "build"]])
def test_help_everywhere(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    assert "usage: ctxkit" in capsys.readouterr().out


def test_render_log_keeps_sampled_step_ids(tmp_path, capsys):
    """A Step's sampled ids are rendered verbatim from a log, and a re-split word shows up as a drift."""
    from ctxkit.events import EpisodeStart, Message, Step
    from ctxkit.log.event_log import EventLog
    from ctxkit.text.tokenizer.loader import load_tokenizer

    qwen = str(tokenizer_dir("qwen2.5-instruct"))
    tok = load_tokenizer(qwen)
    odd = tok.encode("Hel") + tok.encode("lo") + tok.encode(" world") + [151645]
    path = tmp_path / "steps.jsonl"
    with EventLog.create(path) as log:
        log.append(EpisodeStart())
        log.append(Message(role="user", content="Say hello"))
        log.append(Step(token_ids=tuple(odd), content="Hello world", finish_reason="stop"))
    assert main(["render", str(path), "--tokenizer", qwen]) == 0
    out = json.loads(capsys.readouterr().out)
    span = out["spans"][-1]
    assert span["role"] == "assistant" and out["token_ids"][span["start"] : span["end"]] == odd
    assert out["drifts"] == [{"message_index": 1, "position": span["start"], "sampled_ids": odd[:2],
                              "rendered_ids": [9707], "reason": "bpe_merge"}]


def _thinking_log(tmp_path):
    """A Qwen3 log whose sampled turn holds reasoning the template drops once a new user turn follows."""
    from ctxkit.context.builder import ContextBuilder
    from ctxkit.events import EpisodeStart, Message, Step
    from ctxkit.log.event_log import EventLog

    builder = ContextBuilder(str(tokenizer_dir("qwen3")), budget=4096)
    log = EventLog.create(tmp_path / "think.jsonl", episode_id="ep-t")
    log.extend([EpisodeStart(episode_id="ep-t", context=builder.describe(), sampler={"seed": 1}),
                Message(role="user", content="Is 17 prime?")])
    ctx = builder.build(log)
    ids = builder.tokenizer.encode("<think>\n17 has no divisors.\n</think>\n\nYes.<|im_end|>")
    log.append(Step(context_hash=ctx.hash, context_length=ctx.n_tokens, token_ids=tuple(ids), content="Yes.",
                    reasoning_content="17 has no divisors.", logprobs=tuple([-0.5] * len(ids)),
                    logprob_kind="processed", sampling={"temperature": 1.0}, policy_version=1))
    log.append(Message(role="user", content="And 21?"))
    log.close()
    return tmp_path / "think.jsonl"


def test_render_and_inspect_show_drift_reasons(tmp_path, capsys):
    log = _thinking_log(tmp_path)
    qwen3 = str(tokenizer_dir("qwen3"))
    assert main(["render", str(log), "--tokenizer", qwen3]) == 0
    (drift,) = json.loads(capsys.readouterr().out)["drifts"]
    assert (drift["message_index"], drift["reason"], drift["rendered_ids"]) == (1, "thinking_stripped", [])
    assert main(["inspect", str(log), "--tokenizer", qwen3]) == 0
    out = capsys.readouterr().out
    assert "drifts 1 (thinking_stripped 1)" in out
    assert "drift message 1 at token 14: thinking_stripped  sampled '<think>\\n17 has no divisors.\\n</think>\\n\\n' " \
           "-> rendered ''" in out


def test_render_through_a_vendor_renderer(capsys):
    require_module("openai_harmony")
    assert main(["render", str(EXAMPLE), "--template", "vendor:harmony"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["template_id"].startswith("vendor:harmony/openai-harmony-")
    assert out["tokenizer_id"].startswith("openai-harmony:o200k_harmony@sha256:")
    assert len(out["token_ids"]) == 583 and sum(out["loss_mask"]) == 224
    assert main(["inspect", str(EXAMPLE), "--template", "vendor:harmony"]) == 2
    assert "needs --tokenizer" in capsys.readouterr().err


def test_render_history_and_template_kwargs(tmp_path, capsys):
    """`--history template` renders the past sampled turn as Qwen3's template does (no drift: ids equal
    apply_chat_template); `--template-kwarg` passes a template variable under a distinct template id."""
    from transformers import AutoTokenizer

    log = _thinking_log(tmp_path)
    qwen3 = str(tokenizer_dir("qwen3"))
    hf = AutoTokenizer.from_pretrained(qwen3)
    messages = [{"role": "user", "content": "Is 17 prime?"},
                {"role": "assistant", "content": "Yes.", "reasoning_content": "17 has no divisors."},
                {"role": "user", "content": "And 21?"}]
    assert main(["render", str(log), "--tokenizer", qwen3, "--history", "template"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["drifts"] == []
    assert out["token_ids"] == hf.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert main(["render", str(log), "--tokenizer", qwen3, "--history", "template", "--add-generation-prompt",
                 "--template-kwarg", "enable_thinking=false"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["template_id"].startswith("tokenizer+enable_thinking=false@sha256:")
    assert out["token_ids"] == hf.apply_chat_template(messages, tokenize=True, return_dict=False,
                                                      add_generation_prompt=True, enable_thinking=False)
    for bad, message in ((["--template-kwarg", "enable_thinking"], "expected KEY=VALUE"),
                         (["--template-kwarg", "a=1", "--template-kwarg", "a=2"], "given more than once"),
                         (["--template", "vendor:harmony", "--history", "template"], "chat templates only")):
        assert main(["render", str(log), "--tokenizer", qwen3, *bad]) == 2
        assert message in capsys.readouterr().err


def test_history_choices_are_the_render_modes():
    from ctxkit.cli.commands.render_cmd import HISTORY_CHOICES
    from ctxkit.text.rendering.output import HISTORY_MODES

    assert HISTORY_CHOICES == HISTORY_MODES
