"""Version 3 of mask-observations and truncate-tool-output: sizes counted in context (`ctxkit.context.compress.sized_in_context`).

- The in-context count of a tool output (what `mask-observations-v3` writes in its placeholder, and what
  `truncate-tool-output-v3` compares with `max_tokens`) equals the number of tokens of a full render whose
  character range overlaps the output's text, from the tokenizer's own offsets (hypothesis, two tokenizers).
- Exact placeholders and an exact cut on a fixed episode (Qwen2.5).
- Every text `truncate-tool-output-v3` writes re-tokenizes to at most `max_tokens` tokens, and its kept
  parts are a literal prefix / suffix / middle of the output (hypothesis).
- Every build of the version-3 strategies and their presets equals a full render of its view.
- Without the builder's render the version-3 strategies refuse to run.
"""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkit.context.compress import make_compressor
from ctxkit.context.compress.base import CompressionRequest
from ctxkit.context.compress.truncate_tool_output import KEEPS
from ctxkit.context.compress.sized_in_context import cut_in_context
from ctxkit.errors import ConfigError
from ctxkit.text.rendering.renderer import render
from test_fit_predicted import tok, view_of
from test_render_segments import check_every_build

SETTINGS = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
PLACEHOLDER = re.compile(r"\[tool output (\S+) masked: (\d+) tokens\]")


def request_for(builder, view, log, budget, *, rendered=True):
    return CompressionRequest(view=view, events=log.events(), tokenizer=builder.tokenizer, template=builder.template,
                              budget=budget, measure=builder.measure,
                              pinned_texts=tuple(p.text for p in view.active_pins), turn_starts=builder.turn_starts,
                              rendered=builder.rendered if rendered else None)


def counts_from_offsets(builder, view):
    """Event id -> tokens of a full render of `view` overlapping the text of its tool message, from the
    tokenizer's offsets over the template's text."""
    t = builder.tokenizer
    chats = [m.to_chat() for m in view.messages]
    tools = list(view.tools) or None
    full = render(chats, t, tools=tools, add_generation_prompt=True)
    text = builder.template.render_text(chats, tools=tools, add_generation_prompt=True)
    ids, starts = t.encode_with_offsets(text)
    assert tuple(ids) == full.token_ids
    ends = starts[1:] + [len(text)]
    out = {}
    cursor = 0
    for m in view.messages:
        if m.role != "tool":
            continue
        c0 = text.find(m.content, text.find("<tool_response>" if "<tool_response>" in text else m.content, cursor))
        assert c0 >= cursor
        c1 = cursor = c0 + len(m.content)
        out[m.provenance.event_ids[0]] = sum(1 for s, e in zip(starts, ends) if s < c1 and e > c0)
    return out


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "smollm2-135m-instruct"])
@SETTINGS
@given(seed=st.integers(0, 10_000), turns=st.integers(2, 8), keep_last=st.integers(0, 3))
def test_placeholder_gives_the_in_context_count_of_a_full_render(name, seed, turns, keep_last):
    builder, view, log = view_of(tok(name), seed, turns)
    request = request_for(builder, view, log, builder.measure(view))
    comp = make_compressor("mask-observations-v3", trigger="every_turn", keep_last=keep_last, target_fraction=1.0)
    c = comp.compact(request)
    expected = counts_from_offsets(builder, view)
    masked = {} if c is None else {PLACEHOLDER.fullmatch(e.text).group(1): int(PLACEHOLDER.fullmatch(e.text).group(2))
                                   for e in c.edits}
    assert all(expected[eid] == n for eid, n in masked.items())
    assert bool(masked) == (keep_last < turns)  # every turn has a tool output


def test_exact_placeholders_and_cut_on_a_fixed_episode():
    builder, view, log = view_of(tok("qwen2.5-instruct"), 3, 4)
    request = request_for(builder, view, log, builder.measure(view))
    mask = make_compressor("mask-observations-v3", trigger="every_turn", keep_last=2, target_fraction=1.0)
    assert [e.text for e in mask.compact(request).edits] == EXPECTED_PLACEHOLDERS
    v2 = make_compressor("mask-observations-v2", trigger="every_turn", keep_last=2, target_fraction=1.0)
    assert [e.text for e in v2.compact(request).edits] == EXPECTED_PLACEHOLDERS_V2  # standalone counts
    cut = make_compressor("truncate-tool-output-v3", trigger="every_turn", max_tokens=40)
    edits = cut.compact(request).edits
    assert [(e.event_id, e.text) for e in edits][:1] == EXPECTED_CUT
    assert len(edits) == EXPECTED_N_CUT


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "smollm2-135m-instruct"])
@SETTINGS
@given(seed=st.integers(0, 10_000), turns=st.integers(2, 6), max_tokens=st.integers(32, 90), keep=st.sampled_from(KEEPS))
def test_truncated_outputs_fit_the_cap_and_keep_literal_parts(name, seed, turns, max_tokens, keep):
    t = tok(name)
    builder, view, log = view_of(t, seed, turns)
    request = request_for(builder, view, log, builder.measure(view))
    comp = make_compressor("truncate-tool-output-v3", trigger="every_turn", max_tokens=max_tokens, keep=keep)
    c = comp.compact(request)
    in_context = counts_from_offsets(builder, view)
    cut = {e.event_id: e.text for e in c.edits} if c is not None else {}
    assert set(cut) == {eid for eid, n in in_context.items() if n > max_tokens}  # "fits" is the in-context count
    originals = {m.provenance.event_ids[0]: m.content for m in view.messages if m.role == "tool"}
    marker = re.compile(r"\[\.\.\. \d+ tokens of " + r"\S+" + r" truncated \.\.\.\]")
    for eid, text in cut.items():
        assert t.count(text) <= max_tokens
        parts = marker.split(text)
        original = originals[eid]
        if len(parts) == 1:  # nothing could be kept: the marker alone
            continue
        head, tail = parts[0], parts[-1]
        if keep in ("head", "head_tail"):
            assert head.endswith("\n") and original.startswith(head[:-1]) and head[:-1]
        if keep in ("tail", "head_tail"):
            assert tail.startswith("\n") and original.endswith(tail[1:]) and tail[1:]
        if keep == "middle":
            assert parts[1].strip("\n") in original


@SETTINGS
@given(seed=st.integers(0, 10_000), n_words=st.integers(40, 400), max_tokens=st.integers(32, 120),
       keep=st.sampled_from(KEEPS))
def test_cut_in_context_is_exact_on_the_output_own_ids(seed, n_words, max_tokens, keep):
    """Given the output's own ids (a render where nothing merges across its edges), the cut fits the cap."""
    from ctxkit.context.compressor_check import episode_text

    t = tok("qwen2.5-instruct")
    text = episode_text(n_words, seed) + " naïve café " + "x" * (seed % 7)
    ids = t.encode(text)
    if len(ids) <= max_tokens:
        return
    out = cut_in_context(t, text, ids, max_tokens, keep, "e9")
    assert out is not None and t.count(out) <= max_tokens


@pytest.mark.parametrize("compressor", ["mask-observations-v3", "truncate-tool-output-v3", "mask-then-window-v2",
                                        "truncate-then-window-v2"])
@pytest.mark.parametrize("name", ["qwen2.5-instruct", "smollm2-135m-instruct"])
def test_every_build_equals_a_full_render(name, compressor):
    t = tok(name)
    builds = [check_every_build(t, compressor, seed, budget, turns=16) for seed in range(3) for budget in (1500, 3000)]
    assert sum(builds) > 0


def test_the_builder_render_is_needed():
    builder, view, log = view_of(tok("qwen2.5-instruct"), 1, 3)
    request = request_for(builder, view, log, 10, rendered=False)
    for name in ("mask-observations-v3", "truncate-tool-output-v3"):
        with pytest.raises(ConfigError, match=rf"{name}: needs the builder's render of the view"):
            make_compressor(name, trigger="every_turn", **({"max_tokens": 32} if "truncate" in name else {})).compact(request)


EXPECTED_PLACEHOLDERS = ["[tool output e4-3b7d79b6 masked: 229 tokens]", "[tool output e6-b19a7aec masked: 54 tokens]",
                         "[tool output e7-1acfc715 masked: 33 tokens]"]
EXPECTED_PLACEHOLDERS_V2 = EXPECTED_PLACEHOLDERS  # here every output's in-context count is its standalone count
EXPECTED_CUT = [("e4-3b7d79b6",
                 "schema2 worker3 value4 record\n[... 215 tokens of e4-3b7d79b6 truncated ...]\n8 state79 cache80")]
EXPECTED_N_CUT = 5  # outputs of 229, 54, 102, 175 and 116 tokens; the one of 33 fits


@pytest.mark.parametrize("keep", KEEPS)
def test_a_cut_keeps_its_parts_behind_a_token_straddling_the_edge(keep):
    """In a render the output's last token may merge with the template's text after it (Qwen2.5: `",\\n"`):
    the parts are still cut from the ids (version 2's standalone encode, the fallback, is not needed: before
    the fix `cut_in_context` returned None for `tail` and `head_tail` here), the tail extended to the
    output's end, and the whole fits the cap."""
    from ctxkit.context.compressor_check import episode_text

    t = tok("qwen2.5-instruct")
    content = "{" + episode_text(300, 5) + ","
    ids = t.encode("\n" + content + "\n")  # the template's newlines around the output
    assert t.decode(ids[-1:]) == ",\n"  # straddles the end
    out = cut_in_context(t, content, ids, 64, keep, "e9")
    assert out is not None and t.count(out) <= 64
    parts = re.split(r"\[\.\.\. \d+ tokens of e9 truncated \.\.\.\]", out)
    if keep in ("head", "head_tail"):
        assert parts[0].endswith("\n") and content.startswith(parts[0][:-1]) and len(parts[0]) > 20
    if keep in ("tail", "head_tail"):
        assert parts[-1].startswith("\n") and content.endswith(parts[-1][1:]) and parts[-1].endswith(",")
