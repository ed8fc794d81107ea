"""The thinking-history measurement (`ctxkit.benchmarks.thinking_history`) in its small form: on templates that
drop earlier reasoning, ctxkit's template-history samples split exactly where the full render's prefix really
changed (0 false splits, 0 missed), a text-in pipeline also splits where only the tokenization changed, and the
keep-reasoning kwargs (a distinct template id, token-exact with `apply_chat_template(..., **kwargs)`) leave
nothing to split. Counts, never timings."""

from __future__ import annotations

import pytest

from conftest import require_module, shared_path
from ctxkit.benchmarks.family_conversations import TOOLS
from ctxkit.benchmarks.template_families import family_tokenizer
from ctxkit.benchmarks.thinking_history import (THINKING_FAMILIES, family_thinking_row, format_table, main,
                                                measure_episode, thinking_episodes)
from ctxkit.text.template.chat_template import load_template, with_kwargs
from ctxkit.text.tokenizer.loader import load_tokenizer


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    require_module("trl")
    return tmp_path_factory.mktemp("thinking")


# family -> (sampled-history splits, keep-reasoning rewrites / splits) over 1 episode x 3 user turns
SMALL = {"qwen3": (0, None), "qwen3_6": (2, (0, 0)), "gptoss": (0, None), "nemotron_3_nano": (2, (0, 0)),
         "glm4moe": (0, None)}


@pytest.mark.parametrize("family", sorted(SMALL))
def test_small_form_splits_exactly_at_real_rewrites(root, family):
    row = family_thinking_row(family, shared_path(), root, 1, 3)
    assert (row.episodes, row.refused, row.transitions) == (1, 0, 4)
    # the two later user turns each drop the reasoning of the turns before them
    assert (row.real_rewrites, row.template_splits, row.template_false, row.template_missed) == (2, 2, 0, 0)
    assert row.split_reasons == "thinking_stripped 2" and row.full_mismatch == 0
    # a text-in pipeline re-tokenizes the two turns written in BPE pieces: two splits the prefix never needed
    assert (row.naive_splits, row.naive_false) == (4, 2)
    sampled, keep = SMALL[family]
    assert row.sampled_splits == sampled  # a prefilled <think> the template drops from history splits anyway
    assert row.drift_reasons == "bpe_merge 2, thinking_stripped 3"
    assert (None if row.keep_rewrites is None else (row.keep_rewrites, row.keep_splits)) == keep


def test_template_history_splits_where_the_full_render_changes(root):
    tok = load_tokenizer(str(family_tokenizer("qwen3", shared_path(), root)))
    got = measure_episode(tok, load_template(None, tok), thinking_episodes(1, 4, True)[0], TOOLS)
    assert got["real"] == set(got["template"]) == {2, 3, 5}  # the steps after each later user turn
    assert set(got["template"].values()) == {"thinking_stripped"} and got["equal_full"]
    assert got["sampled"] == {}


def test_keep_reasoning_variant_is_a_distinct_template_and_token_exact(root):
    tok = load_tokenizer(str(family_tokenizer("qwen3_6", shared_path(), root)))
    stock = load_template(None, tok)
    keep = with_kwargs(stock, THINKING_FAMILIES["qwen3_6"])
    assert keep.id != stock.id and keep.id.startswith("tokenizer+preserve_thinking=true@sha256:")
    assert with_kwargs(stock, {}) is stock
    from ctxkit.text.rendering.renderer import render

    msgs = thinking_episodes(1, 2, True)[0]
    ids = render(msgs, tok, keep, tools=TOOLS, add_generation_prompt=True).token_ids
    hf = tok.hf.apply_chat_template(msgs, tools=TOOLS, tokenize=True, add_generation_prompt=True, return_dict=False,
                                    preserve_thinking=True)
    assert list(ids) == hf
    assert tok.decode(list(ids)).count("<think>") == 4  # every turn's reasoning kept


def test_main_prints_the_table(capsys):
    require_module("trl")
    assert main(["--episodes", "1", "--turns", "2", "qwen3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "1 episodes x 2 user turns per family; every third sampled turn in BPE pieces"
    assert out[3].startswith("| qwen3 | 1 | 2 | 1 | ")
    assert format_table([]).count("\n") == 1


def test_deepseek_r1_rewrites_every_transition(root):
    """R1 distill never renders reasoning and drops the `<think>` its generation prompt prefilled once a turn is
    history: every transition rewrites the prefix, even where every sampled id is kept."""
    row = family_thinking_row("deepseek_r1_distill", shared_path(), root, 1, 3)
    assert (row.transitions, row.real_rewrites, row.template_splits, row.template_false, row.template_missed) == (
        4, 3, 3, 0, 0)
    assert (row.naive_splits, row.naive_false, row.sampled_splits, row.full_mismatch) == (3, 0, 3, 0)
    assert row.split_reasons == row.sampled_reasons == row.drift_reasons == "thinking_stripped 3"
