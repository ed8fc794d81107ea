"""Special-token text inside message content: detection, the per-role policy, and plain-text encoding.

A tokenizer parses the text of its added/special tokens (`<|im_end|>`, `<|im_start|>`, `[INST]`, ...)
as control tokens wherever it occurs, so a tool output holding `<|im_end|>\\n<|im_start|>assistant\\n`
forges a turn boundary: `transformers`' `apply_chat_template` does exactly that. The policy says what a
render does with such text in a message's content (tool-call arguments and reasoning are not scanned):

- `"allow"`: parsed as control tokens; ids equal `apply_chat_template` (what ctxkit did before).
- `"escape"`: encoded as ordinary text: the rendered text is cut only at the template's own special
  tokens, and each piece holding escaped text is encoded with no special-token parsing (HF
  `split_special_tokens=True` for every added token; tiktoken `encode_ordinary`).
- `"error"`: a `SpecialTokenError` naming the message, the token and its character offset.

`special_tokens=` takes one policy for every role or a mapping role -> policy (roles left out get the
default). The default, `DEFAULT_SPECIAL_TOKENS`, escapes `tool` content and allows the rest: tool output
is untrusted text from outside (a web page, a file, a program's output) and must not be able to open a
turn the loss mask would then treat as the policy's own, while system/user/assistant text is written by
the people running the episode (or sampled by the policy) and keeps the `transformers` ids. Every
occurrence, whatever the policy, is reported on the rendered context (`SpecialTokenInContent`).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ctxkit.errors import ConfigError, CtxkitError, RenderError
from ctxkit.events import EpisodeStart, Message, Step, ToolResult, content_text
from ctxkit.text.tokenizer.loader import load_tokenizer

SPECIAL_TOKEN_POLICIES = ("allow", "escape", "error")
"""What a render does with special-token text in a message's content."""

POLICY_ROLES = ("system", "user", "assistant", "tool")
"""Roles a policy mapping may name."""

DEFAULT_SPECIAL_TOKENS: Mapping[str, str] = {"system": "allow", "user": "allow", "assistant": "allow", "tool": "escape"}
"""The default policy: escape tool output (untrusted), allow the rest (ids equal `transformers`)."""

RECORDED_DEFAULT = "allow"
"""The policy of a builder description without a `special_tokens` key (logs recorded before it existed)."""


@dataclass(frozen=True)
class SpecialTokenInContent:
    """One occurrence of special-token text inside a message's content, as rendered."""

    message_index: int
    """Index of the message in the list rendered."""
    role: str
    """The message's role."""
    token: str
    """The special token's text."""
    char: int
    """Character offset of the occurrence in the message's (flattened) content."""
    position: int | None
    """Token position in the rendered context of the token holding its first character (the control
    token itself under `allow`); None when the content could not be located or lies in sampled ids."""
    policy: str
    """`allow` (rendered as a control token) or `escape` (rendered as plain text)."""


def resolve_special_tokens(value: Any, where: str = "special_tokens") -> dict[str, str]:
    """A full role -> policy dict from None (the default), one policy for every role, or a mapping
    role -> policy (roles left out keep the default). `ConfigError` naming `where` otherwise."""
    if value is None:
        return dict(DEFAULT_SPECIAL_TOKENS)
    if isinstance(value, str):
        if value not in SPECIAL_TOKEN_POLICIES:
            raise ConfigError(f"{where}={value!r}: expected one of {list(SPECIAL_TOKEN_POLICIES)} or a mapping role -> policy")
        return {role: value for role in POLICY_ROLES}
    if isinstance(value, Mapping):
        out = dict(DEFAULT_SPECIAL_TOKENS)
        for role, policy in value.items():
            if role not in POLICY_ROLES:
                raise ConfigError(f"{where}: unknown role {role!r}; expected one of {list(POLICY_ROLES)}")
            if policy not in SPECIAL_TOKEN_POLICIES:
                raise ConfigError(f"{where}[{role!r}]={policy!r}: expected one of {list(SPECIAL_TOKEN_POLICIES)}")
            out[role] = policy
        return out
    raise ConfigError(f"{where}: expected a policy string or a mapping role -> policy, got {type(value).__name__}")


def find_special_tokens(text: str, tokenizer: Any) -> list[tuple[int, str]]:
    """`(char offset, token text)` of every special/added token's text in `text`, in order."""
    out: list[tuple[int, str]] = []
    pos = 0
    for piece, special in tokenizer.split_special(text):
        if special:
            out.append((pos, piece))
        pos += len(piece)
    return out


def count_special_tokens_in_content(events: Iterable[Any], tokenizer: Any) -> int:
    """Number of special-token occurrences in the content of a log's chat events (for `ctxkit audit`)."""
    return sum(len(find_special_tokens(content_text(e.content), tokenizer))
               for e in events if isinstance(e, (Message, Step, ToolResult)))


# ------------------------------------------------------------------------------------------ encoding

_PLAIN: dict[str, Any] = {}
_PLAIN_LOCK = threading.Lock()


def _never_prepend(node: Any) -> Any:
    """A tokenizer.json component with Metaspace `prepend_scheme: first` set to `never` (a continuation)."""
    if isinstance(node, dict):
        node = {k: _never_prepend(v) for k, v in node.items()}
        if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first":
            node["prepend_scheme"] = "never"
        return node
    if isinstance(node, list):
        return [_never_prepend(v) for v in node]
    return node


def _plain_backends(tokenizer: Any) -> tuple[Any, Any]:
    """Hugging Face backends of `tokenizer` with no added tokens (nothing is parsed as special): one for
    the start of a text, one for a continuation behind a special token."""
    with _PLAIN_LOCK:
        hit = _PLAIN.get(tokenizer.id)
        if hit is None:
            from tokenizers import Tokenizer as Backend  # lazy: tokenizers loads on first use

            backend = getattr(tokenizer, "backend", None) or tokenizer.hf.backend_tokenizer  # no transformers load
            spec = json.loads(backend.to_str())
            spec["added_tokens"] = []
            start = Backend.from_str(json.dumps(spec))
            cont = Backend.from_str(json.dumps(_never_prepend(spec)))
            hit = _PLAIN[tokenizer.id] = (start, cont)
        return hit


def encode_plain(tokenizer: Any, piece: str, at_start: bool) -> tuple[list[int], list[int]]:
    """`(ids, starts)` of `piece` encoded as ordinary text (special-token text included)."""
    if tokenizer.kind == "tiktoken":  # the piece encoder is tiktoken's encode_ordinary already
        ids, starts = tokenizer.encode_piece_offsets(piece, at_start)
        return list(ids), list(starts)
    start, cont = _plain_backends(tokenizer)
    enc = (start if at_start else cont).encode(piece, add_special_tokens=False)
    return list(enc.ids), [s for s, _ in enc.offsets]


def encode_escaped(tokenizer: Any, text: str, literal: set[int]) -> tuple[list[int], list[int]]:
    """`(ids, starts)` of `text` with the special-token occurrences starting at the offsets in `literal`
    encoded as ordinary text: the text is cut only at the other special tokens, and a piece holding an
    escaped occurrence is encoded with no special-token parsing. Equals `encode_with_offsets(text)` when
    `literal` is empty."""
    if not tokenizer.segmentable:
        raise RenderError(f"{tokenizer.id}: special_tokens='escape' needs a segmentable tokenizer (added tokens "
                          "without lstrip/rstrip flags); use 'allow' or 'error' for this one")
    pieces: list[tuple[str, bool, bool]] = []  # (text, is a real special token, holds escaped text)
    pos = 0
    for piece, special in tokenizer.split_special(text):
        if special and pos not in literal:
            pieces.append((piece, True, False))
        elif pieces and not pieces[-1][1]:
            prev = pieces[-1]
            pieces[-1] = (prev[0] + piece, False, prev[2] or special)
        else:
            pieces.append((piece, False, special))
        pos += len(piece)
    ids: list[int] = []
    starts: list[int] = []
    pos = 0
    for n, (piece, special, escaped) in enumerate(pieces):
        if special:
            ids.append(tokenizer.special_tokens[piece])
            starts.append(pos)
        else:
            p_ids, p_starts = (encode_plain(tokenizer, piece, n == 0) if escaped
                               else tokenizer.encode_piece_offsets(piece, n == 0))
            ids.extend(p_ids)
            starts.extend(pos + s for s in p_starts)
        pos += len(piece)
    return ids, starts


def count_in_log(events: Iterable[Any]) -> int | None:
    """`count_special_tokens_in_content` under the tokenizer recorded in the log's `EpisodeStart.context`;
    None when no tokenizer is recorded or it cannot be loaded here."""
    events = list(events)
    start = next((e for e in events if isinstance(e, EpisodeStart)), None)
    spec = (start.context.get("tokenizer") or {}).get("spec") if start is not None else None
    if not spec:
        return None
    try:
        tok = load_tokenizer(spec)
    except CtxkitError:
        return None
    return count_special_tokens_in_content(events, tok)
