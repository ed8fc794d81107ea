"""mistral-common's `encode_chat_completion` as a vendor renderer (`vendor:mistral-v3|v7|tekken`).

OpenAI messages become a `ChatCompletionRequest`: system, user, assistant (content and tool calls, whose
`arguments` are sent as JSON text) and tool messages (`tool_call_id`, `name`); tool schemas become
`Tool`s. What the OpenAI form has and mistral-common has not is dropped, as the Hugging Face Mistral
templates drop it too: an assistant's `reasoning_content` (these tokenizers have no thinking tokens).
A request whose last message is an assistant turn is validated in mistral-common's finetuning mode (the
turn ends with `</s>`), any other in its test mode; Mistral has no generation prompt, so
`add_generation_prompt` changes nothing. Whatever mistral-common rejects (roles out of order, a tool-call
id that is not 9 alphanumeric characters, ...) is a `VendorRenderError` carrying its message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any, Mapping, Sequence

from ctxkit.errors import ConfigError, VendorRenderError
from ctxkit.text.chat_messages import message_text
from ctxkit.text.tokenizer.hf_files import hash_files

PACKAGE = "mistral-common"
"""The distribution that renders."""

SECTIONS: tuple[tuple[str, str], ...] = (
    ("<s>", "start"), ("[SYSTEM_PROMPT]", "system prompt"), ("[/SYSTEM_PROMPT]", "between turns"),
    ("[AVAILABLE_TOOLS]", "tool schemas"), ("[/AVAILABLE_TOOLS]", "between turns"), ("[INST]", "user text"),
    ("[/INST]", "assistant text"), ("[TOOL_CALLS]", "tool call"), ("[TOOL_RESULTS]", "tool result"),
    ("[TOOL_CONTENT]", "tool result"), ("[/TOOL_RESULTS]", "between turns"), ("</s>", "between turns"),
)
"""Marker -> section kind of a Mistral render."""


def _package_file(name: str) -> Path:
    """The tokenizer file `name` shipped in mistral-common's `data/` folder."""
    try:
        import mistral_common  # lazy: the vendor package loads only when a Mistral oracle is asked for
    except ImportError as exc:
        raise ConfigError("vendor:mistral-* needs mistral-common (pip install -e '.[vendor]')") from exc
    path = Path(mistral_common.__file__).parent / "data" / name
    if not path.is_file():
        raise ConfigError(f"mistral-common {dist_version(PACKAGE)} ships no tokenizer file {name!r} in {path.parent}")
    return path


@dataclass(frozen=True)
class MistralOracle:
    """One mistral-common tokenizer file, rendering through `MistralTokenizer.encode_chat_completion`."""

    name: str
    """The vendor name (`mistral-v3`, ...)."""
    file: str
    """The tokenizer file's name in mistral-common's `data/` folder."""
    version: str
    """mistral-common's installed version."""
    sha256: str
    """sha256 of the tokenizer file (`hf_files.hash_files`)."""
    package: str = PACKAGE
    """The distribution that renders."""
    _modes: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def load(cls, name: str, file: str) -> "MistralOracle":
        """The oracle of tokenizer file `file` (both validation modes loaded once)."""
        from mistral_common.protocol.instruct.validator import ValidationMode  # lazy: vendor package
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer  # lazy: vendor package

        path = _package_file(file)
        try:
            modes = {m: MistralTokenizer.from_file(str(path), mode=m)
                     for m in (ValidationMode.test, ValidationMode.finetuning)}
        except ImportError as exc:  # sentencepiece files need the sentencepiece extra
            raise ConfigError(f"vendor:{name}: {exc} (pip install -e '.[vendor]')") from exc
        return cls(name=name, file=file, version=dist_version(PACKAGE), sha256=hash_files([path]),
                   _modes={m.value: t for m, t in modes.items()})

    @property
    def template_id(self) -> str:
        """`vendor:<name>/mistral-common-<version>@sha256:<16 hex of the tokenizer file>`."""
        return f"vendor:{self.name}/{self.package}-{self.version}@sha256:{self.sha256[:16]}"

    @property
    def tokenizer_id(self) -> str:
        """`mistral-common:<file>@sha256:<16 hex>`."""
        return f"{self.package}:{self.file}@sha256:{self.sha256[:16]}"

    @property
    def vocab_size(self) -> int:
        """Number of ids of the tokenizer."""
        return self._modes["test"].instruct_tokenizer.tokenizer.n_words

    def request(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> Any:
        """The `ChatCompletionRequest` of OpenAI `messages` and tool schemas (see the module docstring)."""
        from mistral_common.protocol.instruct.messages import (  # lazy: vendor package
            AssistantMessage, SystemMessage, ToolMessage, UserMessage)
        from mistral_common.protocol.instruct.request import ChatCompletionRequest  # lazy: vendor package
        from mistral_common.protocol.instruct.tool_calls import (  # lazy: vendor package
            Function, FunctionCall, Tool, ToolCall)

        out = []
        for i, m in enumerate(messages):
            role = m.get("role")
            text = message_text(m.get("content")) if m.get("content") is not None else None
            try:
                if role == "system":
                    out.append(SystemMessage(content=text or ""))
                elif role == "user":
                    out.append(UserMessage(content=text or ""))
                elif role == "assistant":
                    calls = [ToolCall(id=str(c.get("id")) if c.get("id") is not None else "null",
                                      function=FunctionCall(name=c["function"]["name"],
                                                            arguments=_arguments(c["function"].get("arguments"))))
                             for c in m.get("tool_calls") or ()]
                    out.append(AssistantMessage(content=text or None, tool_calls=calls or None))
                elif role == "tool":
                    out.append(ToolMessage(content=text or "", tool_call_id=m.get("tool_call_id"), name=m.get("name")))
                else:
                    raise VendorRenderError(self.name, f"role {role!r} has no mistral-common message", i)
            except VendorRenderError:
                raise
            except Exception as exc:  # noqa: BLE001 - pydantic validation of the vendor's message types
                raise VendorRenderError(self.name, f"{type(exc).__name__}: {exc}", i) from exc
        schemas = None
        if tools:
            try:
                schemas = [Tool(function=Function(name=t["function"]["name"],
                                                  description=t["function"].get("description", ""),
                                                  parameters=t["function"].get("parameters") or {}))
                           for t in tools]
            except Exception as exc:  # noqa: BLE001 - pydantic validation of the tool schemas
                raise VendorRenderError(self.name, f"tool schemas: {type(exc).__name__}: {exc}") from exc
        return ChatCompletionRequest(messages=out, tools=schemas)

    def encode(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
               add_generation_prompt: bool, *, history: bool = False) -> list[int]:
        """mistral-common's ids of the conversation (see the module docstring; `history` changes nothing)."""
        if not messages:
            return [self._modes["test"].instruct_tokenizer.tokenizer.bos_id]
        request = self.request(messages, tools)
        mode = "finetuning" if messages[-1].get("role") == "assistant" else "test"
        try:
            return list(self._modes[mode].encode_chat_completion(request).tokens)
        except Exception as exc:  # noqa: BLE001 - every mistral-common refusal becomes one typed error
            raise VendorRenderError(self.name, f"{type(exc).__name__}: {exc}") from exc

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, control tokens kept."""
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy  # lazy: vendor package

        return self._modes["test"].instruct_tokenizer.tokenizer.decode(list(ids),
                                                                      special_token_policy=SpecialTokenPolicy.KEEP)

    def sections(self) -> Sequence[tuple[str, str]]:
        """Marker -> section kind (`SECTIONS`)."""
        return SECTIONS


def _arguments(arguments: Any) -> str:
    """A tool call's arguments as mistral-common takes them: JSON text (an object is dumped)."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)


__all__ = ["MistralOracle", "PACKAGE", "SECTIONS"]
