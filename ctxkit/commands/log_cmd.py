"""`ctxkit log verify`, `ctxkit import`, `ctxkit export`: check, create and read episode logs (L5, thin)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

import orjson

from ctxkit.errors import MessageFormatError


def register_log(subparsers) -> None:
    """Add `ctxkit log verify PATH [--repair] [--json]`."""
    parser = subparsers.add_parser("log", help="check and repair episode logs",
                                   description="Check and repair episode logs.")
    sub = parser.add_subparsers(dest="log_command", metavar="ACTION", required=True)
    verify = sub.add_parser("verify", help="verify a log's header, hash chain and last line",
                            description="Verify a log's header, hash chain and last line. Exit 0 only for an "
                                        "intact log, 1 when problems remain, 2 on errors.")
    verify.add_argument("path", metavar="PATH", help="the log file (.jsonl)")
    verify.add_argument("--repair", action="store_true",
                        help="fix a torn last line first (removed bytes go to PATH.torn), then verify again")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(func=_verify)


def _verify(args: argparse.Namespace) -> int:
    from ctxkit.log import repair, verify

    report = verify(args.path)
    repaired = None
    only_torn = report.torn_tail and all(p.code == "torn" for p in report.problems)
    if args.repair and only_torn:
        repaired = repair(args.path)
        report = verify(args.path)
    if args.json:
        out = report.to_dict()
        out["repair"] = None if repaired is None else dataclasses.asdict(repaired)
        sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        if repaired is not None:
            if repaired.completed_line:
                print("repaired: completed the last line (it lacked only its newline)")
            else:
                print(f"repaired: removed a torn last line of {repaired.removed_bytes} bytes "
                      f"(kept in {repaired.side_file})")
        for problem in report.problems:
            print(f"{report.path}:{problem.line}: [{problem.code}] {problem.message}")
        if report.ok:
            print(f"ok: {report.path}: {report.n_events} events, hash chain intact")
        elif args.repair and not only_torn:
            print("not repaired: only a torn last line can be repaired; the problems above need a person")
    return 0 if report.ok else 1


def register_import(subparsers) -> None:
    """Add `ctxkit import FILE.json -o LOG`."""
    parser = subparsers.add_parser(
        "import", help="turn an OpenAI-format conversation into an episode log",
        description='Turn an OpenAI-format conversation ({"messages", "tools", "pins"} or a bare message list) '
                    "into a new episode log.")
    parser.add_argument("file", metavar="FILE.json", help="the conversation JSON file")
    parser.add_argument("-o", "--output", required=True, metavar="LOG", help="the log to create (must not exist)")
    parser.add_argument("--episode-id", default=None, help="episode id (default: a fresh random one)")
    parser.set_defaults(func=_import)


def _import(args: argparse.Namespace) -> int:
    from ctxkit.commands.outputs import atomic_output, check_output
    from ctxkit.errors import ConfigError
    from ctxkit.log import EventLog, import_conversation, load_conversation

    if args.episode_id is not None and (not args.episode_id.strip() or not args.episode_id.isprintable()):
        raise ConfigError(f"--episode-id {args.episode_id!r}: expected a non-empty, printable id")
    output = check_output(args.output, "-o", probe=True)
    if output.exists():
        raise ConfigError(f"-o {output}: already exists; the log to create must be a new file")
    obj = load_conversation(args.file)
    try:
        events = import_conversation(obj)
    except MessageFormatError as exc:
        raise MessageFormatError(f"{args.file}: {exc}") from None
    with atomic_output(output, "-o", replace=False) as tmp:  # the log appears whole or not at all
        with EventLog.create(tmp, episode_id=args.episode_id) as log:
            events[0] = dataclasses.replace(events[0], episode_id=log.episode_id)
            log.extend(events)
    print(f"wrote {len(events)} events to {output} (episode {log.episode_id})")
    return 0


def register_export(subparsers) -> None:
    """Add `ctxkit export LOG [--with-tools]`."""
    parser = subparsers.add_parser("export", help="print a log's messages as OpenAI-format JSON",
                                   description="Print a log's message list as OpenAI-format JSON.")
    parser.add_argument("log", metavar="LOG", help="the episode log")
    parser.add_argument("--with-tools", action="store_true",
                        help='print {"messages", "tools", "pins"} instead of the bare message list')
    parser.add_argument("--compact", action="store_true", help="one line of JSON instead of indented")
    parser.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from ctxkit.log import export_conversation, export_messages, read_events

    events = read_events(args.log)
    obj = export_conversation(events) if args.with_tools else export_messages(events)
    option = 0 if args.compact else orjson.OPT_INDENT_2
    sys.stdout.write(orjson.dumps(obj, option=option).decode() + "\n")
    return 0
