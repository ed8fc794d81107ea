"""`ctxkit view PATH... (-o out.html | --serve [--port N])`: the context viewer (thin).

Builds one self-contained HTML page (`ctxkit.viewer.build_page`) from episode logs, folders of logs or
run folders from `ctxkit ablate`, and writes it or serves it on 127.0.0.1 only. A log that cannot be read
is a warning on stderr and a failed episode on the page; the exit status is 0 while at least one episode
loaded (2, with the first log's error, when none did).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ctxkit.cli.commands.argtypes import add_recorded_overrides, non_negative_int
from ctxkit.cli.commands.outputs import add_force, refuse_existing


def register_view(subparsers: Any) -> None:
    """Add `ctxkit view`."""
    p = subparsers.add_parser(
        "view",
        help="one self-contained HTML page showing what the policy saw (episodes, compactions, run grids)",
        description="Render episode logs, folders of logs or an ablation run folder as one self-contained HTML "
        "page (styles, scripts, data and plots inline; no network): every step's exact context replayed from "
        "the log and colored by provenance, compactions before/after, the run's arms x tasks grid and arm diffs.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="episode log(s) (.jsonl), folders of logs, or a run folder")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("-o", "--output", metavar="OUT.html", help="write the page to this file")
    mode.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 until Ctrl-C")
    p.add_argument("--port", type=non_negative_int, default=8765, metavar="N",
                   help="with --serve: port on 127.0.0.1 (default 8765; 0 picks a free one)")
    add_recorded_overrides(p)
    add_force(p)
    p.set_defaults(func=_view)


def _view(args: argparse.Namespace) -> int:
    from ctxkit.errors import ConfigError  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.viewer import HOST, build_page, serve_page, write_page  # lazy: per command: keeps `ctxkit --help` fast

    if args.output is not None and not args.output.lower().endswith((".html", ".htm")):
        raise ConfigError(f"-o {args.output}: expected an .html file name")
    if args.output is not None:
        refuse_existing(args.output, "-o", args.force)
    page = build_page(args.paths, tokenizer=args.tokenizer, template=args.template)
    what = _describe(page)
    if args.output is not None:
        write_page(page, args.output)
        print(f"{args.output}: {what}")
        return 0
    server = serve_page(page, args.port)
    print(f"serving http://{HOST}:{server.server_address[1]}/ ({what}); Ctrl-C to stop", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        raise  # `main` reports the interrupt and exits 130, as for every command
    finally:
        server.server_close()
    return 0


def _describe(page: Any) -> str:
    """The summary of a built page; a warning on stderr for each log that could not be read."""
    for error in page.failed:
        print(f"ctxkit: warning: {error} (shown on the page as an episode that could not be read)", file=sys.stderr)
    failed = f" ({len(page.failed)} could not be read)" if page.failed else ""
    return (f"{page.n_episodes} episode(s){failed}, {page.n_steps} steps; {page.n_tokens_shown:,} context tokens stored as "
            f"{page.n_segments:,} distinct segments ({page.n_tokens_stored:,} tokens); {page.size / 1e6:.2f} MB")
