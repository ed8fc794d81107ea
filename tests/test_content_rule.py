"""One content rule (issue 9): text parts are flattened the same way by render, build, import and export,
and image parts are refused everywhere with the message and part named."""

from __future__ import annotations

import pytest

from conftest import tokenizer_dir
from ctxkit.context.builder import ContextBuilder
from ctxkit.content import flatten_content
from ctxkit.log.conversation import export_conversation, import_conversation
from ctxkit.errors import MessageFormatError
from ctxkit.log.event_log import MemoryLog
from ctxkit.text.rendering.renderer import render
from ctxkit.text.template.chat_template import load_template
from ctxkit.text.tokenizer.loader import load_tokenizer

PARTS = [{"type": "text", "text": "Fix the bug "}, {"type": "text", "text": "in parser.py.", "cache_control": {}}]
CONV = {"messages": [{"role": "system", "content": [{"type": "text", "text": "You are careful."}]},
                     {"role": "user", "content": PARTS}]}
FLAT = {"messages": [{"role": "system", "content": "You are careful."},
                     {"role": "user", "content": "Fix the bug in parser.py."}]}
IMAGE = {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:"}}]}

# A template written for list content (the Qwen2-VL way): parts' texts joined with no separator.
LIST_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.content is string %}{{ message.content }}{% else %}"
    "{% for part in message.content %}{% if part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module", params=["qwen2.5-instruct", "qwen3", "smollm2-135m-instruct"])
def tok(request):
    return load_tokenizer(tokenizer_dir(request.param))


def test_flatten_joins_text_parts_without_separator():
    assert flatten_content(PARTS) == "Fix the bug in parser.py."
    assert flatten_content(None) == "" and flatten_content("x") == "x"


def test_render_and_import_then_build_agree(tok):
    rendered = render(CONV["messages"], tok, add_generation_prompt=True)
    assert rendered.token_ids == render(FLAT["messages"], tok, add_generation_prompt=True).token_ids
    log = MemoryLog(import_conversation(CONV))
    built = ContextBuilder(tok, budget=4000, detect_pins=False).build(log)
    assert built.token_ids == rendered.token_ids
    # export gives the parts back as imported; rendering the export gives the same ids again
    exported = export_conversation(log)
    assert exported["messages"] == CONV["messages"]
    assert render(exported["messages"], tok, add_generation_prompt=True).token_ids == rendered.token_ids


def test_flattening_equals_a_template_that_handles_lists(tmp_path):
    tok = load_tokenizer(tokenizer_dir("qwen2.5-instruct"))
    path = tmp_path / "list-parts.jinja"
    path.write_text(LIST_TEMPLATE)
    template = load_template(str(path), tok)
    ours = render(CONV["messages"], tok, template, add_generation_prompt=True)
    ref = tok.hf.apply_chat_template(CONV["messages"], chat_template=LIST_TEMPLATE, tokenize=True,
                                     add_generation_prompt=True)
    ref = list(ref["input_ids"] if hasattr(ref, "keys") else ref)
    assert list(ours.token_ids) == ref


def test_image_parts_are_refused_everywhere(tok):
    msgs = [{"role": "system", "content": "s"}, IMAGE]
    pattern = r"content part 1 is 'image_url': only text parts .* images and other non-text parts are refused"
    with pytest.raises(MessageFormatError, match=r"message 1: " + pattern):
        render(msgs, tok)
    with pytest.raises(MessageFormatError, match=r"messages\[1\]: " + pattern):
        import_conversation({"messages": msgs})
