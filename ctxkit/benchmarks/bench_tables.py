"""Plain-text tables of `bench build`, `bench render` and `bench build --trajectories` results.

Totals and ratios come first (medians alone flatter: the turns where a compressor rewrites the view are
in the tail), then p50/p90/p99/max per build.
"""

from __future__ import annotations

from typing import Any, Sequence


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}x"


def _row(cells: Sequence[str], widths: Sequence[int], left: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()


def table(header: Sequence[str], rows: Sequence[Sequence[str]], left: Sequence[int] = (0,)) -> str:
    """Columns `left` left-aligned (names), the others right-aligned (figures), one line per row."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [_row(header, widths, left), _row(["-" * w for w in widths], widths, left)]
    lines += [_row([str(c) for c in r], widths, left) for r in rows]
    return "\n".join(lines)


def _timing_cells(t: Any) -> list[str]:
    return [f"{t.p50_ms:.2f}", f"{t.p90_ms:.2f}", f"{t.p99_ms:.2f}", f"{t.max_ms:.2f}"]


def build_table(result: Any) -> str:
    """`bench build`: one row per arm, model-backed arms in their own block below the others."""
    header = ["arm", "total s", "vs langchain", "vs encode-only", "p50 ms", "p90 ms", "p99 ms", "max ms",
              "compactions", "max tok", "over budget", "orphans", "ids identical"]
    out = [f"bench build: {result.episode}, {result.decisions} builds, budget {result.budget} ({result.budget_note}), "
           f"full episode {result.episode_tokens} tokens, per-build medians of {result.repeats} repeats; "
           f"tokenizer {result.tokenizer}, template {result.template}"]
    blocks = [("", [a for a in result.arms if a.kind != "ctxkit-model"]),
              ("model-backed arms (slow; first pass includes the model load)",
               [a for a in result.arms if a.kind == "ctxkit-model"])]
    for title, arms in blocks:
        if not arms:
            continue
        rows = []
        for a in arms:
            ids = "-" if a.ids_identical is None else ("yes" if a.ids_identical else "NO")
            rows.append([a.name, f"{a.timing.total_s:.3f}", _x(a.vs_peer), _x(a.vs_encode_only), *_timing_cells(a.timing),
                         str(a.compactions) if a.kind.startswith("ctxkit") else "-", str(a.max_tokens or "-"),
                         str(a.over_budget) if a.kind != "reference" else "-",
                         str(a.orphans) if a.kind != "reference" else "-", ids])
        if title:
            out += ["", title + ":"]
            header_m = [*header, "first pass s"]
            rows = [[*r, f"{a.first_pass_s:.2f}"] for r, a in zip(rows, arms)]
            out.append(table(header_m, rows))
        else:
            out.append(table(header, rows))
    for a in result.arms:
        if a.error:
            out.append(f"{a.name} stopped: {a.error}")
    peer = next((a for a in result.arms if a.kind == "peer"), None)
    ok = result.ok
    out.append("ctxkit contexts within budget (real tokens of the final render) and ids identical to a full render: "
               + ("yes, every build" if ok else "NO"))
    if peer is not None:
        lc = "yes" if peer.over_budget == 0 else f"no, {peer.over_budget} builds over"
        out.append(f"langchain contexts within budget: {lc}; orphaned tool messages: {peer.orphans}; "
                   f"builds missing a pinned constraint: {peer.pins_missing}")
    return "\n".join(out)


def render_table(result: Any) -> str:
    """`bench render`: one row per arm."""
    header = ["method", "total s", "vs apply_chat_template", "vs encode-only", "p50 ms", "p90 ms", "p99 ms", "max ms"]
    rows = [[a.name, f"{a.timing.total_s:.3f}", _x(a.vs_peer), _x(a.vs_encode_only), *_timing_cells(a.timing)]
            for a in result.arms]
    return "\n".join([
        f"bench render: {result.episode}, {result.turns} turns, {result.final_tokens} tokens in the last context, "
        f"per-turn medians of {result.repeats} repeats",
        table(header, rows),
        f"ids identical at every turn: {'yes' if result.ids_identical else 'NO'}",
        f"tokenizer {result.tokenizer}  ·  template {result.template}",
    ])


def trajectories_table(rows: Sequence[dict]) -> str:
    """`bench build --trajectories`: per file and arm, totals over the file's episodes, worst tails."""
    header = ["file", "episodes", "builds", "arm", "total s", "vs langchain", "vs encode-only", "p99 ms (worst)",
              "max ms", "compactions", "over budget", "ids identical", "budgets"]
    cells = [[r["file"], str(r["episodes"]), str(r["builds"]), r["arm"], f"{r['total_s']:.3f}", _x(r["vs_peer"]),
              _x(r["vs_encode_only"]), f"{r['p99_ms']:.2f}", f"{r['max_ms']:.2f}",
              "-" if r["compactions"] is None else str(r["compactions"]),
              "-" if r["over_budget"] is None else str(r["over_budget"]),
              {True: "yes", False: "NO", None: "-"}[r["ids_identical"]], r["budgets"]] for r in rows]
    return table(header, cells, left=(0, 3))
