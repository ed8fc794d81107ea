"""`ctxkit view` without a browser: the page's data comes from replay, is stored once per segment, names a
failing step, loads nothing from outside; `-o` writes it, `--serve` serves it on 127.0.0.1."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from viewer_fixtures import SIZE_BOUND_200, break_step, import_tau, make_long_episode, make_run
from ctxkit.cli.parser import main
from ctxkit.events import Compaction, Step
from ctxkit.log.event_log import read_events
from ctxkit.training.context_replay import verify_log
from ctxkit.viewer import HOST, build_page, serve_page, write_page
from ctxkit.viewer.episode_data import context_segments


def page_data(html: str) -> dict:
    """The JSON blob of a page."""
    m = re.search(r'<script type="application/json" id="ctxkit-data">(.*?)</script>', html, re.S)
    assert m is not None
    return json.loads(m.group(1).replace("<\\/", "</").replace("<\\!--", "<!--"))


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
    from ctxkit.experiment.report import summarize
    from ctxkit.experiment.run_folder import read_rows

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
    from ctxkit.events import EpisodeStart, Message
    from ctxkit.log.event_log import EventLog

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
