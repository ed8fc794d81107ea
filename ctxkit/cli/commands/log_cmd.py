"""`ctxkit log verify`, `ctxkit import`, `ctxkit export`: check, create (from conversations and recorded
trajectories, via `ctxkit.log.importers`) and read episode logs (thin)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import orjson

from ctxkit.cli.commands.argtypes import add_render_options
from ctxkit.cli.commands.outputs import add_force


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
    from ctxkit.log.event_log import repair, verify  # lazy: per command: keeps `ctxkit --help` fast

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
    """Add `ctxkit import FILE [--format F] (-o LOG | --out-dir DIR) [--select S] [--tools T] [--strict] [--tokenizer T]`."""
    parser = subparsers.add_parser(
        "import", help="turn a conversation or recorded trajectories into episode logs",
        description="Turn a conversation or another agent's recorded trajectories into episode logs: OpenAI/HF "
                    "chat, SWE-agent .traj, tau-bench results, Agent Data Protocol raw samples, mini-swe-agent "
                    ".traj.json, OpenHands event streams, tau2-bench results, ShareGPT SFT files, ADP standardized files (mappings: "
                    "docs/IMPORTERS.md). One episode goes to -o LOG; a file of many to --out-dir DIR, one log "
                    "per episode named by its entry id. A malformed episode is skipped and said on stderr "
                    "(--strict refuses the file instead).")
    parser.add_argument("file", metavar="FILE", help="the trajectory or conversation file (JSON, or JSONL read line by line)")
    parser.add_argument("--format", default="auto", choices=("auto", "openai", "swe-agent", "tau-bench", "adp",
                                                             "mini-swe-agent", "openhands", "tau2", "sharegpt", "adp-std"),
                        help="source format (default: auto, from the JSON shape)")
    parser.add_argument("--strict", action="store_true",
                        help="refuse the file at its first malformed episode instead of skipping it")
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("-o", "--output", metavar="LOG", help="the log to create for a one-episode selection (a new file "
                                                           "unless --force)")
    out.add_argument("--out-dir", metavar="DIR", help="folder for one log per episode, <entry id>.jsonl (new files only, "
                                                      "unless --force)")
    parser.add_argument("--select", metavar="ID[,ID]",
                        help="episodes to import: entry ids, indexes N or index ranges A:B, comma-separated")
    parser.add_argument("--tools", metavar="FILE", help="a JSON list of OpenAI tool schemas for the episodes "
                                                        "(replaces the file's own; tau-bench files have none)")
    add_render_options(parser, purpose="encode each assistant turn with, as an offline Step")
    parser.add_argument("--episode-id", default=None, help="episode id with -o (default: the source's entry id, "
                                                           "or a fresh random one)")
    add_force(parser)
    parser.set_defaults(func=_import)


def _import(args: argparse.Namespace) -> int:
    # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.cli.commands.outputs import check_output, refuse_existing, shown
    from ctxkit.errors import ConfigError  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.log.importers import import_file, read_tools  # lazy: per command: keeps `ctxkit --help` fast

    if args.episode_id is not None and (not args.episode_id.strip() or not args.episode_id.isprintable()):
        raise ConfigError(f"--episode-id {args.episode_id!r}: expected a non-empty, printable id")
    if args.episode_id is not None and args.out_dir is not None:
        raise ConfigError("--episode-id: only with -o (with --out-dir each log takes its entry id)")
    if args.template is not None and args.tokenizer is None:
        raise ConfigError("--template: only with --tokenizer")
    if args.output is not None:
        output = check_output(args.output, "-o", probe=True, force=args.force)
    else:
        out_dir = Path(args.out_dir)
        if out_dir.exists() and not out_dir.is_dir():
            raise ConfigError(f"--out-dir {out_dir}: is a file; expected a folder")
    tools = read_tools(args.tools) if args.tools is not None else None
    result = import_file(args.file, args.format, select=args.select, tools=tools, strict=args.strict)
    for skipped in result.skipped:
        print(f"ctxkit import: skipped episode #{skipped.index}: {skipped.reason}", file=sys.stderr)
    episodes = list(result.episodes)
    if args.output is not None and len(episodes) != 1:
        raise ConfigError(f"-o: {args.file} holds {len(episodes)} episodes; use --out-dir DIR, or --select one")
    offline = _offline_steps(args.tokenizer, args.template)
    if args.output is not None:
        episode = episodes[0]
        episode_id = args.episode_id if args.episode_id is not None else (episode.entry_id or None)
        n, episode_id = _write_log(output, "-o", episode, episode_id, offline, args.force)
        print(f"wrote {n} events to {shown(output)} (episode {episode_id})" + _skip_note(result.skipped))
        return 0
    targets = _out_paths(Path(args.out_dir), episodes)
    for path in targets:
        if path.is_dir():
            raise ConfigError(f"--out-dir: {shown(path)} is a folder; expected a log file path")
        refuse_existing(path, "--out-dir:", args.force)
    total = 0
    for episode, path in zip(episodes, targets):
        total += _write_log(path, "--out-dir", episode, episode.entry_id or None, offline, args.force)[0]
    print(f"wrote {len(episodes)} logs ({total} events) to {shown(args.out_dir)}" + _skip_note(result.skipped))
    return 0


def _skip_note(skipped) -> str:
    """`; skipped N malformed episodes (see stderr)` when any were, else empty."""
    return f"; skipped {len(skipped)} malformed episode{'s' if len(skipped) != 1 else ''} (see stderr)" if skipped else ""


def _offline_steps(tokenizer_spec, template_spec):
    """A function events -> events adding offline steps under the tokenizer/template, or None."""
    if tokenizer_spec is None:
        return None
    from ctxkit.training.offline_steps import add_offline_steps  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.text.template.chat_template import load_template  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.text.tokenizer.loader import load_tokenizer  # lazy: per command: keeps `ctxkit --help` fast

    tokenizer = load_tokenizer(tokenizer_spec)
    template = load_template(template_spec, tokenizer) if template_spec is not None else None
    return lambda events: add_offline_steps(events, tokenizer, template)


def _write_log(path: Path, option: str, episode, episode_id, offline, force: bool = False) -> tuple[int, str]:
    """Write one imported episode as a log (whole or not at all; an existing one is replaced only with
    `force`); (events written, episode id). The episode's metadata (the source path among it) is recorded
    as UTF-8 text: a file name that is not UTF-8 keeps its odd bytes as `\\xNN`."""
    from ctxkit.cli.commands.outputs import atomic_output, safe_text  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.log.event_log import EventLog  # lazy: per command: keeps `ctxkit --help` fast

    events = list(episode.events)
    with atomic_output(path, option, replace=force) as tmp:
        with EventLog.create(tmp, episode_id=episode_id) as log:
            events[0] = dataclasses.replace(events[0], episode_id=log.episode_id,
                                            metadata=safe_text(dict(events[0].metadata)))
            if offline is not None:
                events = offline(events)
            log.extend(events)
    return len(events), log.episode_id


def safe_file_stem(entry_id: str) -> str:
    """A file-name-safe form of an entry id: letters, digits, `.`, `_`, `-` kept, runs of others `_`,
    no leading dot, at most 120 characters."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", entry_id).lstrip(".")[:120]
    return stem or "episode"


def _out_paths(out_dir: Path, episodes) -> list[Path]:
    """`<out_dir>/<safe entry id>.jsonl` per episode (`episode-<index>` without an id; `-<index>` added to
    a name two episodes would share)."""
    stems = [safe_file_stem(e.entry_id) if e.entry_id else f"episode-{e.source.index}" for e in episodes]
    seen: dict[str, int] = {}
    for stem in stems:
        seen[stem.lower()] = seen.get(stem.lower(), 0) + 1
    return [out_dir / (f"{stem}-{e.source.index}.jsonl" if seen[stem.lower()] > 1 else f"{stem}.jsonl")
            for stem, e in zip(stems, episodes)]


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
    # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.log.event_log import export_conversation, export_messages, read_events

    events = read_events(args.log)
    obj = export_conversation(events) if args.with_tools else export_messages(events)
    option = 0 if args.compact else orjson.OPT_INDENT_2
    sys.stdout.write(orjson.dumps(obj, option=option).decode() + "\n")
    return 0
