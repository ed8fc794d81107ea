#!/usr/bin/env python3
"""Write the README's figures and excerpts from a real run, or check that they are current.

    python scripts/readme_figures.py            # run everything in a temporary workspace, rewrite README.md
    python scripts/readme_figures.py --check    # compare instead of writing (exit 1 and a diff when stale)
    python scripts/readme_figures.py --work DIR # use (or create) the workspace DIR, e.g. to reuse its runs/quick

A figure is README text between `<!-- fig:NAME -->` and `<!-- /fig:NAME -->`; this script produces each one
by running what the README says (the quickstart ablation, `ctxkit replay`, `ctxkit samples`, `ctxkit
inspect`, ...) in a workspace laid out like a checkout: `DIR/ctxkit` (copies of experiments/, examples/,
scripts/) with `DIR/shared` beside it (a link to the shared fixtures: `$CTXKIT_SHARED`, else `../shared`).
Timings sit between `<!-- timing:NAME -->` markers instead: they are written only when this script ran the
whole ablation itself, and never compared (they vary from run to run). Everything else is deterministic:
`--check` compares it exactly, apart from wall-clock fields of log excerpts (`ts`, `created`) and the
hashes that cover them.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ctxkit.benchmarks.machine_load import LoadMeter

REPO = Path(__file__).resolve().parent.parent
WORKSPACE_COPIES = ("experiments", "examples", "scripts")
"""Repository folders a workspace holds (copied: nothing a command writes lands in the repository)."""

MARKER = re.compile(r"<!-- (fig|timing):([a-z0-9-]+) -->(.*?)<!-- /\1:\2 -->", re.S)
VOLATILE = (
    (re.compile(r'"(ts|created)":[0-9.]+'), r'"\1":T'),
    (re.compile(r'"(hash|prev)":"[0-9a-f]+…"'), r'"\1":"H…"'),
)
"""(pattern, replacement) applied before comparing: wall-clock fields and the hashes chained over them."""

QUICK = "runs/quick"
CONFIG = "experiments/quickstart.toml"
QWEN25 = "../shared/tokenizers/qwen2.5-instruct"
QWEN3 = "../shared/tokenizers/qwen3"
REPLAY_TASK, REPLAY_STEP = "constraint-edit-0", 8
SAMPLES_LOG = f"{QUICK}/episodes/mask-observations/calculator-chain-0.jsonl"
TWO_TURNS = '[{"role":"user","content":"2+2?"},{"role":"assistant","content":"4"}]'


def shared_dir() -> Path:
    """The shared fixtures folder: `$CTXKIT_SHARED`, else `shared/` beside the repository."""
    return Path(os.environ.get("CTXKIT_SHARED") or REPO.parent / "shared").resolve()


def make_workspace(root: Path, repo: Path = REPO, shared: Path | None = None) -> Path:
    """Lay out `root/ctxkit` (copies of `WORKSPACE_COPIES`) and `root/shared` (a link to the shared
    fixtures), keeping what is already there. Returns `root/ctxkit`, the cwd of every README command."""
    work = root / "ctxkit"
    work.mkdir(parents=True, exist_ok=True)
    for name in WORKSPACE_COPIES:
        if not (work / name).exists():
            shutil.copytree(repo / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    link = root / "shared"
    if not link.exists():
        link.symlink_to(shared or shared_dir(), target_is_directory=True)
    return work


class Workspace:
    """Runs README commands in a workspace and remembers what they printed."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.env = dict(os.environ)
        self.env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + self.env.get("PATH", "")
        self.env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", COLUMNS="200")
        self.timings: dict[str, str] = {}

    def sh(self, command: str) -> str:
        """Run one shell command in the workspace; its stdout (raises with stderr on failure)."""
        proc = subprocess.run(["bash", "-c", command], cwd=self.cwd, env=self.env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"`{command}` failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc.stdout

    def ablate(self) -> None:
        """Run (or resume) the quickstart ablation; record its wall time (and the load it ran under) when every
        episode ran now."""
        with LoadMeter() as load:
            out = self.sh(f"ctxkit ablate {CONFIG} --out {QUICK} --no-progress")
        m = re.search(r"(\d+) episodes: (\d+) run, (\d+) reused", out)
        if m and m.group(2) == m.group(1):
            self.timings["quickstart-wall"] = f"{m.group(1)} episodes took {duration(load.wall)} ({load})"


def duration(seconds: float) -> str:
    """`41 s` or `2 min 16 s`."""
    s = round(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s"


def num(x: float | None, digits: int = 2) -> str:
    """A number for prose and tables: thousands separators, up to `digits` decimals, no trailing zeros."""
    if x is None:
        return "–"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    text = f"{x:.{digits}f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def signed(x: float, digits: int = 2) -> str:
    """`num` with an explicit `+` on positive values."""
    return ("+" if x > 0 else "") + num(x, digits)


def ci(c: Any, digits: int = 2, sign: bool = False) -> str:
    """`mean [low, high]` of a paired bootstrap interval."""
    return f"{(signed if sign else num)(c.mean_diff, digits)} [{num(c.low, digits)}, {num(c.high, digits)}]"


# ------------------------------------------------------------------------------------------------ run data


def run_summary(ws: Workspace) -> dict[str, Any]:
    """`ctxkit.experiment.report.summarize` of the quickstart run, with the settings `ctxkit report` uses."""
    from ctxkit.experiment.report import summarize

    run = ws.cwd / QUICK
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line.strip()]
    info = json.loads((run / "run.json").read_text()).get("experiment", {})
    rep = info.get("report", {})
    summary = summarize(rows, baseline=info.get("baseline"), arms=[a["name"] for a in info.get("arms", [])],
                        n_resamples=int(rep.get("bootstrap_resamples", 2000)), seed=int(rep.get("bootstrap_seed", 0)))
    summary["limits"] = info.get("limits", {})
    return summary


def events(path: Path) -> list[Any]:
    """The events of a log."""
    from ctxkit.log.event_log import EventLog

    return list(EventLog.open(path).events())


# ------------------------------------------------------------------------------------------------ figures

ARM_NOTES = {"window": "no pins", "summarize": "extractive, static MiniLM", "retrieve": "static MiniLM + faiss"}


def fig_quickstart_table(ws: Workspace, s: dict[str, Any]) -> str:
    """The per-arm table of the quickstart section."""
    per, base = s["per_arm"], s["baseline"]
    budgets = sorted({per[a]["budget"] for a in s["arms"] if a != base})
    window = s["limits"].get("max_context")
    head = f"budget {', '.join(map(str, budgets))} tokens; {base} {per[base]['budget']}" + (
        f", the whole window" if per[base]["budget"] == window else f", window {window}")
    out = [f"| arm ({head}) | quality | how episodes ended | prompt tokens / episode |", "|---|---|---|---|"]
    for arm in s["arms"]:
        notes = [n for n in (ARM_NOTES.get(arm), "baseline" if arm == s["baseline"] else None) if n]
        ends = []
        for key, n in per[arm]["causes"].items():
            outcome, cause = key.split("/", 1)
            ends.append(f"{n} answered" if cause == "answered" else
                        f"{n} `{outcome}` ({cause})" if outcome == "truncated" else f"{n} `{cause}`")
        label = arm + (f" ({', '.join(notes)})" if notes else "")
        out.append(f"| {label} | {num(per[arm]['quality'])} | {', '.join(ends)} | {num(per[arm]['prompt_tokens_mean'])} |")
    return "\n".join(out)


def fig_quickstart_findings(ws: Workspace, s: dict[str, Any]) -> str:
    """The paragraph under the quickstart table."""
    per, base = s["per_arm"], s["baseline"]
    edit = s["per_task_diffs"]["constraint-edit"]["window"]
    saved = 1 - per["mask-observations"]["prompt_tokens_mean"] / per[base]["prompt_tokens_mean"]
    calls = s["diffs"]["mask-observations"]["tool calls"]
    equal = [a for a in s["arms"] if a != base and per[a]["quality"] == per[base]["quality"]]
    best = min(equal, key=lambda a: per[a]["prompt_tokens_mean"])
    best_saved = 1 - per[best]["prompt_tokens_mean"] / per[base]["prompt_tokens_mean"]
    return (
        f"Against no compression (`{base}`, which every episode fits): on constraint-edit, `window` minus `{base}`\n"
        f"is {ci(edit)} in quality (paired bootstrap, 95%): the turn-1 rule scrolls out and the agent edits the\n"
        f"original file; the pinned arm never does. {len(equal)} of {len(s['arms']) - 1} arms keep `{base}`'s quality; "
        f"of them `{best}`\nsaves the most prompt tokens, {num(100 * best_saved, 1)}%. Masking "
        f"{'saves' if saved >= 0 else 'adds'} {num(abs(100 * saved), 1)}% but costs {ci(calls, sign=True)} "
        "tool calls per episode\n(re-reads) and lowers prefix "
        f"reuse from {num(per[base]['prefix_reuse'])} to {num(per['mask-observations']['prefix_reuse'])}."
    )


def fig_template_check(ws: Workspace, s: dict[str, Any]) -> str:
    """`ctxkit template check --tokenizer qwen3 --json`."""
    return "```json\n" + ws.sh(f"ctxkit template check --tokenizer {QWEN3} --json").strip() + "\n```"


def fig_render(ws: Workspace, s: dict[str, Any]) -> str:
    """`ctxkit render two.json`, abridged: the first 4 ids, then from the system turn's end on."""
    (ws.cwd / "two.json").write_text(TWO_TURNS + "\n")
    r = json.loads(ws.sh(f"ctxkit render two.json --tokenizer {QWEN25}"))
    cut = r["spans"][0]["start"] - 5

    def abridge(xs: list[int]) -> str:
        return "[" + ", ".join(map(str, xs[:4])) + ", ..., " + ", ".join(map(str, xs[cut:])) + "]"

    return "\n".join(["```text", f'"token_ids": {abridge(r["token_ids"])}', f'"loss_mask": {abridge(r["loss_mask"])}',
                      f'"spans": {json.dumps(r["spans"])}', "```"])


def fig_inspect(ws: Workspace, s: dict[str, Any]) -> str:
    """`ctxkit inspect`: the table and footer (the token text above them is left out)."""
    lines = ws.sh("ctxkit inspect").rstrip("\n").split("\n")
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"\S+\.json: \d+ tokens", line.strip()))
    end = next(i for i, line in enumerate(lines) if line.startswith("tokenizer ") and i > start)
    return "```text\n" + "\n".join(line.rstrip() for line in lines[start:end + 1]) + "\n```"


def fig_event_log(ws: Workspace, s: dict[str, Any]) -> str:
    """The first 3 lines of the log `ctxkit import` writes, tools and hashes cut."""
    ws.sh("rm -f ep.jsonl && ctxkit import examples/agent_episode.json -o ep.jsonl --episode-id ep-0001")
    out = []
    for line in (ws.cwd / "ep.jsonl").read_text().splitlines()[:3]:
        obj = json.loads(line)
        for key in ("hash", "prev"):
            if key in obj:
                obj[key] = obj[key][:4] + "…"
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        if obj.get("tools"):
            text = text.replace(json.dumps(obj["tools"], ensure_ascii=False, separators=(",", ":")), "[…]")
        out.append(text)
    return "```json\n" + "\n".join(out) + "\n```"


def replay_table(ws: Workspace, arm: str, rows: Callable[[list[list[str]]], list[int]]) -> str:
    """The provenance table `ctxkit replay LOG --step K` prints, with the chosen rows and `...` between."""
    lines = ws.sh(f"ctxkit replay {QUICK}/episodes/{arm}/{REPLAY_TASK}.jsonl --step {REPLAY_STEP}").split("\n")
    top = next(i for i, line in enumerate(lines) if re.fullmatch(r"\d+ tokens, \d+ messages", line.strip()))
    body = []
    for line in lines[top + 4:]:
        if not line.startswith("│"):
            break
        body.append(line.rstrip())
    cells = [[c.strip() for c in line.strip("│").split("│")] for line in body]
    out = [lines[top].strip()] + [line.rstrip() for line in lines[top + 1:top + 4]]
    prev = -1
    for i in rows(cells):
        if i != prev + 1:
            out.append("...")
        out.append(body[i])
        prev = i
    if prev != len(body) - 1:
        out.append("...")
    return "```text\n" + "\n".join(out) + "\n```"


def fig_replay_window(ws: Workspace, s: dict[str, Any]) -> str:
    """Step 8 under `window` (no pins): the first 5 messages."""
    return replay_table(ws, "window", lambda cells: list(range(min(5, len(cells)))))


def fig_replay_pins(ws: Workspace, s: dict[str, Any]) -> str:
    """Step 8 under `window+pins`: the first 4 messages, then the pinned block's text."""
    import ctxkit

    table = replay_table(ws, "window+pins", lambda cells: list(range(min(4, len(cells)))))
    r = ctxkit.replay(ws.cwd / QUICK / "episodes" / "window+pins" / f"{REPLAY_TASK}.jsonl", step=REPLAY_STEP)
    text = ctxkit.load_tokenizer(str(ws.cwd / QWEN25)).decode(list(r.context.token_ids))
    m = re.search(r"<\|im_start\|>system\nPinned constraints:.*?<\|im_end\|>", text, re.S)
    return table + "\n```text\n" + (m.group(0) if m else "(no pinned block)") + "\n```"


def fig_replay_mask(ws: Workspace, s: dict[str, Any]) -> str:
    """Step 8 under `mask-observations`: the first 4 messages and the first verbatim output after the masked ones."""

    def rows(cells: list[list[str]]) -> list[int]:
        masked = [i for i, c in enumerate(cells) if c[2] == "masked"]
        after = next((i for i in range(masked[-1] + 1 if masked else 0, len(cells))
                      if cells[i][1] == "tool" and cells[i][2] == "verbatim"), None)
        picked = list(range(min(4, len(cells))))
        return picked + ([after - 1, after] if after is not None and after - 1 > picked[-1] else [])

    return replay_table(ws, "mask-observations", rows)


def fig_replay_samples(ws: Workspace, s: dict[str, Any]) -> str:
    """The worked example: `ctxkit replay --verify` and `ctxkit samples` on one log, with what they print."""
    n_steps = sum(e.kind == "step" for e in events(ws.cwd / SAMPLES_LOG))
    cmds = [f"ctxkit replay --verify {SAMPLES_LOG}", f"ctxkit samples {SAMPLES_LOG} -o s.parquet"]
    # `samples` refuses an existing output (the overwrite rule); the README's own run of the block may have
    # written it in this workspace already
    (ws.cwd / "s.parquet").unlink(missing_ok=True)
    out = [f"Worked example, from the quickstart run (scripted agents, `calculator-chain`, seed 0, {n_steps} steps):",
           "", "```bash"]
    for cmd in cmds:
        out += [cmd] + ["#   " + line for line in printed_summary(ws.sh(cmd).strip().split("\n"))]
    return "\n".join(out + ["```"])


def printed_summary(lines: list[str]) -> list[str]:
    """What a README excerpt shows of a command's output: from `ctxkit samples`' summary line on (its split
    and cut lines follow it), else its last line."""
    start = next((i for i, line in enumerate(lines) if " samples from " in line), None)
    return lines[start:] if start is not None else lines[-1:]


SAMPLE_ARMS = (
    ("truncate-tool-output", "`truncate-tool-output` (truncates outputs as they arrive: history never rewritten)"),
    ("window+pins", None),
    ("retrieve", "`retrieve`"),
    ("mask-observations", '`mask-observations`, `trigger="every_turn"` (each new mask rewrites the middle)'),
    ("keep-all", None),
)


def fig_samples_table(ws: Workspace, s: dict[str, Any]) -> str:
    """Samples, tokens and loss-bearing tokens of one episode under five arms."""
    import ctxkit

    out = ["| arm | samples | tokens | loss-bearing tokens |", "|---|---|---|---|"]
    for arm, label in SAMPLE_ARMS:
        path = ws.cwd / QUICK / "episodes" / arm / "calculator-chain-0.jsonl"
        evs = events(path)
        if arm == "window+pins":
            n = sum(e.kind == "compaction" for e in evs)
            label = f"`{arm}` ({'one' if n == 1 else n} compaction{'s' if n != 1 else ''})"
        elif label is None:
            end = next(e for e in reversed(evs) if e.kind == "episode_end")
            label = (f"`{arm}` (no compression: history never rewritten)" if end.outcome != "truncated" else
                     f"`{arm}` (cut by the {s['limits'].get('max_context')}-token window: `{end.outcome}`, "
                     f"`{end.reward_kind}`)")
        rows = ctxkit.samples(path)
        out.append(f"| {label} | {len(rows)} | {num(sum(len(r.token_ids) for r in rows))} | "
                   f"{num(sum(r.n_sampled for r in rows))} |")
    return "\n".join(out)


def fig_parquet_row(ws: Workspace, s: dict[str, Any]) -> str:
    """The first row of `s.parquet` (written by the worked example), lists cut."""
    import pyarrow.parquet as pq

    row = pq.read_table(ws.cwd / "s.parquet").slice(0, 1).to_pylist()[0]

    def cut(xs: list[Any], n: int = 8) -> str:
        return "[" + ", ".join(map(str, xs[:n])) + (", ...]" if len(xs) > n else "]")

    comp = row["compressor"]
    m = re.match(r"(\S+) (\{.*\})$", comp)
    if m:
        params = json.loads(m.group(2))
        shown = dict(list(params.items())[:3])
        comp = f"{m.group(1)} {json.dumps(shown)[:-1]}{', ...}' if len(params) > 3 else '}'}"
    lines = [
        f"episode_id      {row['episode_id']}",
        f"sample_index    {row['sample_index']}            prefix_sample {row['prefix_sample']}   "
        f"prefix_len {row['prefix_len']}   stored_from {row['stored_from']}",
        f"n_tokens        {row['n_tokens']}         prompt_len {row['prompt_len']}",
        f"token_ids       {cut(row['token_ids'])}",
        f"loss_mask       {cut(row['loss_mask'])}",
        f"logprobs        {cut(row['logprobs'])}",
        f"step_seqs       {row['step_seqs']}",
        f"logprob_kind    {row['logprob_kind']}",
        f"sampling        {[row['sampling'][0]]}"[:-1] + ", ...]",
        f"policy_versions {[row['policy_versions'][0]]}"[:-1] + ", ...]",
        f"finish_reasons  {row['finish_reasons']}",
        f"reward {row['reward']}   reward_kind {row['reward_kind']}   outcome {row['outcome']}   "
        f"cause {row['cause']}   is_final {row['is_final']}",
        f"template_id     {row['template_id']}",
        f"tokenizer_id    {row['tokenizer_id']}",
        f"compressor      {comp}",
    ]
    return "```text\n" + "\n".join(lines) + "\n```"


TAU = "../shared/trajectories/tau-bench__gpt-4o-airline.json"
TAU_TOOLS = "../shared/trajectories/tau-bench__airline_tools.json"


def fig_trajectory_samples(ws: Workspace, s: dict[str, Any]) -> str:
    """Import the 200 tau-bench episodes with offline steps, verify one, and write compression-aware
    samples at 4096 (episodes cut where a context cannot fit) and 8192 tokens; the wall time of the whole
    sequence is a timing."""
    shutil.rmtree(ws.cwd / "runs" / "tau", ignore_errors=True)
    for name in ("tau-8192.parquet", "tau-4096.parquet"):  # `samples` refuses an existing output
        (ws.cwd / "runs" / name).unlink(missing_ok=True)
    cmds = [f"ctxkit import {TAU} --tools {TAU_TOOLS} --out-dir runs/tau --tokenizer {QWEN25}",
            "ctxkit replay --verify runs/tau/task-0-trial-0.jsonl",
            "ctxkit samples runs/tau --compressor window --budget 8192 -o runs/tau-8192.parquet",
            "ctxkit samples runs/tau --compressor window --budget 4096 --on-overflow truncate -o runs/tau-4096.parquet"]
    out = ["```bash"]
    with LoadMeter() as load:
        for cmd in cmds:
            printed = ws.sh(cmd).strip().split("\n")
            keep = [line for line in printed if not line.startswith("rebuilt under")]
            shown = printed_summary(keep) if any(" samples from " in line for line in keep) else keep[-2:]
            out += [cmd] + ["#   " + line for line in shown]
    ws.timings["tau-samples"] = f"{duration(load.wall)}, {load},"
    return "\n".join(out + ["```"])


def fig_constraint_eval(ws: Workspace, s: dict[str, Any]) -> str:
    """`python scripts/constraint_eval.py`: precision and recall of both detectors on the labelled set."""
    script = REPO / "scripts" / "constraint_eval.py"
    proc = subprocess.run([sys.executable, str(script)], cwd=ws.cwd, env=ws.env, capture_output=True, text=True, check=True)
    lines = [line for line in proc.stdout.strip().split("\n") if not line.lstrip().startswith("source:")]
    return "```text\n" + "\n".join(lines) + "\n```"


FIGURES: dict[str, Callable[[Workspace, dict[str, Any]], str]] = {
    "quickstart-table": fig_quickstart_table,
    "quickstart-findings": fig_quickstart_findings,
    "template-check": fig_template_check,
    "render": fig_render,
    "inspect": fig_inspect,
    "event-log": fig_event_log,
    "replay-window": fig_replay_window,
    "replay-pins": fig_replay_pins,
    "replay-mask": fig_replay_mask,
    "replay-samples": fig_replay_samples,
    "samples-table": fig_samples_table,
    "parquet-row": fig_parquet_row,
    "trajectory-samples": fig_trajectory_samples,
    "constraint-eval": fig_constraint_eval,
}
"""Figure name -> the function producing its text (in the order they run: the parquet row reads the file
the worked example writes)."""


# ------------------------------------------------------------------------------------------------ README


def normalized(text: str) -> str:
    """Text as compared by `--check`: volatile fields replaced, trailing spaces dropped."""
    for pattern, repl in VOLATILE:
        text = pattern.sub(repl, text)
    return "\n".join(line.rstrip() for line in text.strip("\n").split("\n"))


def apply(readme: str, figures: dict[str, str], timings: dict[str, str]) -> str:
    """README text with every figure (and measured timing) replaced between its markers."""

    def sub(m: re.Match) -> str:
        kind, name, old = m.group(1), m.group(2), m.group(3)
        new = (figures if kind == "fig" else timings).get(name)
        if new is None or (kind == "fig" and normalized(old) == normalized(new)):
            return m.group(0)  # unchanged apart from volatile fields: keep the text (no churn)
        body = f"\n{new}\n" if old.startswith("\n") else new
        return f"<!-- {kind}:{name} -->{body}<!-- /{kind}:{name} -->"

    return MARKER.sub(sub, readme)


def check(readme: str, figures: dict[str, str]) -> list[str]:
    """A unified diff per figure whose README text differs from `figures` (volatile fields aside)."""
    stale = []
    for m in MARKER.finditer(readme):
        kind, name, old = m.group(1), m.group(2), m.group(3)
        if kind != "fig" or name not in figures:
            continue
        a, b = normalized(old), normalized(figures[name])
        if a != b:
            diff = difflib.unified_diff(a.split("\n"), b.split("\n"), f"README.md fig:{name}", "fresh run", lineterm="")
            stale.append("\n".join(diff))
    return stale


def marker_names(readme: str) -> dict[str, list[str]]:
    """`{"fig": [...], "timing": [...]}`: the marker names README.md holds."""
    out: dict[str, list[str]] = {"fig": [], "timing": []}
    for m in MARKER.finditer(readme):
        out[m.group(1)].append(m.group(2))
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with README.md instead of writing it")
    ap.add_argument("--work", type=Path, help="workspace folder (created if missing; kept); default: a temporary one")
    ap.add_argument("--readme", type=Path, default=REPO / "README.md")
    args = ap.parse_args(argv)
    readme = args.readme.read_text(encoding="utf-8")
    names = marker_names(readme)
    unknown = sorted(set(names["fig"]) - set(FIGURES))
    missing = sorted(set(FIGURES) - set(names["fig"]))
    dupes = sorted({n for n in names["fig"] if names["fig"].count(n) > 1})
    if unknown or missing or dupes:
        print(f"{args.readme}: figure markers: unknown {unknown}, missing {missing}, repeated {dupes}", file=sys.stderr)
        return 2
    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="readme-figures-")
        args.work = Path(tmp.name)
    try:
        ws = Workspace(make_workspace(args.work.resolve()))
        ws.ablate()
        summary = run_summary(ws)
        figures = {name: fn(ws, summary) for name, fn in FIGURES.items()}
    finally:
        if tmp is not None:
            tmp.cleanup()
    if args.check:
        stale = check(readme, figures)
        for d in stale:
            print(d + "\n")
        print(f"{args.readme}: {len(FIGURES) - len(stale)}/{len(FIGURES)} figures current"
              + ("" if not stale else f"; stale: rerun `python scripts/readme_figures.py`"))
        return 1 if stale else 0
    new = apply(readme, figures, ws.timings)
    if new != readme:
        args.readme.write_text(new, encoding="utf-8")
    print(f"{args.readme}: {len(FIGURES)} figures written" + (f", timings {sorted(ws.timings)}" if ws.timings else
                                                              " (timings kept: the ablation was reused)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
