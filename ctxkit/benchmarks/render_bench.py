"""`ctxkit bench render`: incremental rendering vs re-rendering with `apply_chat_template` every turn.

Replays an episode turn by turn: the synthetic one built here (assistant tool call, ~300-word tool
output per turn) or any conversation or imported trajectory (`workload.episode_workloads`). After each
turn is appended it times, per turn and in the same run: ctxkit's `IncrementalRenderer` (append + render
with the generation prompt; special-token text allowed, as `apply_chat_template` does),
`apply_chat_template(tokenize=True)` on the whole history, and encoding only the new text (the physical
limit). Reported per arm: the whole-episode total, p50/p90/p99/max per turn, and the total's ratio
against apply_chat_template and against encode-only; ids are compared at every turn.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ctxkit.benchmarks.synthetic_episode import TOOLS, build_episode  # noqa: F401  (their home; kept importable here)
from ctxkit.benchmarks.workload import cold_start, encode_only_times, new_text_deltas, summarize_times, synthetic_workload
from ctxkit.errors import ConfigError
from ctxkit.text.rendering.renderer import IncrementalRenderer
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.tokenizer.loader import load_tokenizer

APPLY = "apply_chat_template(tokenize=True) every turn"
CTXKIT = "ctxkit IncrementalRenderer"
ENCODE_ONLY = "encode only the new text"


@dataclass(frozen=True)
class RenderArm:
    """One arm of `bench render`."""

    name: str
    """`CTXKIT`, `APPLY` or `ENCODE_ONLY`."""
    timing: Any
    """`workload.Timing`: whole-episode total and per-turn percentiles."""
    vs_peer: float
    """apply_chat_template's total / this arm's total."""
    vs_encode_only: float
    """This arm's total / encode-only's total."""


@dataclass(frozen=True)
class RenderBenchResult:
    """Figures of one `bench render` run (per-turn times are medians over the repeats)."""

    tokenizer: str
    """Tokenizer id."""
    template: str
    """Template id."""
    episode: str
    """The workload's name (`synthetic:<turns>` or `<file>#<entry>`)."""
    turns: int
    """Turns in the episode (one render per turn)."""
    final_tokens: int
    """Tokens in the last context."""
    repeats: int
    """Repeats each measurement was taken."""
    ctxkit_s: float
    """ctxkit IncrementalRenderer: append + render at every turn, total."""
    apply_chat_template_s: float
    """transformers apply_chat_template(tokenize=True) of the whole history at every turn, total."""
    encode_new_text_s: float
    """Encoding only each turn's new text (lower bound), total."""
    speedup_vs_apply: float
    """apply_chat_template_s / ctxkit_s."""
    overhead_vs_encode: float
    """ctxkit_s / encode_new_text_s."""
    ids_identical: bool
    """ctxkit's ids equal apply_chat_template's at every turn."""
    arms: list[RenderArm] = field(default_factory=list)
    """Per arm: total, p50/p90/p99/max per turn, ratios."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict."""
        return asdict(self)


def run(tokenizer_spec: str, turns: int = 200, repeats: int = 3, template: str | None = None, seed: int = 0,
        progress=None) -> RenderBenchResult:
    """The synthetic episode of `turns` turns (the default `bench render`)."""
    tok = load_tokenizer(tokenizer_spec)
    tpl = load_template(template, tok)
    _require_hf(tok)
    return run_workload(tok, tpl, synthetic_workload(turns, tok, tpl, seed), repeats=repeats, progress=progress)


def _require_hf(tok) -> None:
    if tok.hf is None:
        raise ConfigError(f"bench render compares against transformers; --tokenizer must be a Hugging Face tokenizer, got {tok.id}")


def run_workload(tok, tpl, wl, *, repeats: int = 3, progress=None) -> RenderBenchResult:
    """Run the three arms over one workload (see the module docstring)."""
    _require_hf(tok)
    head = wl.chats(wl.head)
    steps = [wl.chats(t) for t in wl.turns]
    tools = wl.tools_or_none
    hf = tok.hf
    chat_template = tpl.source
    say = progress or (lambda msg: None)

    def ctxkit_pass(record: list | None) -> list[float]:
        cold_start(tok)  # each pass tokenizes all of its text: no counts or pieces kept from the last one
        r = IncrementalRenderer(tok, tpl, tools, special_tokens="allow")
        r.extend(head)
        times = []
        for step in steps:
            t0 = time.perf_counter()
            r.extend(step)
            ctx = r.render(add_generation_prompt=True)
            times.append(time.perf_counter() - t0)
            if record is not None:
                record.append(tuple(ctx.token_ids))
        return times

    def apply_pass(record: list | None) -> list[float]:
        msgs = list(head)
        times = []
        for step in steps:
            t0 = time.perf_counter()
            msgs.extend(step)
            ids = hf.apply_chat_template(msgs, tools=tools, chat_template=chat_template, tokenize=True,
                                         add_generation_prompt=True, return_dict=False)
            times.append(time.perf_counter() - t0)
            if record is not None:
                record.append(tuple(ids))
        return times

    deltas = new_text_deltas(wl, tpl, after_each_turn=True)  # untimed
    ours: list = []
    theirs: list = []
    times: dict[str, list] = {CTXKIT: [], APPLY: [], ENCODE_ONLY: []}
    for rep in range(repeats):
        times[CTXKIT].append(ctxkit_pass(ours if rep == 0 else None))
        say(f"repeat {rep + 1}/{repeats}: ctxkit {sum(times[CTXKIT][-1]):.2f}s")
        times[APPLY].append(apply_pass(theirs if rep == 0 else None))
        say(f"repeat {rep + 1}/{repeats}: apply_chat_template {sum(times[APPLY][-1]):.2f}s")
        times[ENCODE_ONLY].append(encode_only_times(tok, deltas))
    identical = len(ours) == len(theirs) == len(steps) and all(a == b for a, b in zip(ours, theirs))
    tm = {k: summarize_times(v) for k, v in times.items()}
    peer, ref = tm[APPLY].total_s, tm[ENCODE_ONLY].total_s
    arms = [RenderArm(k, t, peer / t.total_s if t.total_s else float("inf"), t.total_s / ref if ref else float("inf"))
            for k, t in tm.items()]
    ck = tm[CTXKIT].total_s
    return RenderBenchResult(
        tokenizer=tok.id, template=tpl.id, episode=wl.name, turns=len(steps),
        final_tokens=len(ours[-1]) if ours else 0, repeats=repeats,
        ctxkit_s=ck, apply_chat_template_s=peer, encode_new_text_s=ref,
        speedup_vs_apply=peer / ck if ck else float("inf"), overhead_vs_encode=ck / ref if ref else float("inf"),
        ids_identical=identical, arms=arms,
    )
