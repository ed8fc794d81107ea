"""`ctxkit bench render` and `ctxkit bench build` (thin)."""

from __future__ import annotations

import argparse
import sys

from ctxkit.cli.commands.argtypes import add_render_options, positive_int


def register_bench(subparsers) -> None:
    """Add `ctxkit bench render ...` and `ctxkit bench build ...`."""
    parser = subparsers.add_parser("bench", help="benchmarks (rendering, context building)",
                                   description="Benchmarks. Speed is measured here, never in tests.")
    sub = parser.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    render = sub.add_parser(
        "render", help="incremental rendering vs apply_chat_template every turn",
        description="Replay an episode turn by turn and time ctxkit's incremental render, "
                    "apply_chat_template(tokenize=True) re-rendered every turn, and encoding only the new text: "
                    "whole-episode totals, ratios, p50/p90/p99/max per turn; ids compared at every turn.")
    render.add_argument("--turns", type=positive_int, default=None,
                        help="turns in the episode (default 200; 40 with --peer)")
    add_render_options(render, purpose="render with", default="shared qwen2.5-instruct")
    render.add_argument("--repeats", type=positive_int, default=3, help="repeats; per-turn medians (default 3)")
    _episode_args(render)
    render.add_argument("--json", action="store_true", help="print the figures as JSON")
    render.add_argument("--peer", choices=["renderers"], default=None,
                        help="side by side with PrimeIntellect's renderers (the bench extra) on every family both "
                             "support: ids vs apply_chat_template on generated conversations and ../shared/trajectories, "
                             "and whole episodes turn by turn vs its bridge, TRL's GRPO concatenation and encode-only "
                             "(ctxkit.benchmarks.peer_renderers; --turns, --repeats apply)")
    render.add_argument("--families", default=None,
                        help="with --peer: comma-separated renderers or TRL template names (default: all)")
    render.set_defaults(func=_render)
    build = sub.add_parser(
        "build", help="context building with each compressor over a long episode",
        description="Build a context before every assistant turn of an episode with each compressor, and with "
                    "LangChain trim_messages + apply_chat_template, and time encoding only the new text; report per "
                    "arm the whole-episode total, its ratio to LangChain and to encode-only, p50/p90/p99/max per "
                    "build and compactions (see ctxkit.benchmarks.build_bench).")
    build.add_argument("--turns", type=positive_int, default=200, help="turns in the synthetic episode (default 200)")
    budget = build.add_mutually_exclusive_group()
    budget.add_argument("--budget", type=positive_int, default=None,
                        help="token budget (default 16000 for the synthetic episode)")
    budget.add_argument("--budget-fraction", type=float, default=None, metavar="F",
                        help="budget as a fraction of each episode's full length (default 0.5 with --episode or "
                             "--trajectories); raised in 256-token steps where the fixed prefix + newest turn "
                             "does not fit")
    build.add_argument("--tokenizer", metavar="PATH", default=None, help="tokenizer (default: shared qwen2.5-instruct)")
    arms = build.add_mutually_exclusive_group()
    arms.add_argument("--compressors", default=None,
                      help="comma-separated compressor specs (default: window,mask-observations)")
    arms.add_argument("--all", action="store_true",
                      help="every registered compressor (summarize/retrieve load models: slow, reported apart)")
    build.add_argument("--repeats", type=positive_int, default=3, help="repeats; per-build medians (default 3)")
    _episode_args(build)
    build.add_argument("--trajectories", nargs="?", const="", default=None, metavar="FOLDER",
                       help="run over every trajectory file in FOLDER (default ../shared/trajectories), a spread of "
                            "episodes per file, at --budget-fraction (default 0.5); one table")
    build.add_argument("--json", action="store_true", help="print the figures as JSON")
    build.set_defaults(func=_build)
    log = sub.add_parser("log", help="EventLog append rates against bare loops",
                         description="Time EventLog appends (durability none/batch/always, extend), in both lock "
                                     "modes (append: a lock per write; writer: held from open to close), beside a bare "
                                     "orjson+sha256 chained loop and a bare write+fsync loop (ctxkit.benchmarks.log_bench).")
    log.add_argument("--events", type=positive_int, default=20000, help="events per arm (default 20000)")
    log.add_argument("--fsync-events", type=positive_int, default=None,
                     help="events for the fsync-per-event arms (default min(events, 2000))")
    log.add_argument("--dir", default=None, help="folder to write the logs in (default: the system temp folder)")
    log.add_argument("--rounds", type=positive_int, default=1,
                     help="run every arm this many times, interleaved, keeping each arm's best (default 1)")
    log.add_argument("--json", action="store_true", help="print the figures as JSON")
    log.set_defaults(func=_bench_log)


def _bench_log(args: argparse.Namespace) -> int:
    from ctxkit.benchmarks.log_bench import main  # lazy: per command: keeps `ctxkit --help` fast

    return main(args)


def _episode_args(parser) -> None:
    parser.add_argument("--episode", metavar="FILE", default=None,
                        help="run on this conversation or trajectory file (any `ctxkit import` format) instead of "
                             "the synthetic episode; its assistant turns are the decision points")
    parser.add_argument("--select", metavar="S", default=None,
                        help="episodes of a multi-episode --episode file: ids, indexes or A:B ranges, comma-separated")
    parser.add_argument("--tools", metavar="FILE", default=None, help="tool schemas for --episode (a JSON list)")


def _setup(args: argparse.Namespace):
    from ctxkit.errors import ConfigError  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.text.template.chat_template import load_template  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.text.tokenizer.loader import load_tokenizer, shared_dir  # lazy: per command: keeps `ctxkit --help` fast

    if args.episode is None and (args.select is not None or args.tools is not None):
        raise ConfigError("--select and --tools apply to --episode FILE; give the file")
    tok = load_tokenizer(args.tokenizer or str(shared_dir() / "tokenizers" / "qwen2.5-instruct"))
    tpl = load_template(getattr(args, "template", None), tok)
    return tok, tpl


def _workloads(args: argparse.Namespace, tok, tpl) -> list:
    # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.benchmarks.workload import episode_workloads, synthetic_workload

    if args.episode is None:
        return [synthetic_workload(args.turns, tok, tpl)]
    return episode_workloads(args.episode, tok, tpl, select=args.select, tools_file=args.tools)


def _progress(args: argparse.Namespace):
    if args.json:
        return None
    from rich.console import Console  # lazy: per command: keeps `ctxkit --help` fast

    console = Console(stderr=True, highlight=False)
    return lambda msg: console.print(f"[grey50]{msg}[/]", markup=True, soft_wrap=True)  # noqa: E731


def _dump(obj) -> None:
    import orjson  # lazy: per command: keeps `ctxkit --help` fast

    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")


def _render(args: argparse.Namespace) -> int:
    from ctxkit.benchmarks.bench_tables import render_table  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.benchmarks.render_bench import run_workload  # lazy: per command: keeps `ctxkit --help` fast

    if args.peer:
        from ctxkit.benchmarks import peer_renderers  # lazy: per command: keeps `ctxkit --help` fast

        argv = ["--turns", str(args.turns or 40), "--repeats", str(args.repeats)]
        return peer_renderers.main(argv + (["--families", args.families] if args.families else []))
    if args.turns is None:
        args.turns = 200
    tok, tpl = _setup(args)
    results = [run_workload(tok, tpl, wl, repeats=args.repeats, progress=_progress(args))
               for wl in _workloads(args, tok, tpl)]
    if args.json:
        _dump(results[0].to_dict() if args.episode is None else [r.to_dict() for r in results])
    else:
        print("\n\n".join(render_table(r) for r in results))
    return 0 if all(r.ids_identical for r in results) else 1


def _compressor_names(args: argparse.Namespace) -> tuple[str, ...]:
    from ctxkit.benchmarks.build_bench import DEFAULT_COMPRESSORS  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.context.compress import COMPRESSORS, compressor_class  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.errors import ConfigError  # lazy: per command: keeps `ctxkit --help` fast

    if args.all:
        return tuple(COMPRESSORS)
    if args.compressors is None:
        return DEFAULT_COMPRESSORS
    names = tuple(n.strip() for n in args.compressors.split(",") if n.strip())
    if not names:
        raise ConfigError(f"--compressors {args.compressors!r}: no compressor named; give comma-separated "
                          "names (see `ctxkit compressors`)")
    for name in names:
        compressor_class(name)  # an unknown name fails here, before any episode is built
    return names


def _build(args: argparse.Namespace) -> int:
    from ctxkit.benchmarks import build_bench  # lazy: per command: keeps `ctxkit --help` fast
    # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.benchmarks.bench_tables import build_table, trajectories_table
    from ctxkit.benchmarks.workload import budget_from_fraction  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.errors import ConfigError  # lazy: per command: keeps `ctxkit --help` fast

    names = _compressor_names(args)
    build_bench.require_langchain()
    fraction = args.budget_fraction
    if fraction is not None and not 0 < fraction <= 1:
        raise ConfigError(f"--budget-fraction {fraction}: expected a fraction in (0, 1]")
    if args.trajectories is not None:
        if args.episode is not None or args.budget is not None:
            raise ConfigError("--trajectories runs every file at --budget-fraction; drop --episode and --budget")
        from ctxkit.benchmarks import trajectories_bench  # lazy: per command: keeps `ctxkit --help` fast
        from ctxkit.text.tokenizer.loader import shared_dir  # lazy: per command: keeps `ctxkit --help` fast

        folder = args.trajectories or str(shared_dir() / "trajectories")
        rows = trajectories_bench.run(args.tokenizer or str(shared_dir() / "tokenizers" / "qwen2.5-instruct"), folder,
                                      fraction=fraction or 0.5, compressors=names, repeats=args.repeats,
                                      progress=_progress(args))
        if args.json:
            _dump(rows)
        else:
            print(trajectories_table(rows))
        for name in trajectories_bench.skipped_files(folder):
            print(f"skipped {name}: its format has no importer yet", file=sys.stderr)
        return 0 if all(not r["over_budget"] and r["ids_identical"] is not False
                        for r in rows if r["kind"].startswith("ctxkit")) else 1
    tok, tpl = _setup(args)
    if fraction is None and args.budget is None and args.episode is not None:
        fraction = 0.5
    results = []
    for wl in _workloads(args, tok, tpl):
        if fraction is not None:
            budget, note = budget_from_fraction(wl, tok, tpl, fraction, build_bench.fits_with(tok, tpl, "window", wl))
        else:
            budget, note = args.budget or 16_000, "given" if args.budget else "default"
        results.append(build_bench.run_workload(tok, tpl, wl, budget=budget, budget_note=note, compressors=names,
                                                repeats=args.repeats, progress=_progress(args)))
    if args.json:
        _dump(results[0].to_dict() if args.episode is None else [r.to_dict() for r in results])
    else:
        print("\n\n".join(build_table(r) for r in results))
    return 0 if all(r.ok for r in results) else 1
