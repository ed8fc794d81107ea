"""`ctxkit view` without a browser: the page's data comes from replay, is stored once per segment, is
valid JSON whatever the messages hold, names a failing step, shows a log that cannot be read as a failed
episode, loads nothing from outside; `-o` writes it (with the umask's mode), `--serve` serves it on
127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from viewer_fixtures import (DAMAGES, SIZE_BOUND_200, break_step, damage_log, data_block, import_swe_gym, import_tau,
                             make_long_episode, make_run, make_split_log, page_data)
from ctxkit.cli.parser import main
from ctxkit.errors import LogFormatError
from ctxkit.events import Compaction, EpisodeStart, Message, Step
from ctxkit.experiment.report import summarize
from ctxkit.experiment.run_folder import read_rows
from ctxkit.log.event_log import EventLog, read_events
from ctxkit.training.context_replay import verify_log
from ctxkit.viewer import HOST, build_page, serve_page, write_page
from ctxkit.viewer.episode_data import context_segments
from ctxkit.viewer.page import embed_json

HOSTILE = ["</script>", "</SCRIPT >", "</script/", "<!--", "-->", "<script>", "<!--<script>", "<![CDATA[", "]]>",
           "\u2028", "\u2029", "&amp;", "&lt;", "<\\/", "\\u003c", "\\", '"', "\x00", "\r\n", "\r", "\ufeff", "\U0001f600"]
"""Text that breaks a naive embedding: ends or re-opens the script, HTML comments, JS line separators,
escapes that look like ours, control characters, non-BMP text."""
TEXTS = st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=20)), max_size=12).map("".join)
"""Arbitrary text (every code point but lone surrogates, which no log can hold) mixed with `HOSTILE`."""


@pytest.fixture(scope="module")
def tau_log(tmp_path_factory):
    return import_tau(tmp_path_factory.mktemp("tau"))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("viewer-run"))


def test_episode_page_is_the_replayed_context(tau_log, tmp_path):
    page = build_page([tau_log])
    data = page_data(page.html)
    (ep,) = data["episodes"]
    events = read_events(tau_log)
    steps = [e for e in events if isinstance(e, Step)]
    assert page.n_steps == len(ep["steps"]) == len(steps) == verify_log(tau_log).n_ok
    assert [e["id"] for e in ep["events"]] == [e.id for e in events]
    assert ep["budget"] is None  # offline steps record OFFLINE_BUDGET, which is no budget: the bar says so
    # every step's context, joined back from the segment pool, is the replayed context token for token
    result = verify_log(tau_log).results
    for k, (rec, r) in enumerate(zip(ep["steps"], result)):
        segs = context_segments(ep["steps"], k)
        ids = [t for sid, _ in segs for t in data["segments"][sid]["ids"]]
        assert ids == list(r.context.token_ids)
        loss = "".join(data["segments"][sid]["l"] for sid, _ in segs)
        assert loss == "".join(map(str, r.context.loss_mask))
        assert rec["context"]["hash"] == r.context.hash == rec["expected_hash"]
        assert rec["sampled"]["ids"] == list(r.step.token_ids)
    codes = {c for s in data["segments"] for c in s["c"]}
    assert {"v", "S", "g"} <= codes
    assert page.n_tokens_stored < page.n_tokens_shown
    out = write_page(page, tmp_path / "tau.html")
    assert out.read_text(encoding="utf-8") == page.html


def test_page_loads_nothing_from_outside(run_dir):
    page = build_page([run_dir])
    head, _, rest = page.html.partition('<script type="application/json" id="ctxkit-data">')
    code = head + rest.partition("</script>")[2]  # the page without its data blob
    assert "default-src 'none'" in head
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", code)
    assert "<link" not in code and "@import" not in code and "url(" not in code
    assert all(p["src"].startswith("data:image/png;base64,") for r in page_data(page.html)["runs"] for p in r["plots"])


def test_run_folder_grid_has_the_report_numbers(run_dir):
    data = page_data(build_page([run_dir]).html)
    (run,) = data["runs"]
    rows = read_rows(run_dir)
    summary = summarize(rows, baseline="window", arms=["window", "mask+pins"], n_resamples=200)
    assert run["arms"] == ["window", "mask+pins"] and run["tasks"] == ["constraint-edit", "needle-recall"]
    for arm in run["arms"]:
        assert run["per_arm"][arm]["quality"] == summary["per_arm"][arm]["quality"]
        for task in run["tasks"]:
            cell = run["cells"][f"{arm}\t{task}"]
            assert cell["quality"] == summary["per_task"][task][arm]
            assert cell["episodes"] == [f"{arm}/{task}-0"]
    assert sorted(e["label"] for e in data["episodes"]) == sorted(r["episode_id"] for r in rows)
    assert any(e["compactions"] for e in data["episodes"])


def test_a_failing_step_is_named_and_shows_no_context(tau_log, tmp_path):
    bad = break_step(tau_log, tmp_path / "bad.jsonl", 2)
    data = page_data(build_page([bad]).html)
    (ep,) = data["episodes"]
    after = verify_log(bad).results[3]  # the step after the failing one is still shown exactly
    assert [t for sid, _ in context_segments(ep["steps"], 3) for t in data["segments"][sid]["ids"]] == list(after.token_ids)
    assert [s["ok"] for s in ep["steps"]][:4] == [True, True, False, True]
    failed = ep["steps"][2]
    assert "context" not in failed and failed["problem"].startswith("step 2 (seq ")
    assert "context hash mismatch" in failed["problem"]


def test_a_log_without_a_recorded_tokenizer_says_so(tmp_path):
    log = EventLog.create(tmp_path / "plain.jsonl")
    log.extend([EpisodeStart(episode_id="x"), Message(role="user", content="hi"),
                Step(context_hash="ab" * 32, context_length=3, token_ids=(1, 2))])
    log.close()
    (ep,) = page_data(build_page([tmp_path / "plain.jsonl"]).html)["episodes"]
    assert ep["setup_error"].startswith("ReplayError: the log records no tokenizer")
    assert ep["steps"] == []


def test_long_episode_page_is_bounded(tmp_path):
    log = make_long_episode(tmp_path / "ep200.jsonl")
    events = read_events(log)
    page = build_page([log])
    assert page.n_steps == 200 and sum(isinstance(e, Compaction) for e in events) > 0
    assert page.size < SIZE_BOUND_200
    # each distinct message's tokens once: the stored tokens are the episode's, not 200 contexts' worth
    assert page.n_tokens_stored < 2 * 74_000 < page.n_tokens_shown
    print(f"\n200-step page: {page.size / 1e6:.2f} MB, {page.n_segments} segments, {page.n_tokens_stored} tokens "
          f"stored for {page.n_tokens_shown} shown")


def test_cli_writes_and_reports_size(tau_log, tmp_path, capsys):
    out = tmp_path / "v.html"
    assert main(["view", str(tau_log), "-o", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{out}: 1 episode(s), ") and line.endswith(" MB")
    assert out.stat().st_size > 0


@pytest.mark.parametrize("argv, message", [
    (["view", "{d}/missing.jsonl", "-o", "{d}/o.html"], "{d}/missing.jsonl does not exist"),
    (["view", "{log}", "-o", "{d}/o.txt"], "-o {d}/o.txt: expected an .html file name"),
    (["view", "{d}", "-o", "{d}/o.html"], "{d}: no episode logs found"),
    (["view", "{log}", "-o", "{d}/nofolder/o.html"], "-o {d}/nofolder/o.html: folder {d}/nofolder does not exist"),
])
def test_cli_errors_name_what_and_where(tau_log, tmp_path, capsys, argv, message):
    d = tmp_path / "empty"
    d.mkdir()
    args = [a.format(d=d, log=tau_log) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("ctxkit: error: " + message.format(d=d)), err


def test_serve_on_loopback(tau_log):
    page = build_page([tau_log])
    server = serve_page(page, 0, background=True)
    try:
        host, port = server.server_address[:2]
        assert host == HOST == "127.0.0.1"
        with urllib.request.urlopen(f"http://{HOST}:{port}/", timeout=10) as resp:
            assert resp.status == 200 and resp.read().decode("utf-8") == page.html
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://{HOST}:{port}/other", timeout=10)
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def test_cli_serve_is_bounded(tau_log):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ctxkit.cli.parser", "view", str(tau_log), "--serve", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once the server listens
        assert line.startswith(f"serving http://127.0.0.1:{port}/ (1 episode(s), ")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
            assert b'id="ctxkit-data"' in resp.read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _message_log(path: Path, text: str) -> Path:
    """A log of one user message holding `text` (no tokenizer recorded: the page shows its events only)."""
    log = EventLog.create(path)
    log.extend([EpisodeStart(episode_id="x"), Message(role="user", content=text)])
    log.close()
    return path


@settings(max_examples=300, deadline=None)
@given(text=TEXTS)
def test_embedded_json_is_valid_and_round_trips(text):
    data = {"text": text, "list": [text, {text: text}]}
    block = embed_json(data)
    assert not any(c in block for c in "<>&\u2028\u2029")
    assert json.loads(block) == data


@settings(max_examples=40, deadline=None)
@given(text=TEXTS)
def test_any_message_text_round_trips_through_the_page(text):
    with tempfile.TemporaryDirectory() as d:
        page = build_page([_message_log(Path(d) / "m.jsonl", text)])
    (ep,) = page_data(page.html)["episodes"]  # the block the browser cuts out, parsed as is
    assert [e.get("content") for e in ep["events"]] == [None, text]


def test_lone_surrogates_never_reach_a_page():
    with pytest.raises(orjson.JSONEncodeError):  # refused loudly, not written as a page that cannot load
        embed_json({"text": "\ud800"})


def test_swe_gym_messages_with_html_comments_round_trip(tmp_path):
    log = import_swe_gym(tmp_path)
    assert "<!--" in log.read_text(encoding="utf-8")
    html = build_page([log]).html
    assert "<!--" not in data_block(html)
    (ep,) = page_data(html)["episodes"]
    contents = [getattr(e, "content", None) for e in read_events(log)]
    assert [e.get("content") for e in ep["events"]] == contents
    assert sum("<!--" in (c or "") for c in contents) >= 1 and all(s["ok"] for s in ep["steps"])


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_log_in_a_run_folder_is_one_failed_episode(run_dir, tmp_path, capsys, how):
    run = shutil.copytree(run_dir, tmp_path / "run")
    bad = run / "episodes" / "window" / "needle-recall-0.jsonl"
    line = damage_log(bad, how)
    kind = "TornLineError" if how == "torn-last-line" else "LogFormatError"
    assert main(["view", str(run), "-o", str(tmp_path / "run.html")]) == 0
    out, err = capsys.readouterr()
    assert "4 episode(s) (1 could not be read)" in out
    assert err.startswith(f"ctxkit: warning: {kind}: {bad}:{line}: "), err
    data = page_data((tmp_path / "run.html").read_text(encoding="utf-8"))
    failed = [e for e in data["episodes"] if e["load_error"]]
    assert [e["label"] for e in failed] == ["window/needle-recall-0"] and failed[0]["events"] == []
    assert failed[0]["load_error"].startswith(f"{kind}: {bad}:{line}: ")
    assert all(e["steps"] for e in data["episodes"] if not e["load_error"])
    assert data["runs"][0]["cells"]["window\tneedle-recall"]["episodes"] == ["window/needle-recall-0"]


def test_when_no_log_can_be_read_the_command_fails(tau_log, tmp_path, capsys):
    logs = [shutil.copy(tau_log, tmp_path / f"{k}.jsonl") for k in ("a", "b")]
    lines = [damage_log(Path(p), how) for p, how in zip(logs, DAMAGES)]
    with pytest.raises(LogFormatError):
        build_page(logs)
    assert main(["view", *map(str, logs), "-o", str(tmp_path / "o.html")]) == 2
    assert f"ctxkit: error: {logs[0]}:{lines[0]}: last line is incomplete" in capsys.readouterr().err
    assert not (tmp_path / "o.html").exists()


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002, 0o027])
def test_written_page_has_the_umask_mode(tmp_path, umask):
    page = build_page([_message_log(tmp_path / "m.jsonl", "hi")])
    old = tmp_path / "old.html"
    old.write_text("x")
    old.chmod(0o600)
    prev = os.umask(umask)
    try:
        for out in (write_page(page, tmp_path / "new.html"), write_page(page, old)):
            assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask, out
        assert main(["view", str(tmp_path / "m.jsonl"), "-o", str(tmp_path / "cli.html")]) == 0
        assert stat.S_IMODE((tmp_path / "cli.html").stat().st_mode) == 0o666 & ~umask
    finally:
        os.umask(prev)
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary file left


def test_page_says_where_samples_split_and_why_turns_drift(tmp_path):
    """Mistral v0.3 moves the system prompt into the last user turn (a split: `template_rewrite`); the policy
    wrote its first answer in pieces the tokenizer would merge (a drift: `bpe_merge`)."""
    path = make_split_log(tmp_path)
    (ep,) = page_data(build_page([path]).html)["episodes"]
    assert [s["split"] for s in ep["steps"]] == [None, "template_rewrite"]
    assert ep["steps"][0]["context"]["drifts"] == []
    (drift,) = ep["steps"][1]["context"]["drifts"]
    assert drift[0] == 2 and drift[2] == "bpe_merge"  # message 2: the first answer (after system, user)
    assert "a new training sample starts here" in build_page([path]).html
