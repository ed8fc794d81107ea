"""`ctxkit render` (JSON out) and `ctxkit inspect` (a colored terminal view) (thin)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ctxkit.cli.commands.argtypes import add_render_options, non_negative_int
from ctxkit.cli.commands.token_view import LEGEND, ROLE_STYLES, drift_summary, print_drifts, print_tokens


HISTORY_CHOICES = ("sampled", "template")
"""`--history` values: `ctxkit.text.rendering.output.HISTORY_MODES` (kept literal so `--help` imports nothing)."""


def default_tokenizer() -> tuple[str, str | None]:
    """`(tokenizer spec, template spec)` used when none is given: the shared Qwen2.5 tokenizer with its own
    template, else `tiktoken:o200k_base` with `chatml-tools-v1`."""
    from ctxkit.text.tokenizer.loader import shared_dir  # lazy: per command: keeps `ctxkit --help` fast

    qwen = shared_dir() / "tokenizers" / "qwen2.5-instruct"
    if qwen.is_dir():
        return str(qwen), None
    return "tiktoken:o200k_base", "chatml-tools-v1"


def bundled_example() -> Path:
    """Path of the bundled example conversation."""
    from importlib.resources import files  # lazy: per command: keeps `ctxkit --help` fast

    return Path(str(files("ctxkit_examples").joinpath("agent_episode.json")))


def load_messages(path: str | Path) -> tuple[list[dict], list[dict] | None]:
    """Messages and tools from a conversation JSON (`{"messages", "tools"}` or a bare list) or a `.jsonl` log.

    A conversation JSON is validated exactly as `ctxkit import` validates it (`import_conversation`), and
    must hold at least one message; errors are `MessageFormatError`s naming the file and the message."""
    from ctxkit.errors import MessageFormatError  # lazy: per command: keeps `ctxkit --help` fast

    path = Path(path)
    if path.suffix == ".jsonl":
        from ctxkit.events import Message, Step, ToolResult  # lazy: per command: keeps `ctxkit --help` fast
        # lazy: per command: keeps `ctxkit --help` fast
        from ctxkit.log.event_log import export_conversation, export_messages, read_events

        events = read_events(path)  # read only: no lock file, no write handle on an input
        messages = export_messages(events)
        # sampled steps keep their token ids (token-in-token-out); export_messages lists one message per
        # Message, Step and ToolResult event, in order
        chat_events = [e for e in events if isinstance(e, (Message, Step, ToolResult))]
        for event, message in zip(chat_events, messages):
            if isinstance(event, Step) and event.token_ids:
                message["token_ids"] = list(event.token_ids)
        if not messages:
            raise MessageFormatError(f"{path}: the log holds no messages to render")
        return messages, export_conversation(events).get("tools") or None
    # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.log.event_log import import_conversation, load_conversation

    obj = load_conversation(path)
    try:
        import_conversation(obj)  # the one validator of conversations (same errors as `ctxkit import`)
    except MessageFormatError as exc:
        raise MessageFormatError(f"{path}: {exc}") from None
    messages, tools = (obj, None) if isinstance(obj, list) else (obj["messages"], obj.get("tools") or None)
    if not messages:
        raise MessageFormatError(f"{path}: the conversation holds no messages to render")
    return messages, tools


def _resolve(args: argparse.Namespace):
    from ctxkit.text.template.chat_template import load_template  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.text.tokenizer.loader import load_tokenizer  # lazy: per command: keeps `ctxkit --help` fast

    spec, template = args.tokenizer, args.template
    kwargs = template_kwargs(args.template_kwarg)
    if isinstance(template, str) and template.startswith("vendor:"):  # a vendor renderer: its own vocabulary
        if kwargs or args.history != "sampled":
            from ctxkit.errors import ConfigError  # lazy: per command: keeps `ctxkit --help` fast

            raise ConfigError(f"--template {template}: --template-kwarg and --history apply to chat templates only")
        return (load_tokenizer(spec) if spec is not None else None), template
    if spec is None:
        spec, default_template = default_tokenizer()
        template = template or default_template
    tok = load_tokenizer(spec)
    loaded = load_template(template, tok)
    if kwargs:
        from ctxkit.text.template.chat_template import with_kwargs  # lazy: per command: keeps `ctxkit --help` fast

        loaded = with_kwargs(loaded, kwargs)
    return tok, loaded


def template_kwargs(pairs: list[str] | None) -> dict[str, Any]:
    """`--template-kwarg KEY=VALUE` pairs as template variables (VALUE read as JSON, else kept as text);
    `ConfigError` for a pair without `=` or a key given twice."""
    import json  # lazy: per command: keeps `ctxkit --help` fast

    from ctxkit.errors import ConfigError  # lazy: per command: keeps `ctxkit --help` fast

    out: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ConfigError(f"--template-kwarg {pair!r}: expected KEY=VALUE with KEY a template variable name")
        if key in out:
            raise ConfigError(f"--template-kwarg {key}: given more than once")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def _render(args: argparse.Namespace):
    from ctxkit.errors import MessageFormatError, RenderError  # lazy: per command: keeps `ctxkit --help` fast
    from ctxkit.text.rendering.renderer import render  # lazy: per command: keeps `ctxkit --help` fast

    messages, tools = load_messages(args.file)
    tok, tpl = _resolve(args)
    try:
        return render(messages, tok, tpl, tools=tools, add_generation_prompt=args.add_generation_prompt,
                      history=args.history), tok
    except (MessageFormatError, RenderError) as exc:
        raise type(exc)(f"{args.file}: {exc}") from None


def _add_common(parser: argparse.ArgumentParser, *, file_required: bool) -> None:
    if file_required:
        parser.add_argument("file", metavar="FILE", help="conversation JSON ({messages, tools} or a list) or a .jsonl log")
    else:
        parser.add_argument("file", metavar="FILE", nargs="?", default=None,
                            help="conversation JSON or .jsonl log (default: the bundled example)")
    add_render_options(parser, default="shared qwen2.5-instruct, else tiktoken:o200k_base")
    parser.add_argument("--add-generation-prompt", action="store_true", help="end with the assistant generation prompt")
    parser.add_argument("--template-kwarg", action="append", metavar="KEY=VALUE",
                        help="a template variable, as apply_chat_template(**kwargs) passes it (VALUE as JSON, e.g. "
                             "preserve_thinking=true); a distinct template id; repeatable")
    parser.add_argument("--history", choices=HISTORY_CHOICES, default="sampled",
                        help="past sampled turns: their sampled ids (default) or as the template renders them")


def register_render(subparsers) -> None:
    """Add `ctxkit render FILE --tokenizer T [--template S] [--add-generation-prompt]`."""
    parser = subparsers.add_parser(
        "render", help="render a conversation to token ids, loss mask and roles (JSON)",
        description="Render a conversation through a chat template and tokenizer; print token_ids, loss_mask, "
                    "roles, spans, hash, template_id and drifts as JSON.")
    _add_common(parser, file_required=True)
    parser.add_argument("--indent", action="store_true", help="indent the JSON")
    parser.set_defaults(func=_render_main)


def _render_main(args: argparse.Namespace) -> int:
    import orjson  # lazy: per command: keeps `ctxkit --help` fast

    ctx, _ = _render(args)
    out: dict[str, Any] = {
        "token_ids": list(ctx.token_ids),
        "loss_mask": list(ctx.loss_mask),
        "roles": list(ctx.roles),
        "spans": [{"index": s.index, "role": s.role, "start": s.start, "end": s.end} for s in ctx.spans],
        "hash": ctx.hash,
        "template_id": ctx.template_id,
        "tokenizer_id": ctx.tokenizer_id,
        "prefix_preserving": ctx.prefix_preserving,
        "drifts": [{"message_index": d.message_index, "position": d.position, "sampled_ids": list(d.sampled_ids),
                    "rendered_ids": list(d.rendered_ids), "reason": d.reason} for d in ctx.drifts],
    }
    sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2 if args.indent else 0).decode() + "\n")
    return 0


def register_inspect(subparsers) -> None:
    """Add `ctxkit inspect [FILE] [--tokenizer T] [--template S]`."""
    parser = subparsers.add_parser(
        "inspect", help="show a rendered conversation token by token, colored by role",
        description="Show a rendered conversation in the terminal: tokens colored by role, loss-masked tokens "
                    "bold and underlined, special tokens boxed, a per-role token count, and each drift of a "
                    "sampled turn with its reason.")
    _add_common(parser, file_required=False)
    parser.add_argument("--max-tokens", type=non_negative_int, default=None, metavar="N", help="show only the first N tokens")
    parser.set_defaults(func=_inspect_main)


def _inspect_main(args: argparse.Namespace) -> int:
    from collections import Counter  # lazy: per command: keeps `ctxkit --help` fast

    from rich.console import Console  # lazy: per command: keeps `ctxkit --help` fast
    from rich.table import Table  # lazy: per command: keeps `ctxkit --help` fast
    from rich.text import Text  # lazy: per command: keeps `ctxkit --help` fast

    if args.file is None:
        args.file = str(bundled_example())
    if args.tokenizer is None and str(args.template or "").startswith("vendor:"):
        from ctxkit.errors import ConfigError  # lazy: per command: keeps `ctxkit --help` fast

        raise ConfigError(f"ctxkit inspect --template {args.template} needs --tokenizer: the vendor's vocabulary as a "
                          "ctxkit tokenizer (tiktoken:o200k_harmony for harmony, the Mistral v0.3 folder for mistral-v3)")
    ctx, tok = _render(args)
    console = Console(highlight=False)
    print_tokens(console, tok, ctx.token_ids, ctx.roles, ctx.loss_mask, args.max_tokens)
    counts = Counter(ctx.roles)
    masked = Counter(r for r, m in zip(ctx.roles, ctx.loss_mask) if m)
    table = Table(title=f"{Path(args.file).name}: {len(ctx.token_ids)} tokens", title_justify="left")
    table.add_column("role")
    table.add_column("tokens", justify="right")
    table.add_column("loss-masked", justify="right")
    for role in ROLE_STYLES:
        if counts.get(role):
            table.add_row(Text(role, style=ROLE_STYLES[role]), str(counts[role]), str(masked.get(role, 0)))
    table.add_row("total", str(len(ctx.token_ids)), str(sum(ctx.loss_mask)))
    console.print(table)
    console.print(f"tokenizer {ctx.tokenizer_id}  ·  template {ctx.template_id}  ·  "
                  f"prefix-preserving {'yes' if ctx.prefix_preserving else 'no'}  ·  drifts {drift_summary(ctx.drifts)}", soft_wrap=True)
    print_drifts(console, tok, ctx.drifts)
    console.print(f"hash {ctx.hash}")
    console.print(LEGEND)
    return 0
