"""What a chat template does through one tokenizer, found once and cached: its `TemplateProfile`.

The facts rendering, `check_template` and windowed rendering rely on: the generation prompt and the
special tokens in it, the end-of-turn token, BOS handling, prefix preservation per role transition,
tool and reasoning support, a default system prompt, and locality (whether appending messages may be
rendered from a suffix window, and how far a message's rendering looks at its neighbours). They are
probed by rendering small conversations (`probe_conversation`, plus conversations of many shapes for
locality) and cached per (tokenizer id, template id, render limits): `template_profile(tokenizer, template)`.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any

from ctxkit.errors import TemplateError
from ctxkit.text.template.iteration_reuse import ReusePlan, reuse_plan
from ctxkit.text.template.locality import Locality, locality_scan, trailing_prompt, window_delta
from ctxkit.text.template.chat_template import ChatTemplate, normalize_messages, plain_value


@dataclass(frozen=True)
class TemplateProfile:
    """Facts about a template rendered through one tokenizer (see the module docstring).

    When the probe conversation is rejected by the template (`probe_error` set), the probed fields hold
    conservative values: no generation prompt, the tokenizer's EOS as end of turn, not prefix-preserving."""

    tokenizer_id: str
    """Id of the tokenizer."""
    template_id: str
    """Id of the template."""
    generation_prompt: str
    """Text `add_generation_prompt=True` appends (e.g. `<|im_start|>assistant\\n`); empty if none."""
    end_of_turn: str | None
    """Special-token text that closes an assistant turn (`<|im_end|>`, `</s>`), None if none."""
    end_of_turn_id: int | None
    """Its id."""
    markers: tuple[str, ...]
    """Special tokens inside the generation prompt and end-of-turn text, sorted."""
    turn_closers: tuple[str, ...]
    """Special tokens that close a turn in the probe render (each one right before a turn opener or at the
    end), `end_of_turn` first: gpt-oss closes an assistant turn with `<|return|>` only when it is the last
    one, with `<|end|>` in history and `<|call|>` after a tool call."""
    turn_starts: tuple[str, ...]
    """The first special token a message of each role starts with in the probe (GLM-4: `<|user|>`,
    `<|assistant|>`, `<|observation|>`): where an assistant turn ends when the template closes it with no
    token of its own (no `end_of_turn`)."""
    turn_opener: str | None
    """First special token of the generation prompt (opens a turn), None if it has none."""
    prefix_preserving: bool
    """Each context an agent sees (the render before an assistant turn, with the generation prompt) is a
    prefix of the render of every longer history, so consecutive steps extend each other."""
    message_prefix_preserving: bool
    """Stricter: the render of n messages is a prefix of the render of n+1, for every message."""
    failed_transitions: tuple[str, ...]
    """Role transitions `a->b` at which a prefix check failed."""
    supports_tools: bool
    """The tool schemas and tool calls show up in the render."""
    supports_reasoning: bool
    """An assistant turn's `reasoning_content` shows up in the render (when it is the last turn)."""
    bos_token: str | None
    """BOS token the render starts with, if any."""
    bos_duplication_risk: bool
    """The render starts with BOS while the tokenizer adds BOS when encoding with special tokens."""
    generation_markers: bool
    """The text holds `{% generation %}` markers (ctxkit does not need them)."""
    default_system_prompt: str | None
    """System text the template inserts when the conversation has no system message."""
    locality: Locality
    """Whether windowed rendering is exact, and the neighbour reach (`Locality.reach`)."""
    reuse: ReusePlan
    """Whether a render may keep the main loop's earlier iterations (`text.template.iteration_reuse`)."""
    template_specials: tuple[str, ...] = ()
    """The tokenizer's special tokens the template's source writes literally, sorted (DeepSeek V3's
    `<｜tool▁outputs▁end｜>`: a closer the probe conversation never shows)."""
    notes: tuple[str, ...] = ()
    """Anything that failed while probing (e.g. the template rejects the tool probe)."""
    probe_error: str | None = None
    """The `TemplateError` message if the template rejected the probe conversation itself."""


def probe_conversation(tools: bool = True, reasoning: bool = True) -> tuple[list[dict], list[dict] | None]:
    """A small conversation covering every role transition, tool calls (two in one turn) and reasoning.

    Tool-call ids are 9 characters (Mistral's rule) and user/assistant turns alternate."""
    tool_schemas = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            },
        }
    ]
    msgs: list[dict] = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "Summarize a.txt and b.txt."},
    ]
    if tools:
        msgs += [
            {
                "role": "assistant",
                "content": "",
                **({"reasoning_content": "I should read both files."} if reasoning else {}),
                "tool_calls": [
                    {"id": "call00001", "type": "function", "function": {"name": "read_file", "arguments": {"path": "a.txt"}}},
                    {"id": "call00002", "type": "function", "function": {"name": "read_file", "arguments": {"path": "b.txt"}}},
                ],
            },
            {"role": "tool", "tool_call_id": "call00001", "content": "alpha"},
            {"role": "tool", "tool_call_id": "call00002", "content": "beta"},
        ]
    msgs += [
        {"role": "assistant", "content": "a.txt says alpha, b.txt says beta.",
         **({"reasoning_content": "Both read."} if reasoning else {})},
        {"role": "user", "content": "Thanks. Anything else?"},
        {"role": "assistant", "content": "No."},
    ]
    return msgs, (tool_schemas if tools else None)


_PROFILES: dict[tuple, TemplateProfile] = {}
_PROFILES_MAX = 64
_PROFILES_LOCK = threading.Lock()


def template_profile(tokenizer, template: ChatTemplate) -> TemplateProfile:
    """The profile of `template` rendered through `tokenizer` (computed once per tokenizer id and
    template id, and render limits; the 64 most recent are kept)."""
    key = (getattr(tokenizer, "id", str(tokenizer)), template.id, template.limits)
    with _PROFILES_LOCK:
        hit = _PROFILES.get(key)
    if hit is not None:
        return hit
    profile = _build_profile(tokenizer, template)
    with _PROFILES_LOCK:
        if len(_PROFILES) >= _PROFILES_MAX:
            _PROFILES.pop(next(iter(_PROFILES)))
        _PROFILES[key] = profile
    return profile


def template_locality(tokenizer, template: ChatTemplate) -> Locality:
    """Whether `window_delta` is exact for `template` through `tokenizer`: `template_profile(...).locality`.

    Local when the syntax tree shows no use of the whole message list (`scan_locality`) and, on probe
    conversations of several shapes grown one to three messages at a time, every windowed render (with
    and without the generation prompt) equals the full render, and the full render raises wherever the
    windowed one would have given text."""
    return template_profile(tokenizer, template).locality


def _build_profile(tok, tpl: ChatTemplate) -> TemplateProfile:
    try:
        facts = _probe_facts(tok, tpl)
    except TemplateError as exc:
        facts = dict(generation_prompt="", end_of_turn=tok.eos_token, prefix_preserving=False,
                     message_prefix_preserving=False, failed_transitions=(), supports_tools=False,
                     supports_reasoning=False, bos_token=None, bos_duplication_risk=False,
                     default_system_prompt=None, notes=(), probe_error=str(exc))
    gp, eot = facts["generation_prompt"], facts["end_of_turn"]
    markers = tuple(sorted({p for p, special in tok.split_special(gp + (eot or "")) if special}))
    opener = next((p for p, special in tok.split_special(gp) if special), None)
    closers = tuple(dict.fromkeys([eot] if eot else []) | dict.fromkeys(facts.pop("closers", ())))
    return TemplateProfile(
        tokenizer_id=getattr(tok, "id", str(tok)), template_id=tpl.id,
        end_of_turn_id=tok.special_tokens.get(eot) if eot else None, markers=markers, turn_opener=opener,
        template_specials=tuple(sorted(t for t in tok.special_tokens if t and t in tpl.source)),
        turn_closers=closers, turn_starts=facts.pop("starts", ()),
        generation_markers=tpl.has_generation_markers, locality=_locality(tpl),
        reuse=reuse_plan(tpl.source, frozenset(tpl.variables)), **facts,
    )


def _probe_facts(tokenizer, template: ChatTemplate) -> dict[str, Any]:
    """The probed fields of `TemplateProfile` (raises `TemplateError` if the template rejects the probe)."""
    notes: list[str] = []
    eos = getattr(tokenizer, "eos_token", None)
    bos = getattr(tokenizer, "bos_token", None)
    specials = getattr(tokenizer, "special_tokens", {}) or {}

    def render(msgs, tools=None, agp=False):
        return template.render_text(msgs, tools=tools, add_generation_prompt=agp)

    # Which probe the template accepts: with tools, then without.
    msgs, tools = probe_conversation(tools=True)
    supports_tools = False
    try:
        full = render(msgs, tools)
        schema_name = tools[0]["function"]["name"]
        supports_tools = schema_name in render(msgs[:2], tools) and "b.txt" in full
    except TemplateError as exc:
        notes.append(f"tool probe rejected: {exc}")
    if not supports_tools:
        msgs, tools = probe_conversation(tools=False)
        full = render(msgs, tools)

    failed: list[str] = []
    starts: dict[str, None] = {}
    decision_ok = True
    message_ok = True
    for n in range(1, len(msgs)):
        nxt = msgs[n]["role"]
        transition = f"{msgs[n - 1]['role']}->{nxt}"
        longer = render(msgs[: n + 1], tools)
        try:
            plain = render(msgs[:n], tools)
        except TemplateError as exc:  # Qwen3.5 refuses a system prompt alone: no user query yet
            notes.append(f"render of the first {n} probe message(s) rejected: {exc}")
            continue
        if not longer.startswith(plain):
            message_ok = False
            failed.append(transition)
        else:
            first = next((p for p, special in tokenizer.split_special(longer[len(plain) :]) if special), None)
            if first is not None:
                starts.setdefault(first)
        if nxt == "assistant":
            ctx = render(msgs[:n], tools, agp=True)
            if not all(render(msgs[:m], tools).startswith(ctx) for m in range(n + 1, len(msgs) + 1)):
                decision_ok = False
                failed.append(f"{transition} (generation prompt)")

    base = render(msgs[:2], tools)
    generation_prompt = ""
    with_prompt = render(msgs[:2], tools, agp=True)
    if with_prompt.startswith(base):
        generation_prompt = with_prompt[len(base) :]
    else:
        notes.append("add_generation_prompt does not extend the render")

    # End of turn: the special token closing the last assistant turn.
    end_of_turn = None
    last = render(msgs, tools)
    before = render(msgs[:-1], tools, agp=True)
    turn = last[len(before) :] if last.startswith(before) else last
    turn_marker = msgs[-1]["content"]
    tail = turn[turn.rfind(turn_marker) + len(turn_marker) :] if turn_marker in turn else turn
    for piece, is_special in tokenizer.split_special(tail):
        if is_special:
            end_of_turn = piece
            break
    if end_of_turn is None and eos and eos in tail:
        end_of_turn = eos

    supports_reasoning = False
    reasoning_at = next((i for i, m in enumerate(msgs) if m.get("reasoning_content") == "Both read."), None)
    if reasoning_at is not None:
        supports_reasoning = "Both read." in render(msgs[: reasoning_at + 1], tools)

    default_system = None
    user_text = msgs[1]["content"]
    bare = render(msgs[1:2], None)
    head = bare.split(user_text)[0] if user_text in bare else ""
    for piece, is_special in tokenizer.split_special(head):
        text = piece.strip()
        if text.startswith("system\n"):
            text = text[len("system\n") :].strip()
        if not is_special and text and text not in ("system", "user", "assistant"):
            default_system = text
            break

    starts_with_bos = bool(bos) and full.startswith(bos)
    adds_bos = False
    if hasattr(tokenizer, "encode_model_input"):  # a ctxkit Tokenizer: no transformers load
        adds_bos = bool(bos) and bos in specials and tokenizer.encode_model_input("x")[:1] == [specials[bos]]
    elif (hf := getattr(tokenizer, "hf", None)) is not None and bos and bos in specials:
        try:
            adds_bos = hf("x", add_special_tokens=True)["input_ids"][:1] == [specials[bos]]
        except Exception:  # pragma: no cover - backend quirks
            adds_bos = False
    closers = _closers(tokenizer, full, generation_prompt)
    if supports_tools and closers:  # a tool-call turn rendered last ends with its own closer (Gemma 4: `<|tool_response>`)
        closers += tuple(c for c in _closers(tokenizer, render(msgs[:3], tools), generation_prompt) if c not in closers)
    return dict(
        closers=closers, starts=tuple(starts),
        generation_prompt=generation_prompt, end_of_turn=end_of_turn, prefix_preserving=decision_ok,
        message_prefix_preserving=message_ok, failed_transitions=tuple(failed), supports_tools=supports_tools,
        supports_reasoning=supports_reasoning, bos_token=bos if starts_with_bos else None,
        bos_duplication_risk=starts_with_bos and adds_bos, default_system_prompt=default_system,
        notes=tuple(notes), probe_error=None,
    )


def _closers(tokenizer, full: str, gp: str) -> tuple[str, ...]:
    """The special tokens of `full` (a render) followed, after whitespace only, by the generation prompt's
    first special token (the turn opener) or by the end of the text, in order of first appearance (the
    text's first token excepted)."""
    opener = next((p for p, special in tokenizer.split_special(gp) if special), None)
    if opener is None:
        return ()
    pieces = tokenizer.split_special(full)
    out: dict[str, None] = {}
    for k, (piece, special) in enumerate(pieces):
        if not special or k == 0:  # a special token that starts the text is a BOS, not a closer
            continue
        nxt = k + 1
        if nxt < len(pieces) and not pieces[nxt][1] and not pieces[nxt][0].strip():
            nxt += 1
        if nxt == len(pieces) or pieces[nxt] == (opener, True):
            out.setdefault(piece)
    return tuple(p for p in out if p != opener)


# ----------------------------------------------------------------------------------- locality


def _locality(tpl: ChatTemplate) -> Locality:
    reason, reach = locality_scan(tpl.source)
    prompt = trailing_prompt(tpl.source)
    if not reason:
        reason, prompt = _probe_locality(tpl, reach, prompt)
    return Locality(local=not reason, reason=reason or "", reach=reach, prompt=prompt if not reason else None)


def _locality_conversations(seed: int = 7) -> list[tuple[list[dict], list[dict] | None]]:
    """Conversations of several shapes for the locality probe: system present/absent, tools or not,
    plain and tool-calling assistant turns (one to three calls), runs of tool results, reasoning."""
    rng = random.Random(seed)
    words = "alpha beta gamma delta file test run — naïve 你好 🎉 {\"k\": 1}".split(" ")
    _, schemas = probe_conversation(tools=True)

    def text() -> str:
        return "" if rng.random() < 0.1 else " ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))

    out = []
    for c in range(24):
        tools = schemas if c % 2 else None
        msgs: list[dict] = []
        if c % 4 < 2:
            msgs.append({"role": "system", "content": text() or "Be brief."})
        msgs.append({"role": "user", "content": text() or "Go."})
        ncall = 0
        while len(msgs) < 10 + c % 5:
            r = rng.random()
            if msgs[-1]["role"] in ("user", "tool") and r < 0.5 and tools is not None:
                calls = []
                for _ in range(rng.choice([1, 1, 2, 3])):
                    ncall += 1
                    calls.append({"id": f"call{ncall:05d}", "type": "function",
                                  "function": {"name": "read_file", "arguments": {"path": f"f{ncall}.txt"}}})
                turn = {"role": "assistant", "content": rng.choice(["", text()]), "tool_calls": calls}
                if rng.random() < 0.3:
                    turn["reasoning_content"] = text() or "hmm"
                msgs.append(turn)
                msgs += [{"role": "tool", "tool_call_id": call["id"], "content": text()} for call in calls]
            elif msgs[-1]["role"] in ("user", "tool"):
                turn = {"role": "assistant", "content": text() or "Done."}
                if rng.random() < 0.3:
                    turn["reasoning_content"] = text() or "ok"
                msgs.append(turn)
            else:
                msgs.append({"role": "user", "content": text() or "More."})
        out.append((msgs, tools))
    return out


def _probe_locality(tpl: ChatTemplate, reach: int, prompt: str | None) -> tuple[str | None, str | None]:
    """`(reason, prompt)`: why windows are not exact on the probe (None if they are), and `prompt`
    unless some probe render with the generation prompt is not the one without it plus `prompt`."""
    rng = random.Random(11)
    for msgs, tools in _locality_conversations():
        chat = normalize_messages(msgs)
        tools_plain = None if tools is None else plain_value(list(tools), "tools")
        render = lambda c, agp, _t=tools_plain: tpl.render_chat(c, tools=_t, add_generation_prompt=agp)  # noqa: E731
        full: dict[tuple[int, bool], str | None] = {}

        def whole(n: int, agp: bool) -> str | None:
            if (n, agp) not in full:
                try:
                    full[(n, agp)] = render(chat[:n], agp)
                except TemplateError:
                    full[(n, agp)] = None
            return full[(n, agp)]

        m = 3
        while m < len(chat):
            n = min(len(chat), m + rng.choice([1, 1, 2, 3]))
            core = whole(m, False)
            if core is not None:
                for agp in (False, True):
                    try:
                        got = window_delta(render, chat[:n], m, core, agp, reach=reach)
                    except TemplateError:
                        got = None
                    if got is None:
                        continue
                    if got != (whole(n, False), whole(n, agp)):
                        return f"probe: a windowed render of {n} messages differs from the full render", None
            plain, with_prompt = whole(n, False), whole(n, True)
            if prompt is not None and (plain is None or with_prompt != plain + prompt):
                prompt = None
            m = n
    return None, prompt


__all__ = ["TemplateProfile", "probe_conversation", "template_locality", "template_profile"]
