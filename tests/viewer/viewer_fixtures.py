"""Inputs for the viewer tests: a small ablation run folder (scripted agents), imported real trajectories
(tau-bench; a SWE-Gym episode whose messages hold `<!--`), the 200-step synthetic episode as a real log
with compactions, a log whose replay fails at one step, damaged logs, the page's data block read the way
the browser reads it, and headless Chromium through Playwright (Debian's /usr/bin/chromium; never a
browser download)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from conftest import missing_fixture, shared_path, tokenizer_dir
from ctxkit.cli.parser import main

CHROMIUM = os.environ.get("CTXKIT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
SIZE_BOUND_200 = 4_000_000
"""Bound on the 200-step (~70k-token) episode's page, bytes (measured 2.9 to 3.0 MB)."""
SWE_GYM = "adp__swe-gym_openhands_sampled_trajectories__sample_raw.json"
"""The Agent Data Protocol SWE-Gym sample; its episode 0 has `<!--` in six messages."""
DATA_OPEN = '<script type="application/json" id="ctxkit-data">'
DAMAGES = ("torn-last-line", "non-json-line", "edited-line", "lone-surrogate")
"""Ways `damage_log` breaks a log: a crash mid-append, a line that is not JSON, a line edited after it was
written (its hash no longer matches: the chain is broken), a `\\ud800` escape (no valid UTF-8 text)."""


def data_block(html: str) -> str:
    """The text of the page's data <script>, cut where the browser's HTML parser cuts it: at the first
    `</script` after the opening tag (exact only when the block holds no `<` at all, which is asserted:
    with one, `<!--` and `<script` could move the end)."""
    start = html.index(DATA_OPEN) + len(DATA_OPEN)
    end = re.compile("</script", re.I).search(html, start)
    assert end is not None
    block = html[start:end.start()]
    assert "<" not in block, "a '<' in the data block: the HTML parser may end it elsewhere"
    return block


def page_data(html: str) -> dict:
    """The page's data, parsed exactly as the page's `JSON.parse(textContent)` does (nothing undone first)."""
    return json.loads(data_block(html))


def run_toml() -> str:
    """Two arms (window; mask-then-window with pins) x two tasks x one seed, scripted agents: a few seconds."""
    return f"""
name = "viewer"
tokenizer = "{tokenizer_dir('qwen2.5-instruct')}"
seeds = [0]
budget = 900
baseline = "window"
[limits]
max_steps = 20
max_context = 900
wall_time_s = 120.0
[agents.scripted]
[tasks.constraint-edit]
n_files = 4
lines_per_file = 8
[tasks.needle-recall]
n_files = 4
lines_per_file = 8
[[arms]]
name = "window"
compressor = "window"
params = {{ keep_first = 1 }}
pins = false
[[arms]]
name = "mask+pins"
compressor = "mask-then-window"
[report]
bootstrap_resamples = 200
"""


def make_run(tmp: Path) -> Path:
    """A run folder written by `ctxkit ablate` (report and plots included)."""
    cfg = tmp / "viewer.toml"
    cfg.write_text(run_toml())
    out = tmp / "run"
    assert main(["ablate", str(cfg), "--out", str(out), "--no-progress"]) == 0
    return out


def import_tau(tmp: Path) -> Path:
    """The first tau-bench airline episode imported with `ctxkit import` (offline steps, Qwen2.5)."""
    out = tmp / "tau.jsonl"
    assert main(["import", str(shared_path("trajectories", "tau-bench__gpt-4o-airline.json")), "--select", "0",
                 "--tools", str(shared_path("trajectories", "tau-bench__airline_tools.json")),
                 "--tokenizer", str(tokenizer_dir("qwen2.5-instruct")), "-o", str(out)]) == 0
    return out


def import_swe_gym(tmp: Path, index: int = 0) -> Path:
    """SWE-Gym episode `index` imported with `ctxkit import --tokenizer` (offline steps, Qwen2.5)."""
    out = tmp / f"swe-gym-{index}.jsonl"
    assert main(["import", str(shared_path("trajectories", SWE_GYM)), "--select", str(index),
                 "--tokenizer", str(tokenizer_dir("qwen2.5-instruct")), "-o", str(out)]) == 0
    return out


def damage_log(path: Path, how: str) -> int:
    """Break the log at `path` in place (`how`: one of `DAMAGES`); the 1-based line the reader names."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    k = next(i for i, line in enumerate(lines) if '"content":"' in line)  # the first event with text
    if how == "torn-last-line":
        lines[-1] = lines[-1][: len(lines[-1]) // 2]
        k = len(lines) - 1
    elif how == "non-json-line":
        lines[k] = "{not json\n"
    elif how == "edited-line":
        rec = json.loads(lines[k])
        rec["content"] += " (edited)"
        lines[k] = json.dumps(rec, ensure_ascii=False) + "\n"
    elif how == "lone-surrogate":
        lines[k] = lines[k].replace('"content":"', '"content":"\\ud800', 1)
    else:
        raise ValueError(f"damage {how!r}: expected one of {DAMAGES}")
    path.write_text("".join(lines), encoding="utf-8")
    return k + 1


def make_long_episode(path: Path, *, turns: int = 200, compressor: str = "mask-then-window", budget: int = 16_000) -> Path:
    """The synthetic benchmark episode (`ctxkit.benchmarks`, ~70k Qwen2.5 tokens at 200 turns) driven through
    a real `ContextBuilder`: every step records the hash of the context built for it, compactions included."""
    from ctxkit.benchmarks.workload import synthetic_workload
    from ctxkit.context.builder import ContextBuilder
    from ctxkit.events import EpisodeEnd
    from ctxkit.log.event_log import EventLog
    from ctxkit.text.template.chat_template import load_template
    from ctxkit.text.tokenizer.loader import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir("qwen2.5-instruct")))
    wl = synthetic_workload(turns, tok, load_template(None, tok))
    builder = ContextBuilder(tok, compressor=compressor, budget=budget)
    log = EventLog.create(path, durability="none")
    head = list(wl.head)
    head[0] = dataclasses.replace(head[0], context=builder.describe(), sampler={"temperature": 0.7, "seed": 0})
    log.extend(head)
    for turn in wl.turns:
        ctx = builder.build(log)
        n = len(turn[0].token_ids)
        step = dataclasses.replace(turn[0], context_hash=ctx.hash, context_length=ctx.n_tokens,
                                   logprobs=tuple(-0.05 * (i % 40) for i in range(n)), logprob_kind="processed",
                                   sampling={"temperature": 0.7, "top_p": 0.95, "seed": 0},
                                   timings={"build": 0.002, "prefill": 0.05, "decode": 0.2}, finish_reason="tool_calls")
        log.extend([step, *turn[1:]])
    log.append(EpisodeEnd(outcome="truncated", cause="max_steps"))
    log.close()
    return path


def break_step(src: Path, dst: Path, index: int) -> Path:
    """A copy of the log at `src` whose step `index` records a wrong context hash (its replay fails)."""
    from ctxkit.events import Step
    from ctxkit.log.event_log import EventLog, read_events, read_header

    events, k = [], 0
    for e in read_events(src):
        e = dataclasses.replace(e, seq=None, id=None, ts=None)
        if isinstance(e, Step):
            if k == index:
                e = dataclasses.replace(e, context_hash="0" * 64)
            k += 1
        events.append(e)
    log = EventLog.create(dst, episode_id=read_header(src).get("episode_id"))
    log.extend(events)
    log.close()
    return dst


def browser() -> Any:
    """`(playwright, browser)`: headless Debian Chromium, or skip (fail under CTXKIT_REQUIRE_FIXTURES=1)."""
    if not Path(CHROMIUM).exists():
        missing_fixture(f"{CHROMIUM} (Debian's chromium; test.sh installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing_fixture("python package 'playwright' is not installed (pip install -e '.[test]')")
    pw = sync_playwright().start()
    return pw, pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


class PageProbe:
    """A Playwright page that records console errors, page errors and every request that is not file/data."""

    def __init__(self, browser: Any, width: int = 1360, height: int = 900):
        self.page = browser.new_page(viewport={"width": width, "height": height})
        self.errors: list[str] = []
        self.external: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.route("**/*", self._route)

    def _route(self, route: Any) -> None:
        url = route.request.url
        if url.startswith(("file:", "data:")):
            route.continue_()
        else:
            self.external.append(url)
            route.abort()

    def open(self, path: Path, fragment: str = "") -> Any:
        """Load the page from disk and wait for its first render."""
        self.page.goto(path.resolve().as_uri() + fragment)
        self.page.wait_for_selector("body[data-ready='1']", timeout=30_000)
        return self.page

    def close(self) -> None:
        """Close the page."""
        self.page.close()


def make_split_log(tmp: Path) -> Path:
    """A Mistral v0.3 episode of two steps: the second context moves the system prompt into the new user turn
    (its sample splits: `template_rewrite`), the first answer was sampled as "▁Fo" + "ur" (a `bpe_merge` drift)."""
    from ctxkit.context.builder import ContextBuilder
    from ctxkit.events import EpisodeEnd, EpisodeStart, Message, Step
    from ctxkit.log.event_log import EventLog

    builder = ContextBuilder(str(tokenizer_dir("mistral-7b-instruct-v0.3")), budget=4096)
    tok = builder.tokenizer
    path = tmp / "mis.jsonl"
    log = EventLog.create(path, episode_id="ep-m")
    log.extend([EpisodeStart(episode_id="ep-m", context=builder.describe(), sampler={"seed": 1}),
                Message(role="system", content="Be brief."), Message(role="user", content="What is 2+2?")])
    # "▁Fo" + "ur" (no word boundary) where the tokenizer writes "▁Four"
    answers = [tok.encode(" Fo") + [tok.backend.token_to_id("ur"), 29491, 2], tok.encode(" Six.</s>")]  # 29491 ".", 2 "</s>"
    assert tok.decode(answers[0]) == "Four.</s>" and answers[0][:2] != tok.encode(" Four")[:2]
    for i, ids in enumerate(answers):
        ctx = builder.build(log)
        log.append(Step(context_hash=ctx.hash, context_length=ctx.n_tokens, token_ids=tuple(ids),
                        content=tok.decode(ids[:-1]).strip(), logprobs=tuple([-0.25] * len(ids)),
                        logprob_kind="processed", sampling={"temperature": 0.6}, policy_version=3))
        if i == 0:
            log.append(Message(role="user", content="What is 3+3?"))
    log.append(EpisodeEnd(outcome="terminated", cause="answered", reward=1.0, reward_kind="scored"))
    log.close()
    return path
