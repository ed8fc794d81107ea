"""`render` checks its inputs at the edge: a string, a single dict, None or a list of non-dicts as `messages`
or `tools` is a `MessageFormatError` naming the parameter (they used to render one tool per character, or
fail with a raw `TypeError` or "expected a dict, got str")."""

from __future__ import annotations

import pytest

from ctxkit.errors import MessageFormatError
from ctxkit.text.rendering.renderer import IncrementalRenderer, render

HI = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("messages, tools, said", [
    (HI, None, "messages: expected a list of messages (dicts), got dict; wrap one message in a list"),
    (None, None, "messages: expected a list of messages (dicts), got NoneType"),
    ("hi", None, "messages: expected a list of messages (dicts), got str"),
    (["hi"], None, "message 0: expected a dict, got str"),
    ([HI], "read_file", "tools: expected a list of tool schemas (dicts), got str"),
    ([HI], TOOL, "tools: expected a list of tool schemas (dicts), got dict; wrap one tool schema in a list"),
    ([HI], [TOOL, "read_file"], "tool 1: expected a dict, got str"),
])
def test_bad_inputs_are_typed_errors_naming_the_parameter(tok, messages, tools, said):
    with pytest.raises(MessageFormatError) as err:
        render(messages, tok, tools=tools)
    assert str(err.value) == said


def test_lists_tuples_and_generators_render_alike(tok):
    as_list = render([HI], tok, tools=[TOOL]).token_ids
    assert render((HI,), tok, tools=(TOOL,)).token_ids == as_list
    renderer = IncrementalRenderer(tok, tools=[TOOL])
    renderer.extend(m for m in [HI])
    assert renderer.render().token_ids == as_list
