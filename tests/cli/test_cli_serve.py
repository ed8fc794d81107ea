"""`ctxkit serve` in a real subprocess: it listens, answers OpenAI-shaped errors (its engine is down here), and on
SIGTERM (as Ctrl-C) ends its open episodes `truncated`/`gateway_shutdown` and exits 130; bad options are one error line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from conftest import tokenizer_dir
from ctxkit.events import EpisodeEnd, EpisodeStart, Message
from ctxkit.experiment.engine_server import free_port
from ctxkit.log.event_log import read_events


def _serve(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ctxkit.cli", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_engine_url_needs_a_model_name(tmp_path):
    proc = _serve("--out", str(tmp_path), "--tokenizer", str(tokenizer_dir("smollm2-135m-instruct")),
                  "--engine-url", "http://127.0.0.1:1")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == ""
    assert err == "ctxkit: error: serve: --engine-url needs --engine-model (the served model name)\n"


def test_serve_answers_and_ends_open_episodes_on_sigterm(tmp_path):
    port, dead = free_port(), free_port()
    proc = _serve("--out", str(tmp_path / "logs"), "--tokenizer", str(tokenizer_dir("smollm2-135m-instruct")),
                  "--template", "chatml-tools-v1", "--engine-url", f"http://127.0.0.1:{dead}", "--engine-model", "m",
                  "--port", str(port), "--engine-timeout", "5")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                    assert json.loads(r.read())["data"][0]["id"] == "m"
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
                time.sleep(0.2)
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, method="POST",
                                         headers={"X-Ctxkit-Episode": "cli-ep", "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=30)
            raise AssertionError("the engine is down: expected HTTP 502")
        except urllib.error.HTTPError as exc:
            assert exc.code == 502 and json.loads(exc.read())["error"]["code"] == "engine_error"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.endswith("ctxkit: interrupted\n"), err
    assert f"ctxkit serve: http://127.0.0.1:{port}/v1 -> http://127.0.0.1:{dead} (m, vllm)" in err
    events = read_events(tmp_path / "logs" / "cli-ep.jsonl")
    assert [type(e) for e in events] == [EpisodeStart, Message, EpisodeEnd]
    assert (events[-1].outcome, events[-1].cause, events[-1].reward_kind) == ("truncated", "gateway_shutdown",
                                                                             "limit_truncation")
