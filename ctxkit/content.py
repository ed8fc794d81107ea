"""The one content rule: what a message's `content` may be and the text it stands for.

A content is a string, None (no text) or a list of text parts `{"type": "text", "text": str}` (other keys
of a part, e.g. `cache_control`, are ignored). Its text is the parts' texts joined with no separator.
Every path that reads content uses these two functions: `render` (before the template sees the message),
the view and so `build`, `import_conversation`/`message_from_openai` (import) and the event log; export
gives back the content as it was imported (parts stay parts), and re-rendering it flattens it again, so
render, build, import and export agree on the same input.

Why flatten rather than pass the list to the template: of the four shared templates, Qwen2.5, SmolLM2 and
Mistral v0.3 fail on a list (`str + list`), and Qwen3 renders it as empty content (`message.content is
string` is false), dropping the text silently. Templates written for list content (Qwen2-VL style:
`{% for part in message.content %}{{ part.text }}{% endfor %}`) render exactly the joined text, so for
them flattening first gives the ids `apply_chat_template` gives for the list (a test checks this).

Images and any other non-text part are refused with a `MessageFormatError` naming the message and the
part's index and type: ctxkit renders text only, and dropping a part silently would change what the
policy saw.
"""

from __future__ import annotations

from typing import Any, Mapping

from ctxkit.errors import MessageFormatError


def check_content(content: Any, where: str) -> None:
    """`MessageFormatError` naming `where` (e.g. `"messages[3]"`), the part index and its type unless
    `content` is a string, None or a list/tuple of text parts."""
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, (list, tuple)):
        raise MessageFormatError(
            f"{where}: content of type {type(content).__name__} is not supported "
            "(a string, None or a list of text parts {'type': 'text', 'text': str})"
        )
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise MessageFormatError(f"{where}: content part {j} is a {type(part).__name__}, not a part object")
        kind = part.get("type")
        if kind != "text":
            raise MessageFormatError(
                f"{where}: content part {j} is {kind!r}: only text parts {{'type': 'text', 'text': str}} "
                "are supported (ctxkit renders text; images and other non-text parts are refused)"
            )
        if not isinstance(part.get("text"), str):
            raise MessageFormatError(f"{where}: content part {j} is a text part without a string 'text'")


def flatten_content(content: Any, where: str = "message") -> str:
    """The text of a content (checked by `check_content`): the string itself, "" for None, the parts'
    texts joined with no separator."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    check_content(content, where)
    return "".join(part["text"] for part in content)
