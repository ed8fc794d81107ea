"""`ctxkit view` pages in real headless Chromium (Debian's, through Playwright): the DOM has every step, the
provenance classes, the run grid and the arm diff; a real SWE-Gym episode whose messages hold `<!--` loads;
a log that cannot be read is shown as failed beside the others; no console errors; no request leaves
file:/data:.

Screenshots go to the test's tmp folder, and to `$CTXKIT_VIEWER_SCREENSHOTS` when set (how the ones in
docs/screenshots/ were made). The 200-step page's load time is measured and printed, not asserted.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from viewer_fixtures import (PageProbe, break_step, browser, damage_log, import_swe_gym, import_tau, make_long_episode,
                             make_run)
from ctxkit.cli.parser import main
from ctxkit.events import Message, Step
from ctxkit.log.event_log import read_events


@pytest.fixture(scope="module")
def chromium():
    pw, b = browser()
    yield b
    b.close()
    pw.stop()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("viewer-pages")
    run = make_run(tmp)
    tau = import_tau(tmp)
    swe = import_swe_gym(tmp)
    torn = tmp / "torn.jsonl"
    torn.write_bytes(tau.read_bytes())
    out = {"run": tmp / "run.html", "tau": tmp / "tau.html", "tau_log": tau, "bad": tmp / "bad.html",
           "swe": tmp / "swe.html", "swe_log": swe, "mixed": tmp / "mixed.html", "torn": torn,
           "torn_line": damage_log(torn, "torn-last-line")}
    assert main(["view", str(run), "-o", str(out["run"])]) == 0
    assert main(["view", str(tau), "-o", str(out["tau"])]) == 0
    assert main(["view", str(break_step(tau, tmp / "bad.jsonl", 1)), "-o", str(out["bad"])]) == 0
    assert main(["view", str(swe), "-o", str(out["swe"])]) == 0
    assert main(["view", str(torn), str(swe), "-o", str(out["mixed"])]) == 0
    return out


def shot(page, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / name))
    target = os.environ.get("CTXKIT_VIEWER_SCREENSHOTS")
    if target:
        page.screenshot(path=str(Path(target) / name))


def test_episode_page_of_an_imported_trajectory(chromium, pages, tmp_path):
    n_steps = sum(isinstance(e, Step) for e in read_events(pages["tau_log"]))
    probe = PageProbe(chromium)
    page = probe.open(pages["tau"])
    assert page.locator("details.step").count() == n_steps
    assert page.locator(".tokens .tok").count() == 0  # nothing rendered before a step is opened
    page.locator("details.step").nth(n_steps - 1).locator("summary").click()
    body = page.locator(".stepbody")
    body.locator(".tokens").wait_for()
    for cls in ("p-verbatim", "p-scaffold", "p-generation_prompt", "loss", "special"):
        assert body.locator(f".tokens .{cls}").count() > 0, cls
    title = body.locator(".tokens .tok").first.get_attribute("title")
    assert title.startswith("#0 · id ")
    # offline steps of an imported trajectory record no real budget: no bar, the count and a note instead
    assert body.locator(".budget").count() == 0 and "no budget recorded" in body.inner_text()
    assert body.locator(".samp .stok").count() > 0
    body.locator(".tokens").scroll_into_view_if_needed()
    shot(page, tmp_path, "episode.png")
    assert probe.errors == [] and probe.external == []
    probe.close()


def test_swe_gym_episode_with_html_comments_loads(chromium, pages):
    events = read_events(pages["swe_log"])
    comment = next(e for e in events if isinstance(e, Message) and "<!--" in e.content)
    probe = PageProbe(chromium)
    page = probe.open(pages["swe"])  # waits for the script to finish: the data block parsed
    assert "Loading" not in page.locator("#main").inner_text()
    assert page.locator("#main h2").inner_text() == str(pages["swe_log"])
    assert page.locator("details.ev").count() == len(events)
    assert page.locator("details.step").count() == sum(isinstance(e, Step) for e in events)
    page.goto(pages["swe"].resolve().as_uri() + f"#ep-0/{comment.id}")  # that message's raw event, in full
    raw = page.locator("details.ev.target pre.json")
    raw.wait_for()
    assert "<!--" in raw.inner_text() and comment.content.splitlines()[0] in raw.inner_text()
    assert probe.errors == [] and probe.external == []
    probe.close()


def test_unreadable_log_is_a_failed_episode_beside_the_others(chromium, pages):
    probe = PageProbe(chromium)
    page = probe.open(pages["mixed"])
    assert "(1 could not be read)" in page.locator("#where").inner_text()
    assert page.locator("#main h2").inner_text() == str(pages["swe_log"])  # opens at the first readable episode
    assert page.locator("details.step").count() > 0
    page.locator("#nav a.failed-ep").click()
    banner = page.locator("#main .failed-episode .replay-failed")
    banner.wait_for()
    assert banner.inner_text().startswith(f"this log could not be read: TornLineError: {pages['torn']}:{pages['torn_line']}: ")
    assert page.locator("details.ev").count() == 0
    assert probe.errors == [] and probe.external == []
    probe.close()


def test_failing_step_is_said_at_that_step(chromium, pages):
    probe = PageProbe(chromium)
    page = probe.open(pages["bad"])
    page.locator("details.step").nth(1).locator("summary").click()
    banner = page.locator(".stepbody .replay-failed")
    banner.wait_for()
    assert banner.inner_text().startswith("replay failed at step 1: step 1 (seq ")
    assert page.locator(".stepbody .tokens").count() == 0
    assert probe.errors == [] and probe.external == []
    probe.close()


def test_run_grid_compaction_and_arm_diff(chromium, pages, tmp_path):
    probe = PageProbe(chromium, height=1000)
    page = probe.open(pages["run"])
    grid = page.locator("table.run-grid")
    assert grid.locator("td.cell").count() == 4
    assert page.locator("img.plot").count() == 2
    assert page.evaluate("[...document.querySelectorAll('img.plot')].every(i => i.complete && i.naturalWidth > 0)")
    shot(page, tmp_path, "run-grid.png")
    # a cell links to its episode; a compaction there opens before/after side by side
    page.locator("a.cell-ep", has_text="needle-recall-0").last.click()
    page.wait_for_selector("details.step")
    comp = page.locator("details.compaction")
    assert comp.count() > 0
    comp.first.locator("summary").click()
    page.wait_for_selector(".compaction-cols .before .vmsg")
    assert page.locator(".compaction-cols .before [class*=' x-']").count() > 0
    assert page.locator(".compaction-cols .after .vmsg").count() > 0
    comp.first.scroll_into_view_if_needed()
    shot(page, tmp_path, "compaction.png")
    # a placeholder's event link opens the raw event in full
    link = page.locator(".compaction-cols .after a.evlink").nth(3)
    target = link.get_attribute("data-ev")
    link.click()
    raw = page.locator(f"details.ev.target pre.json")
    raw.wait_for()
    assert f'"id": "{target}"' in raw.inner_text()
    # arm diff: same task, seed and step under both arms
    page.goto(pages["run"].resolve().as_uri() + "#diff-0")
    page.wait_for_selector(".diffcol .tokens")
    page.select_option("#dK", "needle-recall-0")
    last = page.locator("#dS option").count() - 1
    assert last > 0
    page.select_option("#dS", str(last))
    page.wait_for_selector(".diffcol .tokens")
    assert page.locator(".diffcol").count() == 2
    assert page.locator(".diffcol .budget").count() == 2  # the ablation's real budget: one bar per side
    assert page.locator(".diffcol .diff-only").count() > 0
    shot(page, tmp_path, "arm-diff.png")
    assert probe.errors == [] and probe.external == []
    probe.close()


def test_long_episode_loads(chromium, tmp_path):
    log = make_long_episode(tmp_path / "ep200.jsonl")
    html = tmp_path / "ep200.html"
    assert main(["view", str(log), "-o", str(html)]) == 0
    probe = PageProbe(chromium)
    t0 = time.perf_counter()
    page = probe.open(html)
    load_s = time.perf_counter() - t0
    assert page.locator("details.step").count() == 200
    t1 = time.perf_counter()
    page.locator("details.step").nth(199).locator("summary").click()
    page.wait_for_selector(".stepbody .tokens .tok")
    open_s = time.perf_counter() - t1
    assert page.locator(".stepbody .tokens .p-masked").count() > 0
    print(f"\n200-step page {html.stat().st_size / 1e6:.2f} MB: load {load_s:.2f} s (script {page.evaluate('window.ctxkitReadyMs'):.0f} ms), "
          f"last step opened in {open_s:.2f} s")
    assert probe.errors == [] and probe.external == []
    probe.close()


def test_split_and_drifts_are_said_at_the_step(chromium, tmp_path):
    from viewer_fixtures import make_split_log

    out = tmp_path / "split.html"
    assert main(["view", str(make_split_log(tmp_path)), "-o", str(out)]) == 0
    probe = PageProbe(chromium)
    page = probe.open(out)
    page.locator("details.step").nth(1).locator("summary").click()
    banner = page.locator(".stepbody .split")
    banner.wait_for()
    assert banner.inner_text() == "a new training sample starts here: template_rewrite"
    assert page.locator(".stepbody .drifts").inner_text() == "drifts: message 2 at token 10 (bpe_merge)"
    assert probe.errors == [] and probe.external == []
    probe.close()
