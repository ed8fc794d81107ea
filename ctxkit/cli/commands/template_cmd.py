"""`ctxkit template check` and `ctxkit template list` (thin)."""

from __future__ import annotations

import argparse
import sys
from ctxkit.cli.commands.argtypes import add_render_options


def register_template(subparsers) -> None:
    """Add `ctxkit template check --tokenizer T [--template S] [--json]` and `ctxkit template list`."""
    parser = subparsers.add_parser("template", help="check or list chat templates",
                                   description="Check a chat template's properties, or list ctxkit's templates.")
    sub = parser.add_subparsers(dest="template_command", metavar="ACTION", required=True)
    check = sub.add_parser(
        "check", help="probe a template: prefix preservation, tool support, end-of-turn token, BOS risk",
        description="Render probe conversations through a template and report: prefix-preserving (per role "
                    "transition), tool support, the end-of-turn token, BOS duplication risk, generation markers, "
                    "default system prompt.")
    add_render_options(check, purpose="check with", default="shared qwen2.5-instruct")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(func=_check)
    listing = sub.add_parser("list", help="list ctxkit's versioned templates",
                             description="List the templates shipped with ctxkit (name-vN and sha256).")
    listing.set_defaults(func=_list)


def _check(args: argparse.Namespace) -> int:
    import orjson  # lazy: per command: keeps `ctxkit --help` fast

    from ctxkit.cli.commands.render_cmd import default_tokenizer  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.text.template.check import check_template  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.text.tokenizer.loader import load_tokenizer  # lazy: per command: keeps `ctxkit --help` fast

    spec, template = args.tokenizer, args.template
    if spec is None:
        spec, default_template = default_tokenizer()
        template = template or default_template
    report = check_template(load_tokenizer(spec), template)
    if args.json:
        sys.stdout.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    from rich.console import Console  # lazy: per command: keeps `ctxkit --help` fast
    from rich.table import Table  # lazy: per command: keeps `ctxkit --help` fast

    table = Table(title=f"template {report.template_id} with tokenizer {report.tokenizer_id}", title_justify="left")
    table.add_column("property")
    table.add_column("value")
    for key, value in report.to_dict().items():
        if key in ("template_id", "tokenizer_id"):
            continue
        if isinstance(value, bool):
            shown = "[green]yes[/]" if value else "[red]no[/]"
        elif isinstance(value, (list, tuple)):
            shown = ", ".join(value) or "-"
        else:
            shown = "-" if value is None else repr(value)
        table.add_row(key, shown)
    Console(highlight=False).print(table)
    return 0


def _list(args: argparse.Namespace) -> int:
    from ctxkit.text.template.chat_template import template_manifest  # lazy: per command: keeps `ctxkit --help` fast

    _, manifest = template_manifest()
    for name in sorted(manifest):
        entry = manifest[name]
        print(f"{name}  sha256:{entry['sha256'][:16]}  {entry.get('description', '')}")
    return 0
