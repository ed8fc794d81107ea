"""Report: exact aggregates from constructed rows, CIs against the baseline, `ctxkit report` re-renders."""

from __future__ import annotations

import json

import pytest

from ctxkit.cli.parser import main
from ctxkit.experiment.report import render_markdown, summarize, write_report


def _row(arm, task, seed, *, quality, tokens, wall, cause="answered", outcome="terminated", tool_calls=4, gen=10):
    return {
        "arm": arm, "task": task, "seed": seed, "episode_id": f"{arm}/{task}-{seed}", "agent": "scripted",
        "compressor": {"name": f"{arm}-v1", "params": {"keep_first": 1, "trigger": "over_budget"}},
        "budget": 1000, "pins_detection": arm != "b", "outcome": outcome, "cause": cause,
        "completed": cause in ("answered", "constraint_violated"), "discarded": cause == "context_budget",
        "timed_out": cause == "wall_time", "quality": quality, "violations": int(cause == "constraint_violated"),
        "steps": 5, "tool_calls": tool_calls, "repeated_tool_calls": 1, "prompt_tokens_total": tokens,
        "peak_context": tokens // 5, "compression_ratio": 1.5, "prefix_reuse": 0.5, "generated_tokens": gen,
        "loss_tokens": 0 if cause == "context_budget" else gen,
        "timing": {"wall_s": wall, "build_s": wall * 0.5, "generate_s": wall * 0.2, "prefill_s": wall * 0.1,
                   "decode_s": wall * 0.1, "tool_s": wall * 0.1, "other_s": wall * 0.2, "tool_waits": [0.1, 0.2]},
    }


ROWS = [
    _row("a", "t", 0, quality=1.0, tokens=1000, wall=1.0),
    _row("a", "t", 1, quality=1.0, tokens=2000, wall=2.0),
    _row("a", "u", 0, quality=0.0, tokens=3000, wall=3.0, cause="context_budget", outcome="truncated"),
    _row("b", "t", 0, quality=0.0, tokens=600, wall=1.0, cause="constraint_violated"),
    _row("b", "t", 1, quality=1.0, tokens=1600, wall=2.0),
    _row("b", "u", 0, quality=1.0, tokens=2600, wall=3.0),
]


def test_summary_aggregates_exactly():
    s = summarize(ROWS, baseline="a", n_resamples=500, seed=1)
    assert s["arms"] == ["a", "b"] and s["baseline"] == "a" and s["n_episodes"] == 6
    a, b = s["per_arm"]["a"], s["per_arm"]["b"]
    assert a["completion"] == pytest.approx(2 / 3) and a["quality"] == pytest.approx(2 / 3) and a["truncated"] == pytest.approx(1 / 3)
    assert a["causes"] == {"terminated/answered": 2, "truncated/context_budget": 1}
    assert b["violations"] == 1 and b["completion"] == 1.0
    assert a["prompt_tokens_total"] == {"p50": 2000.0, "p90": 2800.0, "p99": 2980.0}
    t = a["time"]
    assert t["wall_s"] == 6.0 and t["build_s"] == 3.0 and t["tool_s"] == pytest.approx(0.6)
    assert t["generated_tok_per_s"] == pytest.approx(30 / 1.2)
    assert t["loss_tok_per_s"] == pytest.approx(20 / 6.0)
    assert t["discard_rate"] == pytest.approx(1 / 3) and t["timeout_rate"] == 0.0
    assert t["tool_wait"]["p50"] == pytest.approx(0.15)
    # stages build 3.0, generate 1.2, tool 0.6 overlap; other 1.2 does not
    assert t["serial_s"] == pytest.approx(6.0) and t["bound_s"] == pytest.approx(4.2) and t["bottleneck"] == "build"
    # b minus a, paired by (task, seed): tokens -400 on every pair -> a degenerate interval
    d = s["diffs"]["b"]
    assert d["prompt tokens"].mean_diff == -400 and d["prompt tokens"].low == -400 and d["prompt tokens"].high == -400
    assert d["quality"].mean_diff == pytest.approx(0.0) and d["quality"].n_pairs == 3
    assert d["violations"].mean_diff == pytest.approx(1 / 3)
    assert s["per_task"] == {"t": {"a": 1.0, "b": 0.5}, "u": {"a": 0.0, "b": 1.0}}
    t_ci, u_ci = s["per_task_diffs"]["t"]["b"], s["per_task_diffs"]["u"]["b"]
    assert (t_ci.n_pairs, t_ci.mean_diff, t_ci.low, t_ci.high) == (2, -0.5, -1.0, 0.0)
    assert (u_ci.n_pairs, u_ci.mean_diff, u_ci.low, u_ci.high) == (1, 1.0, 1.0, 1.0) and u_ci.excludes_zero()


def test_markdown_tables():
    s = summarize(ROWS, baseline="a", n_resamples=200)
    text = render_markdown(s, title="T", run_dir="runs/x")
    assert text.startswith("# T\n")
    diff_row = next(line for line in text.splitlines() if line.startswith("| b | 0 ["))  # quality column first
    cells = [c.strip() for c in diff_row.strip("|").split("|")]
    assert cells[4] == "-400 [-400, -400] *"  # prompt tokens: excludes zero
    assert not cells[1].endswith("*")  # quality: 0 difference
    assert "| a | terminated/answered: 2, truncated/context_budget: 1 |" in text
    assert "| u | 0 | 1 |\n| vs baseline | (baseline) | 1 [1, 1] * |" in text
    assert "ctxkit replay --verify runs/x/episodes/<arm>/<task>-<seed>.jsonl" in text
    assert "ctxkit audit runs/x" in text


def test_cli_report_rerenders_from_results(tmp_path, capsys):
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "run.json").write_text(json.dumps({"experiment": {"name": "demo", "baseline": "b", "arms": [{"name": "b"}, {"name": "a"}],
                                                                  "report": {"bootstrap_resamples": 300, "bootstrap_seed": 2}}}))
    assert main(["report", str(tmp_path)]) == 0
    first = (tmp_path / "report.md").read_text()
    assert first.startswith("# ctxkit ablation: demo") and "baseline `b`" in first and "300 resamples" in first
    assert first.index("| b |") < first.index("| a |")
    (tmp_path / "report.md").unlink()
    (tmp_path / "quality_vs_tokens.png").unlink()
    assert main(["report", str(tmp_path), "--print"]) == 0
    assert (tmp_path / "report.md").read_text() == first
    assert (tmp_path / "quality_vs_tokens.png").read_bytes()[:4] == b"\x89PNG"
    assert "# ctxkit ablation: demo" in capsys.readouterr().out


def test_report_of_an_empty_run_is_an_error(tmp_path):
    from ctxkit.errors import ConfigError

    with pytest.raises(ConfigError, match="no results rows"):
        write_report(tmp_path)
    (tmp_path / "results.jsonl").write_text(json.dumps(ROWS[0]) + "\n" + '{"arm": "a", "tor')  # torn last line
    with pytest.raises(ConfigError, match=r"results.jsonl:2: line cut mid-way"):
        write_report(tmp_path)
    assert not (tmp_path / "report.md").exists()


def _tables(text: str) -> list[list[list[str]]]:
    """Every markdown table of `text` as rows of cells (GitHub's rules: a header row, then a delimiter row)."""
    tables, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif block:
            tables.append(block)
            block = []
    return tables


def test_every_table_renders_on_github_with_units_in_the_column_names():
    text = render_markdown(summarize(ROWS, baseline="a", n_resamples=200), title="T")
    tables = _tables(text)
    assert len(tables) == 5
    for table in tables:
        header, delimiter, *rows = table
        assert all(cell == "---" for cell in delimiter) and len(delimiter) == len(header), header
        assert rows and all(len(r) == len(header) for r in rows), header
    time_table = next(t for t in tables if t[0][1] == "build s")
    assert time_table[0] == ["arm", "build s", "generate s (prefill / decode)", "tool s", "other s", "generated tok/s",
                             "loss tok/s", "tool wait s (mean)", "tool wait s p50/p90/p99", "timed out (fraction)",
                             "discarded (fraction)", "serial s", "bound s (bottleneck)", "speedup (ratio)", "wall s (mean)",
                             "wall s p50/p90/p99"]
    assert time_table[2] == ["a", "3", "1.2 (0.6 / 0.6)", "0.6", "1.2", "25", "3", "0.15", "0.15 / 0.2 / 0.2", "0",
                             "0.333", "6", "4.2 (build)", "1.43x", "2", "2 / 2.8 / 2.98"]
    arms_table = tables[0]
    assert arms_table[0][4:9] == ["episodes (count)", "completion (fraction)", "quality (0-1)", "violations (count)",
                                  "truncated (fraction)"]
    assert tables[2][0] == ["arm", "quality (0-1)", "completion (fraction)", "violations (count)", "prompt tokens (count)",
                            "tool calls (count)", "wall s"]


def test_markdown_table_refuses_a_row_of_another_width():
    from ctxkit.experiment.report import markdown_table

    assert markdown_table(["a", "b"], [["1", "x|y"]]) == ["| a | b |", "|---|---|", "| 1 | x\\|y |"]
    with pytest.raises(ValueError, match="row has 3 cells, the header 2"):
        markdown_table(["a", "b"], [["1", "2", "3"]])


def test_latency_plot_shows_every_stage_on_a_log_scale():
    pytest.importorskip("matplotlib")
    from ctxkit.experiment.report import STAGES, latency_figure, stage_seconds

    s = summarize(ROWS, baseline="a", n_resamples=50)
    seconds = stage_seconds(s)
    # arm a: 3 episodes, wall 6 s: build 3, prefill 0.6, decode 0.6, generate 1.2 (nothing unsplit), tool 0.6, other 1.2
    assert seconds["a"] == pytest.approx({"build_s": 1.0, "prefill_s": 0.2, "decode_s": 0.2, "generate_rest_s": 0.0,
                                          "tool_s": 0.2, "other_s": 0.4})
    fig = latency_figure(s)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [label for _, label in STAGES]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]
    for container, (key, _) in zip(ax.containers, STAGES):
        heights = [bar.get_height() for bar in container]
        for arm, h in zip(["a", "b"], heights):
            if seconds[arm][key] > 0:
                assert h == pytest.approx(seconds[arm][key])
            else:
                assert h != h  # NaN: no bar at 0 s on a log axis
    lo, hi = ax.get_ylim()
    assert lo <= 0.2 / 2 and hi >= 1.0  # prefill, decode and tool wait are inside the axis next to build


# An arm that can never finish (every episode cut by the context window), a pinless window that fails one task,
# and the baseline: the shape of the issue-23 run, small enough to check by hand.
def _issue_rows(w_tokens=2900):
    rows = []
    for task in ("ce", "nr"):
        for seed in range(3):
            rows.append(_row("wp", task, seed, quality=1.0, tokens=3000, wall=1.0, tool_calls=6))
            fails = task == "ce"
            rows.append(_row("w", task, seed, quality=0.0 if fails else 1.0, tokens=w_tokens, wall=1.0, tool_calls=6,
                             cause="constraint_violated" if fails else "answered"))
            rows.append(_row("k", task, seed, quality=0.0, tokens=1000, wall=0.5, tool_calls=1, cause="context_limit",
                             outcome="truncated"))
    return rows


def _cells(text, first):
    """Cells of every table row of `text` whose first cell is `first`."""
    return [t for table in _tables(text) for t in table[2:] if t[0] == first]


def test_an_arm_that_cannot_complete_is_flagged_and_claims_no_saving():
    s = summarize(_issue_rows(), baseline="wp", n_resamples=300)
    assert s["per_arm"]["k"]["cut_short"] == {"episodes": 6, "truncated": 6, "causes": {"context_limit": 6},
                                              "cannot_complete": True}
    assert not s["per_arm"]["w"]["cut_short"]["cannot_complete"]
    text = render_markdown(s, title="T")
    arms_row, diff_row = _cells(text, "k")[0], _cells(text, "k")[2]
    assert arms_row[-1] == "cannot complete: 6/6 episodes truncated (context_limit: 6); fewer tokens are not a saving"
    assert _cells(text, "w")[0][-1] == "–" and _cells(text, "wp")[0][-1] == "–"
    # quality and completion keep their intervals and stars; tokens, tool calls and wall s get no figure and no star
    assert diff_row[1] == "-1 [-1, -1] *" and diff_row[2] == "-1 [-1, -1] *"
    assert diff_row[4:] == ["– (cannot complete)"] * 3
    assert "-2,000" not in text
    # the arm that completes keeps its saving
    assert _cells(text, "w")[2][4] == "-100 [-100, -100] *"


def test_a_baseline_that_cannot_complete_voids_every_saving():
    s = summarize(_issue_rows(), baseline="k", n_resamples=100)
    text = render_markdown(s, title="T")
    for arm in ("wp", "w"):
        assert _cells(text, arm)[2][4:] == ["– (baseline cannot complete)"] * 3
    assert "- The baseline `k` cannot complete: 6/6 episodes truncated" in text
    assert "saves" not in text and "more prompt tokens" not in text


def test_a_baseline_cut_short_on_a_minority_is_named_as_a_weak_reference():
    cut = [_row("k", "t", 0, quality=0.0, tokens=900, wall=1.0, cause="context_budget", outcome="truncated"),
           _row("k", "t", 1, quality=0.0, tokens=800, wall=1.0, cause="max_new_tokens", outcome="truncated"),
           _row("k", "t", 2, quality=1.0, tokens=1000, wall=1.0)]
    rows = cut + [_row("w", "t", seed, quality=1.0, tokens=500, wall=1.0) for seed in range(3)]
    lines = render_markdown(summarize(rows, baseline="k", n_resamples=100), title="T").splitlines()
    note = ("- The baseline `k` was cut short on 2/3 episodes (context_budget: 1, max_new_tokens: 1): it is not a "
            "reference every episode completes under, so a gain against it can be its own failure (give it a budget "
            "and limits at which it finishes to compare against no compression).")
    assert note not in lines  # 2 of 3 is a majority: the baseline cannot complete, which voids every saving
    assert any(line.startswith("- The baseline `k` cannot complete: 2/3 episodes truncated") for line in lines)
    lines = render_markdown(summarize(cut[1:] + rows[3:], baseline="k", n_resamples=100), title="T").splitlines()
    assert ("- The baseline `k` was cut short on 1/2 episodes (max_new_tokens: 1): it is not a reference every "
            "episode completes under, so a gain against it can be its own failure (give it a budget and limits at "
            "which it finishes to compare against no compression).") in lines
    assert lines.index("## Findings") < lines.index(next(line for line in lines if line.startswith("- The baseline")))
    clean = [_row(a, "t", seed, quality=1.0, tokens=1000, wall=1.0) for a in ("k", "w") for seed in range(3)]
    assert not any(line.startswith("- The baseline") for line in
                   render_markdown(summarize(clean, baseline="k", n_resamples=100), title="T").splitlines())


def test_cut_short_needs_a_strict_majority():
    from ctxkit.experiment.findings import cut_short

    t = _row("x", "t", 0, quality=0, tokens=1, wall=1, cause="max_steps", outcome="truncated")
    ok = _row("x", "t", 1, quality=1, tokens=1, wall=1)
    assert cut_short([t, t, ok])["cannot_complete"] and not cut_short([t, ok])["cannot_complete"]
    assert not cut_short([t, ok, ok])["cannot_complete"] and not cut_short([])["cannot_complete"]


def test_report_opens_with_findings_computed_from_the_numbers():
    s = summarize(_issue_rows(), baseline="wp", n_resamples=300)
    text = render_markdown(s, title="T")
    assert text.startswith("# T\n\n## Findings\n")
    body = text.split("## Findings", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in body.splitlines() if line.startswith("- ")]
    assert len(lines) == 4
    w, k, flagged, front = lines
    # overall -0.5 [-0.83, 0] does not exclude zero: the effect is named per task, as in the issue's run
    assert w == "- `w`: quality on `ce` -1 [-1, -1]; saves 100 prompt tokens per episode (-100 [-100, -100], -3.3% of the baseline's)."
    assert k == ("- `k`: quality -1 [-1, -1]; completion -1 [-1, -1]; cannot complete: 6/6 episodes truncated "
                 "(context_limit: 6); fewer tokens are not a saving (its token, tool-call and wall-time differences "
                 "are left out).")
    assert "saves" not in k and "fewer tool calls" not in k
    assert flagged.startswith("- Cannot complete") and flagged.endswith(": `k`.")
    assert front == ("- Quality-vs-tokens frontier among arms that complete, fewest tokens first: `w` (0.5 at 2,900 "
                     "tokens), `wp` (1 at 3,000 tokens).")
    # deterministic, and computed: other numbers, other words
    assert render_markdown(summarize(_issue_rows(), baseline="wp", n_resamples=300), title="T") == text
    other = render_markdown(summarize(_issue_rows(w_tokens=2800), baseline="wp", n_resamples=300), title="T")
    assert "saves 200 prompt tokens per episode (-200 [-200, -200], -6.7% of the baseline's)" in other


def test_findings_without_significant_differences():
    rows = [_row(arm, "t", seed, quality=1.0, tokens=1000, wall=1.0) for arm in ("a", "b") for seed in range(3)]
    text = render_markdown(summarize(rows, baseline="a", n_resamples=100), title="T")
    assert ("- `b`: no significant difference in quality, completion or violations; no significant difference in "
            "prompt tokens, tool calls or wall time.") in text
    assert "- Every arm completes (no arm has a majority of truncated episodes)." in text


def test_arms_table_gives_means_beside_quantiles():
    text = render_markdown(summarize(ROWS, baseline="a", n_resamples=50), title="T")
    header = _tables(text)[0][0]
    assert header[9:11] == ["tool calls (mean)", "valid calls (fraction)"]
    assert header[12:16] == ["prompt tokens (mean)", "prompt tokens p50/p90/p99", "peak context (mean, tokens)",
                             "peak context p50/p90/p99 (tokens)"]
    assert _cells(text, "a")[0][12:16] == ["2,000", "2,000 / 2,800 / 2,980", "400", "400 / 560 / 596"]
    assert _cells(text, "b")[0][12] == "1,600"
    assert _cells(text, "a")[0][10] == "1"  # rows without malformed_tool_calls: every attempted call parsed


def test_discarded_is_worded_as_the_audit_definition():
    text = render_markdown(summarize(ROWS, baseline="a", n_resamples=50), title="T")
    assert "Discarded: episodes a trainer would drop from training (`ctxkit.training.preflight.is_discarded`" in text
    assert "`ctxkit audit`'s discard_rate" in text


def test_plot_marks_arms_that_cannot_complete_and_keeps_them_off_the_frontier():
    pytest.importorskip("matplotlib")
    from ctxkit.experiment.findings import frontier
    from ctxkit.experiment.report import quality_figure

    s = summarize(_issue_rows(), baseline="wp", n_resamples=50)
    assert frontier(s) == ["w", "wp"]
    ax = quality_figure(s).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["wp", "w", "k (cannot complete: not a saving, off the frontier)", "frontier (arms that complete)"]
    by_label = {c.get_label(): c for c in ax.collections}
    hollow = by_label["k (cannot complete: not a saving, off the frontier)"]
    assert len(hollow.get_facecolors()) == 0 or hollow.get_facecolors()[0][3] == 0
    assert by_label["wp"].get_facecolors()[0][3] > 0
    (line,) = ax.lines
    assert list(line.get_xdata()) == [2900, 3000] and list(line.get_ydata()) == [0.5, 1.0]
