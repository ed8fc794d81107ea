"""Tool calls written in assistant text (`<function=name><parameter=key>value</parameter></function>`, the
OpenHands/SWE-smith prompt format): the grammar, its parser and its writer.

Grammar (docs/IMPORTERS.md has the same, with examples)::

    turn    := thought [call ws*]
    thought := any text that does not contain "<function="
    call    := "<function=" NAME ">" "\\n"? param* ws* "</function>"
    param   := ws* "<parameter=" KEY ">" VALUE "</parameter>"
    NAME, KEY := one or more characters other than ">" and newline, no surrounding spaces
    VALUE   := any text up to the first "</parameter>"; a value written on its own lines
               ("\\n" value "\\n") loses that one leading and one trailing newline

A turn has at most one call (the format says "only call one function at a time"), keys are unique, and
nothing but whitespace may follow `</function>`; anything else is a `TextCallError` saying what. Values
stay strings (the text carries no types). `format_text_call` writes the canonical form back; when it
reproduces the source exactly nothing else is stored, otherwise the importer keeps the source text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

CALL_OPEN = "<function="
"""The marker that starts a text call."""

_CALL = re.compile(r"<function=([^>\n]+)>\n?(.*?)</function>", re.DOTALL)
_PARAM = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
OBSERVATION_PREFIXES = ("OBSERVATION:\n", "OBSERVATION:", "Observation: ", "Observation:")
"""Prefixes a tool result written as a user turn may start with; removed, and kept for the way back."""


class TextCallError(ValueError):
    """A text call that does not follow the grammar (the importer adds file, episode and turn)."""


@dataclass(frozen=True)
class TextCall:
    """A parsed assistant turn: the text before the call, and the call (None when the turn has none)."""

    thought: str
    """Text before `<function=`, verbatim (the whole turn when there is no call)."""
    name: str | None
    """Function name, or None."""
    arguments: Mapping[str, str]
    """Parameters in written order, values as strings."""

    def arguments_json(self) -> str:
        """The arguments as JSON text (the tool call's `arguments`)."""
        return json.dumps(dict(self.arguments), ensure_ascii=False)


def parse_text_call(text: str) -> TextCall:
    """Split an assistant turn into its thought and its one call (see the module's grammar)."""
    start = text.find(CALL_OPEN)
    if start < 0:
        return TextCall(thought=text, name=None, arguments={})
    match = _CALL.match(text, start)
    if match is None:
        raise TextCallError(f"a {CALL_OPEN}...> block at character {start} has no closing </function> "
                            "(or no '>' after the name)")
    name = match.group(1)
    if name != name.strip() or not name:
        raise TextCallError(f"function name {name!r} has surrounding spaces")
    body, pos, args = match.group(2), 0, {}
    while True:
        param = _PARAM.match(body, pos)
        if param is None:
            break
        key, value = param.group(1), param.group(2)
        if key != key.strip() or not key:
            raise TextCallError(f"call {name!r}: parameter name {key!r} has surrounding spaces")
        if key in args:
            raise TextCallError(f"call {name!r}: parameter {key!r} is given twice")
        if len(value) >= 2 and value.startswith("\n") and value.endswith("\n"):
            value = value[1:-1]
        args[key] = value
        pos = param.end()
    rest = body[pos:]
    if rest.strip():
        raise TextCallError(f"call {name!r}: unexpected text {rest.strip()[:60]!r} where a <parameter=...> "
                            "or </function> belongs")
    tail = text[match.end():]
    if CALL_OPEN in tail:
        raise TextCallError("more than one <function=...> call in one turn (the format allows one)")
    if tail.strip():
        raise TextCallError(f"text after </function>: {tail.strip()[:60]!r} (the format allows none)")
    return TextCall(thought=text[:start], name=name, arguments=args)


def format_text_call(thought: str, name: str | None, arguments: Mapping[str, Any]) -> str:
    """The canonical text of a turn: the thought, then the call (`<function=NAME>\\n`, one
    `<parameter=K>V</parameter>\\n` per argument, a value with a newline on its own lines, `</function>`)."""
    if name is None:
        return thought
    parts = [thought, f"<function={name}>\n"]
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        parts.append(f"<parameter={key}>" + (f"\n{text}\n" if "\n" in text else text) + "</parameter>\n")
    parts.append("</function>")
    return "".join(parts)


def split_observation(text: str) -> tuple[str, str]:
    """`(prefix, output)` of a tool result written as a user turn (`OBSERVATION:\\n...`); prefix may be ""."""
    for prefix in OBSERVATION_PREFIXES:
        if text.startswith(prefix):
            return prefix, text[len(prefix):]
    return "", text
