"""Whole episodes rendered turn by turn: ctxkit vs `renderers`' bridge vs TRL's GRPO token concatenation.

The episode is `bench render`'s synthetic one (`episode`: per turn an assistant tool call, whose sampled ids
are the template's own encoding of it, and a ~300-word tool result) through one pair's tokenizer
(`peer_renderers.load_sides`). The first prompt (system, user) is rendered by every arm untimed. Then per
turn, after the assistant turn and its tool result, each arm produces the ids of the next prompt, timed:

- `CTXKIT`: `IncrementalRenderer.extend` (the assistant message carrying its sampled `token_ids`) + `render`
  with the generation prompt;
- `BRIDGE`: `renderers`' `bridge_to_next_turn(previous prompt, sampled ids, tool messages)`, and where it
  returns None (it cannot prove the extension) its full `render_ids`, as its contract asks; fallbacks counted;
- `CONCAT`: TRL's GRPO multi-turn rule: previous prompt + sampled ids + the ids the tool messages add, taken
  from two `apply_chat_template` renders of a small conversation (a user turn and an assistant tool call,
  then the same with the tool messages and the generation prompt; the first cut after its last end of
  sequence), which is how TRL 1.x extends a rollout (written here from its description, not copied);
- `FLOOR`: encoding only each turn's new text (`workload.encode_only_times`), the physical limit.

Passes are interleaved (the arm order rotates every repeat) in one process; per-turn times are medians over
the repeats (`summarize_times`). Every arm's ids are compared at every turn with `apply_chat_template` of
the whole history with the generation prompt (untimed).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

CTXKIT = "ctxkit IncrementalRenderer"
BRIDGE = "renderers bridge_to_next_turn"
CONCAT = "TRL GRPO token concatenation"
FLOOR = "encode only the new text"
ARMS = (CTXKIT, BRIDGE, CONCAT, FLOOR)
"""Arm names, in table order."""


@dataclass(frozen=True)
class ArmSpeed:
    """One arm over one episode."""

    name: str
    """One of `ARMS`."""
    timing: Any
    """`workload.Timing`: whole-episode total, p50/p90/p99/max per turn."""
    vs_floor: float
    """This arm's total / `FLOOR`'s total."""
    vs_ctxkit: float
    """This arm's total / `CTXKIT`'s total (above 1: ctxkit is faster)."""
    turns_equal: int | None
    """Turns whose ids equal `apply_chat_template`'s re-render of the whole history (None for `FLOOR`, which
    makes no ids). A template that rewrites history (Qwen3 drops the empty think block of earlier turns)
    differs there from every arm that keeps the sampled ids."""
    turns_extending: int | None
    """Turns whose ids start with the previous prompt's ids and the turn's sampled ids (None for `FLOOR`)."""
    turns_as_ctxkit: int | None
    """Turns whose ids equal `CTXKIT`'s (None for `FLOOR`, and for every arm when ctxkit did not run)."""
    fallbacks: int = 0
    """`BRIDGE` only: turns the bridge returned None and the full render ran."""


@dataclass(frozen=True)
class EpisodeSpeed:
    """One pair's whole-episode figures."""

    pair: Any
    """`peer_renderers.PeerPair`."""
    turns: int
    """Timed turns."""
    final_tokens: int
    """Tokens of the last prompt (transformers')."""
    repeats: int
    """Repeats of each pass."""
    arms: list[ArmSpeed] = field(default_factory=list)
    """Per arm (those that ran)."""
    errors: dict[str, str] = field(default_factory=dict)
    """Arm (or `episode`) -> why it did not run; `note <arm>` keys say how an arm ran."""
    episode: str = "synthetic"
    """`synthetic` or the workload's name."""


def tool_suffix(hf: Any, messages: Sequence[dict], eos_id: int | None, name: str = "tool", **kwargs: Any) -> list[int]:
    """Ids `messages` (tool results) add after an assistant turn, by TRL's GRPO rule (see the module
    docstring; `name`: the tool called, which some templates print); `ValueError` when the short render is
    not a prefix of the long one."""
    small = [{"role": "user", "content": "dummy"},
             {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                                                                  "function": {"name": name, "arguments": {}}}]}]
    short = list(hf.apply_chat_template(small, tokenize=True, add_generation_prompt=False, return_dict=False, **kwargs))
    long = list(hf.apply_chat_template(small + list(messages), tokenize=True, add_generation_prompt=True,
                                       return_dict=False, **kwargs))
    if eos_id is not None and eos_id in short:
        short = short[: len(short) - short[::-1].index(eos_id)]
    if long[: len(short)] != short:
        raise ValueError("the short render is not a prefix of the long one")
    return long[len(short):]


def episode_speed(sides: Any, reference: Callable[[list, Any, bool], list[int]], *, turns: int = 40,
                  repeats: int = 3, seed: int = 0, template_kwargs: Mapping[str, Any] | None = None,
                  source: Any = None, progress=None) -> EpisodeSpeed:
    """Time the four arms over the synthetic episode of `turns` turns through `sides`
    (`peer_renderers.PairSides`; module docstring). `reference(messages, tools, add_generation_prompt)`: the
    `apply_chat_template` ids every arm is compared with; `template_kwargs`: what else transformers' renders
    get (TRL's suffix renders too). `source`: a `workload.Workload` (a real episode, its assistant turns made
    into offline steps through this pair's tokenizer) timed instead of the synthetic episode."""
    kwargs = dict(template_kwargs or {})
    # lazy: the benchmark helpers load pins and importers, only when a pair is timed
    from ctxkit.benchmarks.workload import cold_start, encode_only_times, summarize_times
    from ctxkit.text.rendering.renderer import IncrementalRenderer  # lazy: L3 entry point

    say = progress or (lambda msg: None)
    tok, tpl, hf, peer = sides.tok, sides.tpl, sides.hf, sides.peer
    errors: dict[str, str] = {}
    episode_name = "synthetic" if source is None else source.name
    try:
        if source is not None:
            head, steps, tools = workload_episode(source)
            as_text = None
        else:
            head, steps, tools, as_text, calls_only = _synthetic(turns, tok, tpl, seed, reference)
            if calls_only:
                errors["note episode turns"] = ("assistant turns carry their calls only: the template writes a "
                                                "call's content after its results, sampled after them")
        if as_text:
            errors["note episode"] = "tool-call arguments given as JSON text (the template refuses objects)"
        refs = [reference(h, tools, True) for h in _histories(head, steps)]
        first = reference(head, tools, True)
        deltas = _new_texts(tpl, [head] + _histories(head, steps), tools)
    except Exception as exc:  # noqa: BLE001 - an episode a side cannot render is reported, not raised
        return EpisodeSpeed(sides.pair, 0, 0, repeats, errors={"episode": f"{type(exc).__name__}: {exc}"[:300]},
                            episode=episode_name)
    eos_id = hf.eos_token_id
    concat_template, concat_note = trl_template(hf)
    if concat_note:
        errors["note " + CONCAT] = concat_note
    try:  # compile the template once untimed, as every other arm's configuration is warm
        tool_suffix(hf, steps[0][1], eos_id, tools=tools, chat_template=concat_template, **kwargs)
    except Exception:  # noqa: BLE001 - the timed pass reports the same failure
        pass

    def ctxkit_pass(record):
        cold_start(tok)
        r = IncrementalRenderer(tok, tpl, tools, special_tokens="allow")
        r.extend(head)
        r.render(add_generation_prompt=True)
        times = []
        for assistant, results, sampled in steps:
            turn = [dict(assistant[0], token_ids=sampled), *results]
            t0 = time.perf_counter()
            r.extend(turn)
            ids = r.render(add_generation_prompt=True).token_ids
            times.append(time.perf_counter() - t0)
            record.append(list(ids))
        return times, 0

    def bridge_pass(record):
        prev = list(peer.render_ids(head, tools=tools, add_generation_prompt=True))
        msgs, times, fallbacks = list(head), [], 0
        for assistant, results, sampled in steps:
            t0 = time.perf_counter()
            b = peer.bridge_to_next_turn(prev, sampled, results, tools=tools)
            msgs += assistant + results
            if b is None:
                fallbacks += 1
                ids = list(peer.render_ids(msgs, tools=tools, add_generation_prompt=True))
            else:
                ids = list(b.token_ids)
            times.append(time.perf_counter() - t0)
            record.append(ids)
            prev = ids
        return times, fallbacks

    def concat_pass(record):
        prev, times = list(first), []
        for assistant, results, sampled in steps:
            calls = assistant[0].get("tool_calls") or [{"function": {"name": "tool"}}]
            t0 = time.perf_counter()
            ids = prev + sampled + tool_suffix(hf, results, eos_id, calls[0]["function"]["name"], tools=tools,
                                               chat_template=concat_template, **kwargs)
            times.append(time.perf_counter() - t0)
            record.append(ids)
            prev = ids
        return times, 0

    def floor_pass(record):
        return encode_only_times(tok, deltas), 0

    passes = {CTXKIT: ctxkit_pass, BRIDGE: bridge_pass, CONCAT: concat_pass, FLOOR: floor_pass}
    if peer is None:
        errors[BRIDGE] = f"renderers could not create {sides.pair.renderer!r}: {sides.peer_error}"
        del passes[BRIDGE]
    times: dict[str, list] = {k: [] for k in passes}
    ids: dict[str, list] = {k: [] for k in passes}
    fallbacks: dict[str, int] = {}
    order = list(passes)
    for rep in range(repeats):
        for name in order[rep % len(order):] + order[: rep % len(order)]:
            if name in errors:
                continue
            record: list = []
            try:
                t, fb = passes[name](record)
            except Exception as exc:  # noqa: BLE001 - an arm that fails is reported, the others still run
                errors[name] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            times[name].append(t)
            fallbacks[name] = fb
            if rep == 0:
                ids[name] = record
        say(f"{sides.pair.family}: repeat {rep + 1}/{repeats}")
    tm = {k: summarize_times(v) for k, v in times.items() if v and k not in errors}
    floor = tm[FLOOR].total_s if FLOOR in tm else 0.0
    ck = tm[CTXKIT].total_s if CTXKIT in tm else 0.0
    arms = []
    for name in ARMS:
        if name not in tm:
            continue
        t = tm[name]
        got = ids.get(name) or []
        prevs = [first] + got[:-1]
        ext = sum(g[: len(p) + len(st[2])] == p + st[2] for g, p, st in zip(got, prevs, steps))
        mine = ids.get(CTXKIT) if CTXKIT in tm else None
        counts = (None, None, None) if name == FLOOR else (
            sum(a == b for a, b in zip(got, refs)), ext, None if mine is None else sum(a == b for a, b in zip(got, mine)))
        arms.append(ArmSpeed(name, t, t.total_s / floor if floor else float("inf"),
                             t.total_s / ck if ck else float("inf"), *counts, fallbacks.get(name, 0)))
    return EpisodeSpeed(sides.pair, len(steps), len(refs[-1]) if refs else 0, repeats, arms, errors, episode_name)


def episode(turns: int, tok: Any, tpl: Any, seed: int = 0, string_arguments: bool = False,
            calls_only: bool = False) -> tuple[list[dict], list[tuple], list[dict]]:
    """`(head, steps, tools)`: `synthetic_episode.build_episode` with each turn as `([assistant], [tool
    result], sampled ids)`; the arguments stay objects (GLM's template iterates them) unless
    `string_arguments` (JSON text: DeepSeek's template concatenates them), each tool result names its tool,
    and the sampled ids are ctxkit's `encode_assistant_turn` of the assistant message. `calls_only`: the
    assistant messages carry their calls and no content (`content_follows_results`)."""

    from ctxkit.benchmarks.synthetic_episode import build_episode  # lazy: the render benchmark's episode
    from ctxkit.text.rendering.renderer import encode_assistant_turn  # lazy: L3 entry point

    head, pairs, tools = build_episode(turns, seed)
    steps = []
    for assistant, result in pairs:
        if string_arguments:
            assistant = dict(assistant, tool_calls=[
                dict(c, function=dict(c["function"], arguments=json.dumps(c["function"]["arguments"])))
                for c in assistant["tool_calls"]])
        result = dict(result, name=assistant["tool_calls"][0]["function"]["name"])
        if calls_only:
            assistant = dict(assistant, content=None)
        steps.append(([assistant], [result], list(encode_assistant_turn(assistant, tok, tpl, tools))))
    return head, steps, tools


def _synthetic(turns: int, tok: Any, tpl: Any, seed: int, reference) -> tuple[list, list, list, bool, bool]:
    """`episode(...)` with object arguments, or JSON-text ones where the template refuses objects (the fourth
    value), and calls only where the template writes a call's content after its results (the fifth)."""
    try:
        head, steps, tools = episode(1, tok, tpl, seed)
        reference(_histories(head, steps)[0], tools, True)
        as_text = False
    except Exception:  # noqa: BLE001 - the template wants the arguments as JSON text
        as_text = True
    head, steps, tools = episode(1, tok, tpl, seed, string_arguments=as_text)
    calls_only = content_follows_results(tpl, head, steps[0], tools)
    return (*episode(turns, tok, tpl, seed, string_arguments=as_text, calls_only=calls_only), as_text, calls_only)


def content_follows_results(tpl: Any, head: list[dict], step: tuple, tools: Any) -> bool:
    """Whether the template writes a tool-call turn's content after the turn's tool results (Gemma 4: the
    model continues its turn once the results are in). A policy then samples the calls alone first, and its
    content comes as the next assistant message."""
    (assistant,), results, _ = step
    text = tpl.render_text([*head, assistant, *results], tools=tools)
    content, result = assistant.get("content") or "", results[0]["content"]
    at = text.rfind(result)
    return bool(content) and at >= 0 and text.find(content, at + len(result)) >= 0


def workload_episode(wl: Any) -> tuple[list[dict], list[tuple], list[dict] | None]:
    """`(head, steps, tools)` of a `workload.Workload`: per turn the assistant message, the messages up to
    the next turn, and the step's sampled ids."""
    steps = [(wl.chats(t[:1]), wl.chats(t[1:]), list(t[0].token_ids)) for t in wl.turns]
    return wl.chats(wl.head), steps, wl.tools_or_none


def _histories(head: list, steps: Sequence[tuple]) -> list[list[dict]]:
    out, msgs = [], list(head)
    for assistant, results, _ in steps:
        msgs = msgs + assistant + results
        out.append(msgs)
    return out


def _new_texts(tpl: Any, histories: Sequence[list], tools) -> list[str]:
    """Per turn, the rendered text (generation prompt added) after its common prefix with the previous
    prompt's: what a renderer must newly tokenize (computed untimed; the first history is the first prompt)."""
    texts = [tpl.render_text(h, tools=tools, add_generation_prompt=True) for h in histories]
    return [b[len(os.path.commonprefix([a, b])):] for a, b in zip(texts, texts[1:])]


def trl_template(hf: Any) -> tuple[str | None, str | None]:
    """`(chat_template, note)`: the template TRL's GRPO trainer renders tool turns with: the tokenizer's own,
    or, where that is not prefix-preserving, `trl.chat_template_utils.get_training_chat_template`'s
    replacement (as the trainer does at start); note says which when it is replaced or trl is missing."""
    try:
        # lazy: trl is optional (the train extra) and heavy
        from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving
    except ImportError:
        return None, "trl is not installed: the stock template is used"
    try:
        if is_chat_template_prefix_preserving(hf):
            return None, None
        return get_training_chat_template(hf), "TRL's prefix-preserving training template (the stock one is not)"
    except Exception as exc:  # noqa: BLE001 - TRL refusing the template leaves the stock one
        return None, f"TRL's template check raised ({type(exc).__name__}: {str(exc)[:120]}): the stock template is used"


def speed_table(results: Sequence[EpisodeSpeed]) -> str:
    """Per pair and arm: total, ratios to the floor and to ctxkit, p50/p99 per turn, turns with equal ids."""
    from ctxkit.benchmarks.bench_tables import table  # lazy: plain-text tables

    header = ["template", "arm", "total s", "vs floor", "vs ctxkit", "p50 ms", "p99 ms", "= hf re-render",
              "extends", "= ctxkit", "fallbacks"]
    cells, notes = [], []
    for r in results:
        for a in r.arms:
            cells.append([r.pair.family, a.name, f"{a.timing.total_s:.3f}", f"{a.vs_floor:.1f}x",
                          "-" if a.vs_ctxkit == float("inf") else f"{a.vs_ctxkit:.2f}x",
                          f"{a.timing.p50_ms:.2f}", f"{a.timing.p99_ms:.2f}",
                          *("-" if v is None else f"{v}/{r.turns}"
                            for v in (a.turns_equal, a.turns_extending, a.turns_as_ctxkit)),
                          str(a.fallbacks) if a.name == BRIDGE else "-"])
        for arm, why in r.errors.items():
            notes.append(f"  {r.pair.family} {arm[5:]}: {why}" if arm.startswith("note ")
                         else f"  {r.pair.family} {arm}: not run: {why}")
    turns = sorted({r.turns for r in results if r.turns})
    names = sorted({r.episode for r in results})
    reps = sorted({r.repeats for r in results})
    title = (f"whole episodes rendered turn by turn ({', '.join(names)}, {'/'.join(map(str, turns)) or '-'} turns, per-turn "
             f"medians of {'/'.join(map(str, reps))} repeats; vs ctxkit above 1: ctxkit faster)")
    return "\n".join([title, table(header, cells, left=(0, 1)), *notes])


__all__ = ["ARMS", "ArmSpeed", "BRIDGE", "CONCAT", "CTXKIT", "EpisodeSpeed", "FLOOR", "episode_speed", "speed_table",
           "tool_suffix"]
