"""The side-by-side benchmark with PrimeIntellect's `renderers`: family mapping, mismatch counting, skips.

No timings are checked (speed is the benchmark's output, never a test)."""

from __future__ import annotations

import sys

import pytest
from conftest import require_module, shared_path, tokenizer_dir

from ctxkit.benchmarks import peer_renderers as pr
from ctxkit.benchmarks.template_families import FAMILIES
from ctxkit.errors import ConfigError


def test_every_pair_is_a_trl_stock_template_and_names_its_renderer():
    got = pr.pairs()
    assert len(got) == 22
    assert {p.family for p in got} - {pr.SHARED_QWEN3} <= set(FAMILIES)
    assert set(pr.PEER_TOKENS) <= {p.family for p in got}
    assert pr.pairs(["qwen3"]) == [pr.PeerPair("qwen3", pr.SHARED_QWEN3), pr.PeerPair("qwen3", "qwen3")]
    assert pr.pairs(["glm4moe", "llama-3"]) == [pr.PeerPair("glm-4.5", "glm4moe"), pr.PeerPair("llama-3", "llama3"),
                                                pr.PeerPair("llama-3", "llama3_1"), pr.PeerPair("llama-3", "llama3_2")]
    assert pr.spec_of(pr.SHARED_QWEN3) == FAMILIES["qwen3"]
    assert "gpt-oss" in pr.NOT_COMPARED and "gpt-oss" not in pr.PEER_FAMILIES


def test_an_unknown_family_is_refused_by_name():
    with pytest.raises(ConfigError, match="--families: nope not among the pairs"):
        pr.pairs(["qwen3", "nope"])


def test_every_mapped_name_is_in_the_renderers_registry():
    require_module("renderers")
    from renderers.configs import config_from_name

    for name in pr.PEER_FAMILIES:
        assert config_from_name(name).name == name


def test_missing_renderers_is_a_config_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "renderers", None)  # what an environment without the package imports
    with pytest.raises(ConfigError, match=r"renderers==0\.1\.12 \(pip install -e '\.\[bench\]'\)"):
        pr.require_renderers()


def test_count_mismatches_counts_differing_refused_and_reference_refused_cases():
    from transformers import AutoTokenizer

    from ctxkit.text.rendering.renderer import render
    from ctxkit.text.tokenizer.loader import load_tokenizer

    folder = str(tokenizer_dir("qwen2.5-instruct"))
    tok, hf = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    chat = ({"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."})
    cases = [pr.Case("chat", chat, None, False), pr.Case("chat+gp", chat + ({"role": "user", "content": "2+2?"},), None,
                                                          True),
             pr.Case("reference refuses", chat, None, False)]

    def reference(c):
        if c.name == "reference refuses":
            raise ValueError("refused")
        return hf.apply_chat_template(list(c.messages), tokenize=True, add_generation_prompt=c.add_generation_prompt,
                                      return_dict=False)

    def ctxkit(c):
        return render(list(c.messages), tok, add_generation_prompt=c.add_generation_prompt).token_ids

    def without_last(c):
        return reference(c)[:-1]

    def refuses_gp(c):
        if c.add_generation_prompt:
            raise KeyError("no generation prompt")
        return reference(c)

    got = pr.count_mismatches(cases, reference, {"ctxkit": ctxkit, "short": without_last, "no gp": refuses_gp})
    assert got["ctxkit"] == pr.SideCount("ctxkit", 2, 0, 0, 1)
    assert got["short"] == pr.SideCount("short", 2, 2, 0, 1, ("chat", "chat+gp"))
    assert got["no gp"] == pr.SideCount("no gp", 2, 0, 1, 1, (), ("chat+gp: KeyError: 'no generation prompt'",))


def test_deepseek_v3_generated_conversations_ctxkit_equal_renderers_differs_with_the_generation_prompt(tmp_path):
    require_module("renderers")
    require_module("trl")
    sides = pr.load_sides(pr.PeerPair("deepseek-v3", "deepseekv3"), shared_path(), tmp_path)
    row = pr.correctness(sides, [])
    assert row.peer_error is None
    assert row.generated["ctxkit"] == pr.SideCount("ctxkit", 6, 0, 0, 4)
    assert row.generated[pr.PEER] == pr.SideCount(pr.PEER, 6, 3, 0, 4, ("chat+gp", "no-system+gp", "reasoning+gp"))
    assert row.trajectories["ctxkit"] == pr.SideCount("ctxkit", 0, 0, 0, 0)


@pytest.mark.parametrize("family", ["gemma4", "gemma4_v3"])
def test_every_shared_trajectory_renders_in_gemma4_s_format_with_exact_ids(family, tmp_path):
    """The real trajectories' assistant turns hold content and calls (OpenAI's form); Gemma 4 writes that content
    after the tool responses once they follow, so the turn is located without it (`turn_find._without_moved_content`):
    ctxkit's ids equal `apply_chat_template` on all 16 episodes and none is refused (11 were, before)."""
    require_module("renderers")
    require_module("trl")
    sides = pr.load_sides(pr.PeerPair("gemma4", family), shared_path(), tmp_path)
    row = pr.correctness(sides, pr.trajectory_cases(shared_path("trajectories")))
    assert row.trajectories["ctxkit"] == pr.SideCount("ctxkit", 16, 0, 0, 0)


def test_the_command_prints_the_correctness_table_for_one_family(capsys):
    require_module("renderers")
    require_module("trl")
    shared_path("tokenizers", "qwen2.5-instruct")
    assert pr.main(["--families", "glm4moe", "--episodes", "0", "--no-speed"]) == 0
    out = capsys.readouterr().out
    assert "not compared: gpt-oss:" in out
    row = next(line for line in out.splitlines() if line.startswith("glm-4.5"))
    assert row.split() == ["glm-4.5", "glm4moe", "0/10", "2/10", "0/0", "0/0", "0/0"]
    assert "glm4moe renderers gen differ: tools, tools+gp" in out


def test_whole_episode_arms_keep_the_sampled_ids_where_qwen3_rewrites_its_history(tmp_path):
    require_module("renderers")
    require_module("trl")
    from ctxkit.benchmarks import peer_episodes as pe

    sides = pr.load_sides(pr.PeerPair("qwen3", pr.SHARED_QWEN3), shared_path(), tmp_path)

    def ref(messages, tools, agp):
        return pr.reference_ids(sides, messages, tools, agp)

    got = pe.episode_speed(sides, ref, turns=3, repeats=1, template_kwargs={"date_string": pr.DATE_STRING})
    assert [a.name for a in got.arms] == list(pe.ARMS)
    assert got.turns == 3 and got.repeats == 1
    assert got.errors == {"note " + pe.CONCAT: "TRL's prefix-preserving training template (the stock one is not)"}
    by = {a.name: a for a in got.arms}
    # Qwen3 drops the empty think block of earlier turns when it re-renders; every arm keeps the sampled ids
    for arm in (pe.CTXKIT, pe.BRIDGE, pe.CONCAT):
        assert (by[arm].turns_equal, by[arm].turns_extending, by[arm].turns_as_ctxkit) == (0, 3, 3), arm
    assert by[pe.BRIDGE].fallbacks == 0
    assert (by[pe.FLOOR].turns_equal, by[pe.FLOOR].turns_extending) == (None, None)
    table = pe.speed_table([got])
    assert "shared:qwen3  renderers bridge_to_next_turn" in table and "0/3      3/3       3/3          0" in table


@pytest.mark.parametrize("family", ["gemma4", "gemma4_v5"])
def test_gemma4_episodes_sample_the_calls_alone_and_every_arm_renders_them(family, tmp_path):
    """Gemma 4 writes a tool-call turn's content after its results, so the synthetic episode's assistant turns
    carry their calls only (said in a note), as a policy samples them; ctxkit's ids then equal
    `apply_chat_template` at every turn, as the bridge's and TRL's do (a message holding calls and content
    with one set of sampled ids is refused: `tests/text/test_template_families.py`)."""
    require_module("renderers")
    require_module("trl")
    from ctxkit.benchmarks import peer_episodes as pe

    sides = pr.load_sides(pr.PeerPair("gemma4", family), shared_path(), tmp_path)

    def ref(messages, tools, agp):
        return pr.reference_ids(sides, messages, tools, agp)

    got = pe.episode_speed(sides, ref, turns=3, repeats=1, template_kwargs={"date_string": pr.DATE_STRING})
    assert got.errors["note episode turns"].startswith("assistant turns carry their calls only")
    by = {a.name: a for a in got.arms}
    for arm in (pe.CTXKIT, pe.BRIDGE, pe.CONCAT):
        assert (by[arm].turns_equal, by[arm].turns_extending, by[arm].turns_as_ctxkit) == (3, 3, 3), arm


def test_tool_suffix_is_what_the_tool_message_adds_after_the_end_of_turn():
    from transformers import AutoTokenizer

    from ctxkit.benchmarks import peer_episodes as pe

    hf = AutoTokenizer.from_pretrained(str(tokenizer_dir("qwen2.5-instruct")))
    suffix = pe.tool_suffix(hf, [{"role": "tool", "content": "ok"}], hf.eos_token_id, "read")
    assert hf.decode(suffix) == "\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_a_real_episode_is_timed_through_the_pair_s_tokenizer(tmp_path):
    require_module("renderers")
    require_module("trl")
    from ctxkit.benchmarks import peer_episodes as pe
    from ctxkit.benchmarks.workload import episode_workloads

    sides = pr.load_sides(pr.PeerPair("llama-3", "llama3_1"), shared_path(), tmp_path)
    path = shared_path("trajectories", "sweagent__pydicom-1458.traj")
    wl = episode_workloads(str(path), sides.tok, sides.tpl, select="0")[0]

    def ref(messages, tools, agp):
        return pr.reference_ids(sides, messages, tools, agp)

    got = pe.episode_speed(sides, ref, repeats=1, template_kwargs={"date_string": pr.DATE_STRING}, source=wl)
    assert (got.episode, got.turns, got.errors) == ("sweagent__pydicom-1458.traj#sweagent__pydicom-1458", 12, {})
    by = {a.name: a for a in got.arms}
    assert (by[pe.CTXKIT].turns_equal, by[pe.CTXKIT].turns_extending) == (12, 12)
    assert (by[pe.CONCAT].turns_equal, by[pe.CONCAT].turns_extending) == (12, 12)
    assert (by[pe.BRIDGE].turns_equal, by[pe.BRIDGE].fallbacks) == (11, 1)
