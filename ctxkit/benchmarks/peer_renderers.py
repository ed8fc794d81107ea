"""Side by side with PrimeIntellect's `renderers` (the `bench` extra): ids against `apply_chat_template`.

`renderers` hand-codes one renderer per model family (its registry names: `qwen3`, `glm-4.5`, `llama-3`, ...).
`PEER_FAMILIES` maps each name it shares with TRL's stock templates (`template_families`) to those templates;
each pair renders through one tokenizer folder that ctxkit, transformers and `renderers` all read: the
family tokenizer of the conformance suite (the shared Qwen2.5 BPE plus the family's special tokens) with the
few ordinary added tokens `renderers` looks up by text and refuses to start without (`PEER_TOKENS`, e.g.
Qwen3's `<tool_response>`, which the real Qwen3 vocabulary holds). The real shared Qwen3 tokenizer with its
own template is one more pair (`SHARED_QWEN3`).

Correctness (`count_mismatches`): on the generated conversations (`family_conversations`, with and without
the generation prompt) and on the whole history of episodes of `../shared/trajectories`, per side (ctxkit's
`render`, `renderers`' `render_ids`) the conversations whose ids differ from `apply_chat_template`'s, and
those the side refuses (raises) where transformers renders. Conversations transformers refuses are left out
of both counts. Templates that print the date see `DATE` on every side (transformers through `date_string`,
ctxkit through its clock; `renderers`' Llama 3 defaults to it).

Speed is `peer_episodes` (whole episodes rendered turn by turn); `python -m ctxkit.benchmarks.peer_renderers`
prints both tables from one run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ctxkit.errors import ConfigError, CtxkitError

PEER = "renderers"
"""The peer package (PyPI name and import name)."""
PEER_VERSION = "0.1.12"
"""The version the `bench` extra pins and this comparison was written against."""
SHARED_QWEN3 = "shared:qwen3"
"""Pseudo-family: the real Qwen3 tokenizer of `<shared>/tokenizers/qwen3` with its own chat template."""

PEER_FAMILIES: dict[str, tuple[str, ...]] = {
    "qwen3": (SHARED_QWEN3, "qwen3"),
    "qwen3.5": ("qwen3_5_think", "qwen3_5_nothink"),
    "qwen3.6": ("qwen3_6",),
    "qwen3.8": ("qwen3_8",),
    "qwen3-vl": ("qwen3_vl",),
    "gemma4": ("gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "gemma4_v5"),
    "glm-4.5": ("glm4moe",),
    "deepseek-v3": ("deepseekv3",),
    "deepseek-r1": ("deepseek_r1_distill",),
    "llama-3": ("llama3", "llama3_1", "llama3_2"),
    "nemotron-3": ("nemotron_3_nano", "nemotron_3_super"),
    "nemotron-3-ultra": ("nemotron_3_ultra",),
    "nemotron-3.5": ("nemotron_3_5_lightning",),
}
"""`renderers`' registry name -> TRL stock templates (or `SHARED_QWEN3`) of the same family. TRL keeps
several revisions of some families, and `renderers` hand-codes one: where the revision differs (TRL's
`llama3` is Llama 3.0, without the 3.1 knowledge-date system block; `deepseek_r1_distill` drops tool calls
that DeepSeek-R1's template writes; TRL's `deepseekv3` opens `<think>` at the generation prompt; Gemma 4's
v1-v4 revisions format reasoning and tool results otherwise than v5), `renderers`' differences measure
that it does not render that revision, not a defect on the one it targets."""

_TOOL_RESPONSE = ("<tool_response>", "</tool_response>")
PEER_TOKENS: dict[str, tuple[str, ...]] = {
    **{f: _TOOL_RESPONSE for f in ("qwen3", "qwen3_5_think", "qwen3_5_nothink", "qwen3_6", "qwen3_8",
                                   "nemotron_3_nano", "nemotron_3_super", "nemotron_3_ultra",
                                   "nemotron_3_5_lightning")},
    "qwen3_vl": _TOOL_RESPONSE + ("<think>", "</think>"),
    **{f: ("<|image>", "<image|>") for f in ("gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "gemma4_v5")},
    "glm4moe": ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    **{f: ("<|end_of_text|>", "<|eom_id|>") for f in ("llama3", "llama3_1", "llama3_2")},
}
"""Stock template -> texts `renderers` requires as single tokens that the family tokenizer lacks, added as
ordinary (non-special) tokens, as in the real vocabularies (found by `create_renderer`'s refusals)."""

NOT_COMPARED: dict[str, str] = {
    "gpt-oss": "renderers' gpt-oss renders through openai-harmony's own o200k encoding, not the given tokenizer; "
               "TRL's gptoss template renders here on the Qwen2.5 BPE family tokenizer, so the ids are not comparable",
}
"""Families both support that are left out, with why (said in every report)."""

DATE = datetime(2024, 7, 26, 12)
"""The date every side renders with (`renderers`' Llama 3 default `date_string`)."""
DATE_STRING = "26 Jul 2024"
"""`DATE` as the Llama 3 templates print it."""
LISTED = 4
"""Differing case names listed per pair, side and source (the rest are counted)."""
TRAJECTORY_EPISODES = 2
"""Episodes per trajectory file in the correctness count (the first ones of `trajectories_bench.spread`)."""


@dataclass(frozen=True)
class PeerPair:
    """One family both support: `renderers`' name and the template/tokenizer it is compared on."""

    renderer: str
    """`renderers`' registry name (`create_renderer` config)."""
    family: str
    """TRL stock template name, or `SHARED_QWEN3`."""


@dataclass(frozen=True)
class Case:
    """One conversation to render."""

    name: str
    """`<conversation>[+gp]` (generated) or `<file>#<entry>` (trajectory)."""
    messages: tuple[dict, ...]
    """OpenAI messages."""
    tools: tuple[dict, ...] | None
    """Tool schemas, or None."""
    add_generation_prompt: bool
    """Whether the generation prompt is added."""


@dataclass(frozen=True)
class SideCount:
    """One side's ids against `apply_chat_template` over a set of cases."""

    side: str
    """`ctxkit` or `renderers`."""
    compared: int
    """Cases transformers rendered (the others count nowhere)."""
    differ: int
    """Cases whose ids differ from transformers'."""
    refused: int
    """Cases the side raised on where transformers rendered."""
    reference_refused: int
    """Cases transformers refused."""
    differing: tuple[str, ...] = ()
    """Names of the differing cases."""
    refusals: tuple[str, ...] = ()
    """`<case>: <Error>: <message>` of each refusal (message cut at 160 characters)."""


@dataclass
class PairSides:
    """The tokenizers and renderers of one pair, loaded once."""

    pair: PeerPair
    """Which pair."""
    tok: Any
    """ctxkit `Tokenizer`."""
    tpl: Any
    """ctxkit `ChatTemplate` (clock at `DATE`)."""
    hf: Any
    """transformers tokenizer (the reference)."""
    peer: Any
    """`renderers` renderer, or None when it could not be created (`peer_error`)."""
    peer_error: str | None = None
    """Why `create_renderer` refused, or None."""
    template: str | None = field(default=None)
    """The chat template text transformers renders with (None: the tokenizer's own)."""


def require_renderers():
    """Import `renderers`, or raise `ConfigError` naming the extra that installs it."""
    try:
        import renderers  # lazy: the peer is an optional benchmark dependency
    except ImportError as exc:
        raise ConfigError(f"the side-by-side benchmark needs {PEER}=={PEER_VERSION} "
                          "(pip install -e '.[bench]')") from exc
    return renderers


def pairs(only: Sequence[str] | None = None) -> list[PeerPair]:
    """Every pair of `PEER_FAMILIES` (or those whose renderer or family name is in `only`), in table order."""
    out = [PeerPair(r, f) for r, fams in PEER_FAMILIES.items() for f in fams]
    if only:
        unknown = set(only) - {p.renderer for p in out} - {p.family for p in out}
        if unknown:
            raise ConfigError(f"--families: {', '.join(sorted(unknown))} not among the pairs "
                              f"({', '.join(PEER_FAMILIES)})")
        out = [p for p in out if p.renderer in only or p.family in only]
    return out


def spec_of(family: str):
    """The conformance suite's `FamilySpec` of a family (`SHARED_QWEN3` is Qwen3's)."""
    from ctxkit.benchmarks.template_families import family_spec  # lazy: the suite's table

    return family_spec("qwen3" if family == SHARED_QWEN3 else family)


def tokenizer_folder(family: str, shared: Path, root: Path) -> Path:
    """The folder all three sides read for `family` (see the module docstring); written once under `root`."""
    from ctxkit.benchmarks.template_families import family_tokenizer  # lazy: writes with `tokenizers`

    if family == SHARED_QWEN3:
        return Path(shared) / "tokenizers" / "qwen3"
    return family_tokenizer(family, Path(shared), Path(root), added=PEER_TOKENS.get(family, ()))


def load_sides(pair: PeerPair, shared: Path, root: Path) -> PairSides:
    """Load ctxkit's tokenizer and template, transformers' tokenizer and `renderers`' renderer of `pair`."""
    from transformers import AutoTokenizer  # lazy: the reference side

    from ctxkit.text.template.chat_template import load_template  # lazy: L2 entry point
    from ctxkit.text.tokenizer.loader import load_tokenizer  # lazy: L1 entry point

    rd = require_renderers()
    folder = tokenizer_folder(pair.family, shared, root)
    tok = load_tokenizer(str(folder))
    tpl = load_template(None, tok, clock=DATE)
    hf = AutoTokenizer.from_pretrained(str(folder))
    try:
        from renderers.configs import config_from_name  # lazy: the peer

        peer, err = rd.create_renderer(hf, config_from_name(pair.renderer)), None
    except Exception as exc:  # noqa: BLE001 - any refusal of the peer is reported, not raised
        peer, err = None, f"{type(exc).__name__}: {exc}"
    return PairSides(pair, tok, tpl, hf, peer, err)


def reference_ids(sides: PairSides, messages: Sequence[Mapping], tools, agp: bool) -> list[int]:
    """`apply_chat_template(tokenize=True)` ids (the reference every side is counted against)."""
    return list(sides.hf.apply_chat_template(list(messages), tools=tools, tokenize=True, add_generation_prompt=agp,
                                             return_dict=False, date_string=DATE_STRING))


def ctxkit_ids(sides: PairSides, case: Case) -> list[int]:
    """ctxkit's `render` ids (special-token text in content allowed, as `apply_chat_template` does)."""
    from ctxkit.text.rendering.renderer import render  # lazy: L3 entry point

    tools = None if case.tools is None else list(case.tools)
    return list(render(list(case.messages), sides.tok, sides.tpl, tools=tools,
                       add_generation_prompt=case.add_generation_prompt, special_tokens="allow").token_ids)


def peer_ids(sides: PairSides, case: Case) -> list[int]:
    """`renderers`' `render_ids` (raises `ConfigError` with its creation error when it has no renderer)."""
    if sides.peer is None:
        raise ConfigError(f"renderers could not create {sides.pair.renderer!r}: {sides.peer_error}")
    tools = None if case.tools is None else list(case.tools)
    return list(sides.peer.render_ids([dict(m) for m in case.messages], tools=tools,
                                      add_generation_prompt=case.add_generation_prompt))


def count_mismatches(cases: Sequence[Case], reference: Callable[[Case], Sequence[int]],
                     sides: Mapping[str, Callable[[Case], Sequence[int]]]) -> dict[str, SideCount]:
    """Per side, its ids against `reference`'s over `cases` (see `SideCount`); `reference` raising leaves the
    case out of every side's count."""
    expected: dict[str, list[int] | None] = {}
    for c in cases:
        try:
            expected[c.name] = list(reference(c))
        except Exception:  # noqa: BLE001 - a reference refusal only removes the case
            expected[c.name] = None
    ref_refused = sum(v is None for v in expected.values())
    out = {}
    for side, fn in sides.items():
        differ, refusals = [], []
        for c in cases:
            want = expected[c.name]
            if want is None:
                continue
            try:
                got = list(fn(c))
            except Exception as exc:  # noqa: BLE001 - a side's refusal is counted, with its message
                refusals.append(f"{c.name}: {type(exc).__name__}: {str(exc)[:160]}")
                continue
            if got != want:
                differ.append(c.name)
        out[side] = SideCount(side, len(cases) - ref_refused, len(differ), len(refusals), ref_refused,
                              tuple(differ), tuple(refusals))
    return out


def generated_cases(family: str) -> list[Case]:
    """The family's generated conversations, each with and without the generation prompt."""
    from ctxkit.benchmarks.family_conversations import family_conversations  # lazy: the suite's conversations

    return [Case(f"{name}{'+gp' if agp else ''}", tuple(msgs), None if tools is None else tuple(tools), agp)
            for name, (msgs, tools) in family_conversations(spec_of(family)).items() for agp in (False, True)]


def trajectory_cases(folder: str | Path, episodes: int = TRAJECTORY_EPISODES, progress=None) -> list[Case]:
    """The whole history of the first `episodes` episodes of `trajectories_bench.spread` in every file of
    `folder` (files no importer reads yet are skipped, said through `progress`); no generation prompt."""
    # lazy: the trajectory helpers import the compressors' benchmark
    from ctxkit.benchmarks.trajectories_bench import skipped_files, spread, trajectory_files
    from ctxkit.benchmarks.workload import episode_workloads  # lazy: reads the files
    from ctxkit.log.importers import read_episodes  # lazy: L2 importers
    from ctxkit.text.template.chat_template import load_template  # lazy: L2 entry point
    from ctxkit.text.tokenizer.loader import load_tokenizer, shared_dir  # lazy: L1 entry point

    if episodes <= 0:
        return []
    files = trajectory_files(folder)  # ConfigError naming a folder that is not there
    say = progress or (lambda msg: None)
    for name in skipped_files(folder):
        say(f"{name}: skipped (its format has no importer yet)")
    tok = load_tokenizer(str(shared_dir() / "tokenizers" / "qwen2.5-instruct"))  # only to cut the episodes
    tpl = load_template(None, tok)
    out = []
    for path, tools_file in files:
        picked = spread(len(read_episodes(path)))[:episodes]
        for wl in episode_workloads(str(path), tok, tpl, select=",".join(map(str, picked)),
                                    tools_file=str(tools_file) if tools_file else None):
            msgs = wl.chats(wl.head) + [c for t in wl.turns for c in wl.chats(t)]
            out.append(Case(wl.name, tuple(msgs), None if wl.tools_or_none is None else tuple(wl.tools_or_none),
                            False))
    return out


@dataclass(frozen=True)
class CorrectnessRow:
    """One pair's counts on the generated conversations and on the trajectories."""

    pair: PeerPair
    """Which pair."""
    generated: dict[str, SideCount]
    """Side -> counts on the generated conversations."""
    trajectories: dict[str, SideCount]
    """Side -> counts on the trajectory episodes."""
    peer_error: str | None
    """`create_renderer`'s refusal, or None."""


def correctness(sides: PairSides, trajectories: Sequence[Case]) -> CorrectnessRow:
    """Count both sides against `apply_chat_template` on the pair's generated cases and on `trajectories`."""
    def ref(c: Case):
        return reference_ids(sides, c.messages, None if c.tools is None else list(c.tools), c.add_generation_prompt)

    fns = {"ctxkit": lambda c: ctxkit_ids(sides, c), PEER: lambda c: peer_ids(sides, c)}
    gen = count_mismatches(generated_cases(sides.pair.family), ref, fns)
    traj = count_mismatches(list(trajectories), ref, fns)
    return CorrectnessRow(sides.pair, gen, traj, sides.peer_error)


def _cell(c: SideCount) -> str:
    return f"{c.differ}/{c.compared}" + (f" ({c.refused} refused)" if c.refused else "")


def correctness_table(rows: Sequence[CorrectnessRow]) -> str:
    """Per pair: differing/compared (refusals) for each side, generated and trajectories."""
    from ctxkit.benchmarks.bench_tables import table  # lazy: plain-text tables

    header = ["renderers", "template", "ctxkit gen", f"{PEER} gen", "ctxkit traj", f"{PEER} traj",
              "hf refuses gen/traj"]
    cells = [[r.pair.renderer, r.pair.family, _cell(r.generated["ctxkit"]), _cell(r.generated[PEER]),
              _cell(r.trajectories["ctxkit"]), _cell(r.trajectories[PEER]),
              f"{r.generated['ctxkit'].reference_refused}/{r.trajectories['ctxkit'].reference_refused}"]
             for r in rows]
    out = ["ids differing from apply_chat_template (differ/compared; refused = raised where transformers renders)",
           table(header, cells, left=(0, 1))]
    for r in rows:
        for where, counts in (("gen", r.generated), ("traj", r.trajectories)):
            for side, c in counts.items():
                if c.differing:
                    more = f" and {len(c.differing) - LISTED} more" if len(c.differing) > LISTED else ""
                    out.append(f"  {r.pair.family} {side} {where} differ: {', '.join(c.differing[:LISTED])}{more}")
                for msg in c.refusals[:1]:
                    out.append(f"  {r.pair.family} {side} {where} refused {msg}")
                if len(c.refusals) > 1:
                    out.append(f"  {r.pair.family} {side} {where} refused: {len(c.refusals) - 1} more")
    return "\n".join(out)


def _source(args, sides: PairSides):
    """The workload `--episode` names, cut through this pair's tokenizer (None: the synthetic episode)."""
    if args.episode is None:
        return None
    from ctxkit.benchmarks.workload import episode_workloads  # lazy: reads the file

    return episode_workloads(args.episode, sides.tok, sides.tpl, select=args.select or "0")[0]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m ctxkit.benchmarks.peer_renderers`: both tables (correctness, then whole-episode speed)."""
    from ctxkit.benchmarks import peer_episodes  # lazy: the speed half
    from ctxkit.benchmarks.machine_load import LoadMeter  # lazy: the load beside the timings
    from ctxkit.text.tokenizer.loader import shared_dir  # lazy: L1

    ap = argparse.ArgumentParser(prog="python -m ctxkit.benchmarks.peer_renderers", description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=None, help="comma-separated renderer or template names (default: all)")
    ap.add_argument("--turns", type=int, default=40, help="turns of the synthetic episode timed (default 40)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each timed pass (default 3)")
    ap.add_argument("--trajectories", default=None, help="folder (default <shared>/trajectories)")
    ap.add_argument("--episodes", type=int, default=TRAJECTORY_EPISODES, help=f"episodes per trajectory file (default {TRAJECTORY_EPISODES}; 0: none)")
    ap.add_argument("--no-speed", action="store_true", help="correctness only")
    ap.add_argument("--episode", default=None, metavar="FILE",
                    help="time this conversation or trajectory file's first episode (or --select's) instead of the "
                         "synthetic one")
    ap.add_argument("--select", default=None, help="the episode of --episode to time (id or index)")
    args = ap.parse_args(argv)
    rd = require_renderers()
    shared = shared_dir()

    def say(msg: str) -> None:
        print(f"# {msg}", file=sys.stderr, flush=True)

    print(f"{PEER} {getattr(rd, '__version__', '?')} vs ctxkit, date {DATE.date().isoformat()} on every side")
    for name, why in NOT_COMPARED.items():
        print(f"not compared: {name}: {why}")
    chosen = pairs(args.families.split(",") if args.families else None)
    rows, speeds = [], []
    with LoadMeter() as load, tempfile.TemporaryDirectory(prefix="ctxkit-peer-") as root:
        trajs = trajectory_cases(args.trajectories or shared / "trajectories", args.episodes, progress=say)
        for pair in chosen:
            say(f"{pair.renderer} / {pair.family}")
            sides = load_sides(pair, shared, Path(root))
            rows.append(correctness(sides, trajs))
            if not args.no_speed:
                def ref(messages, tools, agp, sides=sides):
                    return reference_ids(sides, messages, tools, agp)

                try:
                    source = _source(args, sides)
                except CtxkitError as exc:  # ctxkit cannot cut the episode through this template: said, not raised
                    speeds.append(peer_episodes.EpisodeSpeed(pair, 0, 0, args.repeats, errors={
                        "episode": f"{type(exc).__name__}: {exc}"[:300]}, episode=Path(args.episode).name))
                    continue
                speeds.append(peer_episodes.episode_speed(sides, ref, turns=args.turns, repeats=args.repeats,
                                                          template_kwargs={"date_string": DATE_STRING},
                                                          source=source, progress=say))
    print(correctness_table(rows))
    if speeds:
        print()
        print(peer_episodes.speed_table(speeds))
    print(f"wall {load.wall:.0f} s, {load}")
    return 0


__all__ = ["Case", "CorrectnessRow", "DATE", "DATE_STRING", "NOT_COMPARED", "PEER", "PEER_FAMILIES", "PEER_TOKENS",
           "PEER_VERSION", "PairSides", "PeerPair", "SHARED_QWEN3", "SideCount", "correctness", "correctness_table",
           "count_mismatches", "ctxkit_ids", "generated_cases", "load_sides", "main", "pairs", "peer_ids",
           "reference_ids", "require_renderers", "spec_of", "tokenizer_folder", "trajectory_cases"]

if __name__ == "__main__":
    sys.exit(main())
