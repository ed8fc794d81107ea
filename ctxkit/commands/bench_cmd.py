"""`ctxkit bench render` and `ctxkit bench build` (L5, thin)."""

from __future__ import annotations

import argparse
import sys

from ctxkit.commands.argtypes import positive_int


def register_bench(subparsers) -> None:
    """Add `ctxkit bench render ...` and `ctxkit bench build ...`."""
    parser = subparsers.add_parser("bench", help="benchmarks (rendering, context building)",
                                   description="Benchmarks. Speed is measured here, never in tests.")
    sub = parser.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    render = sub.add_parser(
        "render", help="incremental rendering vs apply_chat_template every turn",
        description="Build a long agent episode turn by turn and time ctxkit's incremental render, "
                    "apply_chat_template(tokenize=True) re-rendered every turn, and encoding only the new text; "
                    "checks the ids are identical at every turn.")
    render.add_argument("--turns", type=positive_int, default=200, help="turns in the episode (default 200)")
    render.add_argument("--tokenizer", metavar="PATH", default=None,
                        help="Hugging Face tokenizer folder (default: shared qwen2.5-instruct)")
    render.add_argument("--template", metavar="S", default=None, help="template (default: the tokenizer's own)")
    render.add_argument("--repeats", type=positive_int, default=3, help="repeats; medians are reported (default 3)")
    render.add_argument("--json", action="store_true", help="print the figures as JSON")
    render.set_defaults(func=_render)
    build = sub.add_parser(
        "build", help="context building with each compressor over a long episode",
        description="Time context building with compressors over a long episode (see ctxkit.benchmarks.build_bench).")
    build.add_argument("--turns", type=positive_int, default=200, help="turns in the episode (default 200)")
    build.add_argument("--budget", type=positive_int, default=16000, help="token budget (default 16000)")
    build.add_argument("--tokenizer", metavar="PATH", default=None, help="tokenizer (default: shared qwen2.5-instruct)")
    build.add_argument("--compressors", default=None, help="comma-separated compressor specs (default: all)")
    build.add_argument("--repeats", type=positive_int, default=3, help="repeats (default 3)")
    build.add_argument("--json", action="store_true", help="print the figures as JSON")
    build.set_defaults(func=_build)


def _render(args: argparse.Namespace) -> int:
    import orjson

    from ctxkit.benchmarks.render_bench import run
    from ctxkit.tokenizers import shared_dir

    spec = args.tokenizer or str(shared_dir() / "tokenizers" / "qwen2.5-instruct")
    progress = None
    if not args.json:
        from rich.console import Console

        console = Console(stderr=True, highlight=False)
        progress = lambda msg: console.print(f"[grey50]{msg}[/]")  # noqa: E731
    result = run(spec, turns=args.turns, repeats=args.repeats, template=args.template, progress=progress)
    if args.json:
        sys.stdout.write(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"bench render: {result.turns} turns, {result.final_tokens} tokens in the last context, "
                            f"median of {result.repeats}", title_justify="left")
        table.add_column("method")
        table.add_column("total s", justify="right")
        table.add_column("per turn ms", justify="right")
        table.add_column("vs ctxkit", justify="right")
        rows = [("ctxkit IncrementalRenderer", result.ctxkit_s),
                ("apply_chat_template(tokenize=True) every turn", result.apply_chat_template_s),
                ("encode only the new text", result.encode_new_text_s)]
        for name, secs in rows:
            table.add_row(name, f"{secs:.3f}", f"{1000 * secs / result.turns:.2f}", f"{secs / result.ctxkit_s:.2f}x")
        console = Console(highlight=False)
        console.print(table)
        console.print(f"ctxkit speedup vs apply_chat_template: {result.speedup_vs_apply:.1f}x; "
                      f"ctxkit / encode-new-text: {result.overhead_vs_encode:.1f}x")
        console.print(f"ids identical: {'yes' if result.ids_identical else 'NO'}")
        console.print(f"tokenizer {result.tokenizer}  ·  template {result.template}")
    return 0 if result.ids_identical else 1


def _build(args: argparse.Namespace) -> int:
    from ctxkit.benchmarks.build_bench import main

    return int(main(args) or 0)
