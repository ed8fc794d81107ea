"""openai-harmony's renderer for gpt-oss as a vendor renderer (`vendor:harmony`, `vendor:harmony-keep-analysis`).

OpenAI messages become a harmony `Conversation`:

- a system message of harmony's defaults (model identity, knowledge cutoff, reasoning effort medium) with
  the conversation start date of `clock` (default `RENDER_CLOCK`, the date ctxkit's templates print);
- the first `system` (or `developer`) message's text as the developer message's instructions, and the tool
  schemas as its function tools (namespace `functions`);
- `user` -> a user message; `tool` -> a message from `functions.<name>` to the assistant on the commentary
  channel (the name from the message, else from the call it answers);
- an `assistant` message -> its `reasoning_content` on the analysis channel, then either its tool calls (each
  a commentary message to `functions.<name>`, content type `json`, its text before them as a commentary
  preamble) or its content on the final channel.

A conversation ending in an assistant final message without the generation prompt is rendered for
training (its last `<|end|>` becomes `<|return|>`, the token the model samples); with the generation prompt
the render ends in `<|start|>assistant`. harmony drops the analysis of turns a final message closed;
`harmony-keep-analysis` keeps it (harmony's `auto_drop_analysis=False`). The encoding, `o200k_harmony`,
is read offline (`oracle` module docstring).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from datetime import datetime
from importlib.metadata import version as dist_version
from typing import Any, Mapping, Sequence

from ctxkit.errors import ConfigError, TokenizerError, VendorRenderError
from ctxkit.text.chat_messages import message_text
from ctxkit.text.template.sandbox import RENDER_CLOCK
from ctxkit.text.tokenizer.hf_files import hash_files
from ctxkit.text.tokenizer.tiktoken_files import tiktoken_search_dirs

PACKAGE = "openai-harmony"
"""The distribution that renders."""
RANK_FILE = "o200k_base.tiktoken"
"""The rank file harmony's `o200k_harmony` encoding reads."""
ENCODINGS_ENV = "TIKTOKEN_ENCODINGS_BASE"
"""harmony's variable naming a folder that holds its rank files (read instead of downloading them)."""
DEFAULT_CLOCK: datetime = RENDER_CLOCK
"""The conversation start date harmony's system message gets by default: `RENDER_CLOCK`, the date ctxkit's
chat templates print (so TRL's gpt-oss template and harmony agree on it)."""

SECTIONS: tuple[tuple[str, str], ...] = (
    ("<|start|>system", "system header"), ("<|start|>developer", "developer (instructions, tools)"),
    ("<|start|>user", "user text"), ("<|start|>assistant", "assistant header"),
    ("<|start|>assistant to=", "tool call"), ("<|start|>functions.", "tool result"),
    ("<|channel|>analysis", "analysis (reasoning)"), ("<|channel|>final", "final answer"),
    ("<|channel|>commentary", "commentary"), ("<|end|>", "between messages"), ("<|return|>", "end"),
    ("<|call|>", "between messages"),
)
"""Marker -> section kind of a harmony render."""

_ENV_LOCK = threading.Lock()


def rank_file() -> Any:
    """The first `o200k_base.tiktoken` in `tiktoken_search_dirs()`; a `TokenizerError` naming the folders."""
    dirs = tiktoken_search_dirs()
    for d in dirs:
        if (d / RANK_FILE).is_file():
            return d / RANK_FILE
    raise TokenizerError(f"vendor:harmony needs {RANK_FILE!r}, not found offline in {[str(d) for d in dirs]} "
                         "(set CTXKIT_TIKTOKEN_DIR to a folder holding it)")


def _load_encoding(folder: str) -> Any:
    """harmony's gpt-oss encoding read from `folder` (its variable set only while it loads)."""
    try:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding  # lazy: vendor package
    except ImportError as exc:
        raise ConfigError("vendor:harmony needs openai-harmony (pip install -e '.[vendor]')") from exc
    with _ENV_LOCK:
        before = os.environ.get(ENCODINGS_ENV)
        os.environ[ENCODINGS_ENV] = folder
        try:
            return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        except Exception as exc:  # noqa: BLE001 - a rank file harmony cannot read
            raise TokenizerError(f"openai-harmony cannot load o200k_harmony from {folder}: {exc}") from exc
        finally:
            if before is None:
                os.environ.pop(ENCODINGS_ENV, None)
            else:
                os.environ[ENCODINGS_ENV] = before


@dataclass(frozen=True)
class HarmonyOracle:
    """openai-harmony's gpt-oss renderer over `o200k_harmony`."""

    name: str
    """The vendor name (`harmony`, `harmony-keep-analysis`)."""
    keep_analysis: bool
    """Keep earlier turns' analysis in history (harmony's `auto_drop_analysis=False`)."""
    version: str
    """openai-harmony's installed version."""
    sha256: str
    """sha256 of the rank file read (`hf_files.hash_files`)."""
    clock: datetime = DEFAULT_CLOCK
    """The conversation start date of the system message (its date is part of `template_id`)."""
    package: str = PACKAGE
    """The distribution that renders."""
    _encoding: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, name: str, *, keep_analysis: bool) -> "HarmonyOracle":
        """The oracle, its encoding read from the local rank file."""
        path = rank_file()
        encoding = _load_encoding(str(path.parent))
        return cls(name=name, keep_analysis=keep_analysis, version=dist_version(PACKAGE), sha256=hash_files([path]),
                   _encoding=encoding)

    @property
    def template_id(self) -> str:
        """`vendor:<name>/openai-harmony-<version>@sha256:<16 hex>` over the rank file, the date and the options."""
        import hashlib  # lazy: only ids need it

        key = f"{self.sha256}\n{self.clock.date().isoformat()}\nkeep_analysis={self.keep_analysis}"
        return f"vendor:{self.name}/{self.package}-{self.version}@sha256:{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    @property
    def tokenizer_id(self) -> str:
        """`openai-harmony:o200k_harmony@sha256:<16 hex of the rank file>`."""
        return f"{self.package}:o200k_harmony@sha256:{self.sha256[:16]}"

    def conversation(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> Any:
        """The harmony `Conversation` of OpenAI `messages` and tool schemas (see the module docstring)."""
        from openai_harmony import (  # lazy: vendor package
            Author, Conversation, DeveloperContent, Message, Role, SystemContent, ToolDescription)

        system = SystemContent.new().with_conversation_start_date(self.clock.date().isoformat())
        out = [Message.from_role_and_content(Role.SYSTEM, system)]
        rest = list(messages)
        instructions = None
        if rest and rest[0].get("role") in ("system", "developer"):
            instructions = message_text(rest[0].get("content") or "")
            rest = rest[1:]
        if instructions or tools:
            dev = DeveloperContent.new()
            if instructions:
                dev = dev.with_instructions(instructions)
            if tools:
                dev = dev.with_function_tools([
                    ToolDescription.new(t["function"]["name"], t["function"].get("description", ""),
                                        parameters=t["function"].get("parameters")) for t in tools])
            out.append(Message.from_role_and_content(Role.DEVELOPER, dev))
        names: dict[str, str] = {}
        offset = len(messages) - len(rest)
        for j, m in enumerate(rest):
            i, role = j + offset, m.get("role")
            text = message_text(m.get("content")) if m.get("content") is not None else ""
            if role == "user":
                out.append(Message.from_role_and_content(Role.USER, text))
            elif role == "assistant":
                reasoning = m.get("reasoning_content") or m.get("thinking") or m.get("reasoning")
                if reasoning:
                    out.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
                calls = m.get("tool_calls") or []
                if calls:
                    if text:
                        out.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("commentary"))
                    for c in calls:
                        fn = c["function"]
                        names[str(c.get("id"))] = fn["name"]
                        args = fn.get("arguments")
                        body = args if isinstance(args, str) else json.dumps(args or {}, ensure_ascii=False)
                        out.append(Message.from_role_and_content(Role.ASSISTANT, body).with_channel("commentary")
                                   .with_recipient(f"functions.{fn['name']}").with_content_type("json"))
                else:
                    out.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("final"))
            elif role == "tool":
                name = m.get("name") or names.get(str(m.get("tool_call_id")))
                if not name:
                    raise VendorRenderError(self.name, "a tool result names no tool and answers no known call", i)
                out.append(Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"), text)
                           .with_channel("commentary").with_recipient("assistant"))
            else:
                raise VendorRenderError(self.name, f"role {role!r} has no harmony message here", i)
        return Conversation.from_messages(out)

    def encode(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
               add_generation_prompt: bool, *, history: bool = False) -> list[int]:
        """harmony's ids of the conversation (see the module docstring)."""
        from openai_harmony import RenderConversationConfig, Role  # lazy: vendor package

        convo = self.conversation(messages, tools)
        config = RenderConversationConfig(auto_drop_analysis=not self.keep_analysis)
        enc = self._encoding
        last = convo.messages[-1]
        try:
            if add_generation_prompt:
                return list(enc.render_conversation_for_completion(convo, Role.ASSISTANT, config))
            if not history and last.author.role == Role.ASSISTANT and last.channel == "final":
                return list(enc.render_conversation_for_training(convo, config))
            return list(enc.render_conversation(convo, config))
        except Exception as exc:  # noqa: BLE001 - every harmony refusal becomes one typed error
            raise VendorRenderError(self.name, f"{type(exc).__name__}: {exc}") from exc

    def turn_ids(self, messages: Sequence[Mapping[str, Any]], index: int, tools: Sequence[Mapping[str, Any]] | None,
                 *, history: bool) -> list[int]:
        """The ids of assistant message `index` alone, as harmony renders its messages (analysis, commentary,
        calls, final) with this oracle's config, less the `<|start|>assistant` the generation prompt wrote;
        `history` as for `encode`. For a turn whose prefix renders are rewritten by a later final message."""
        from openai_harmony import Conversation, RenderConversationConfig, Role  # lazy: vendor package

        mine = self.conversation(list(messages[: index + 1]), tools).messages
        k = len(self.conversation(list(messages[:index]), tools).messages)
        turn = Conversation.from_messages(mine[k:])
        config = RenderConversationConfig(auto_drop_analysis=not self.keep_analysis)
        enc = self._encoding
        last = turn.messages[-1]
        try:
            if not history and last.channel == "final":
                ids = list(enc.render_conversation_for_training(turn, config))
            else:
                ids = list(enc.render_conversation(turn, config))
            opener = list(enc.render_conversation_for_completion(Conversation.from_messages([]), Role.ASSISTANT, config))
        except Exception as exc:  # noqa: BLE001 - every harmony refusal becomes one typed error
            raise VendorRenderError(self.name, f"{type(exc).__name__}: {exc}", index) from exc
        if ids[: len(opener)] != opener:
            raise VendorRenderError(self.name, "the turn's render does not open with the generation prompt", index)
        return ids[len(opener):]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids` (special tokens written out; bytes that are not whole characters replaced)."""
        return self._encoding.decode(list(ids))

    def sections(self) -> Sequence[tuple[str, str]]:
        """Marker -> section kind (`SECTIONS`)."""
        return SECTIONS


__all__ = ["DEFAULT_CLOCK", "ENCODINGS_ENV", "HarmonyOracle", "PACKAGE", "RANK_FILE", "SECTIONS", "rank_file"]
