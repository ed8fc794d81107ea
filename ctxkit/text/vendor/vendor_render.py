"""Rendering through a vendor renderer: `render(messages, tok, template="vendor:<name>")` lands here.

The ids are the vendor's (`VendorOracle.encode`). The loss mask is derived from prefix renders through the
same vendor, never from markers: for each assistant message `i`, the turn's ids are what the render of
`messages[:i+1]` adds to the render of `messages[:i]` with the generation prompt (which must be a prefix
of it), and the turn is found in the full render after the previous one. Where the full render rewrote the
turn (harmony drops the analysis of a turn that a later final message closes), the turn is the longest part
of its end found right behind the generation prompt's ids (`<|start|>assistant`); a vendor without a
generation prompt (Mistral) has no such anchor. Where adding the turn rewrites the render before it (a
harmony final message drops the analysis of the tool-call turns before it), the turn's ids are the
vendor's render of the turn's own messages (`HarmonyOracle.turn_ids`). A turn that cannot be found either
way is a `VendorRenderError` (never an all-zero mask); so is sampled `token_ids` on a message (the vendor
renders text only). Masked tokens have role `assistant`; a trailing generation prompt (the full render past
the render without it) has role `generation_prompt`; every other token is `scaffold`, and only assistant
messages get non-empty spans (a vendor render is not split per message here).

Special-token text inside content is encoded as plain text by both vendors (mistral-common and harmony
never parse it), where a Hugging Face template's tokenization would parse it as the special token.

Cost: two vendor renders per assistant turn besides the full one, so a whole episode costs quadratic time in
its turns (50 turns: ~0.6 s through harmony, ~0.13 s through mistral-v7 on this 2-core machine); a vendor
renderer is an oracle and a reference path, not the incremental one.

`tokenizer`, when given, must be the vendor's own vocabulary: it must encode a probe text and the vendor's
render of a small conversation to the same ids (the shared Mistral v0.3 folder for `mistral-v3`,
`tiktoken:o200k_harmony` for harmony), else a `ConfigError`. The context's `template_id` names the vendor
and its package version (`vendor:mistral-v7/mistral-common-1.13.1@sha256:...`), so a log records which
renderer was followed.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ctxkit.errors import ConfigError, VendorRenderError
from ctxkit.text.chat_messages import validate_message
from ctxkit.text.rendering.output import MessageSpan, RenderedContext, context_hash
from ctxkit.text.vendor.oracle import VendorOracle, load_vendor

_PROBE = [{"role": "user", "content": "Probe: naïve 3 × 3 = 9? 你好"}, {"role": "assistant", "content": "Yes 🎉"}]


_CHECKED: set[tuple[str, str]] = set()


def check_tokenizer(oracle: VendorOracle, tokenizer: Any) -> None:
    """A `ConfigError` unless `tokenizer` (a ctxkit `Tokenizer`) gives the vendor's ids on a probe conversation
    (checked once per vendor and tokenizer id)."""
    key = (oracle.template_id, str(getattr(tokenizer, "id", id(tokenizer))))
    if key in _CHECKED:
        return
    ids = oracle.encode(_PROBE, None, False)
    try:
        mine = list(tokenizer.encode(oracle.decode(ids)))
    except Exception as exc:  # noqa: BLE001 - any tokenizer failure means it is not the vendor's
        raise ConfigError(f"tokenizer {getattr(tokenizer, 'id', tokenizer)!r} cannot encode {oracle.template_id}'s "
                          f"render: {exc}") from exc
    if mine != ids:
        raise ConfigError(f"tokenizer {getattr(tokenizer, 'id', tokenizer)!r} is not the vocabulary of "
                          f"{oracle.template_id} (ids of a probe render differ); pass tokenizer=None to use "
                          f"the vendor's own ({oracle.tokenizer_id})")
    _CHECKED.add(key)


def render_vendor(messages: Sequence[Mapping[str, Any]], spec: str, tools: Sequence[Mapping[str, Any]] | None = None,
                  add_generation_prompt: bool = False, tokenizer: Any = None) -> RenderedContext:
    """The `RenderedContext` of `messages` rendered by vendor `spec` (`vendor:<name>`), see the module docstring."""
    oracle = load_vendor(spec)
    if tokenizer is not None:
        check_tokenizer(oracle, tokenizer)
    msgs: list[dict] = []
    call_ids: set[str] = set()
    for i, m in enumerate(messages):
        clean, sampled = validate_message(m, i, call_ids, 1 << 31)
        if sampled is not None:
            raise VendorRenderError(oracle.name, "sampled token_ids are not taken by a vendor renderer (it renders "
                                    "text); render with the Hugging Face template to keep sampled ids", i)
        msgs.append(clean)
    tools = None if tools is None else list(tools)
    ids = oracle.encode(msgs, tools, add_generation_prompt)
    mask = [0] * len(ids)
    roles = ["scaffold"] * len(ids)
    spans = [MessageSpan(i, m["role"], 0, 0) for i, m in enumerate(msgs)]
    preserving = True
    cursor = 0
    last = len(msgs) - 1
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prompt = oracle.encode(msgs[:i], tools, True)
        whole = oracle.encode(msgs[: i + 1], tools, False, history=not (i == last and not add_generation_prompt))
        history = not (i == last and not add_generation_prompt)
        if whole[: len(prompt)] == prompt:
            turn = whole[len(prompt):]
        elif hasattr(oracle, "turn_ids"):  # the turn rewrote earlier history (harmony: analysis dropped)
            turn = oracle.turn_ids(msgs, i, tools, history=history)
        else:
            raise VendorRenderError(oracle.name, "cannot derive the assistant turn's loss mask: the render with this "
                                    "turn does not extend the render before it with the generation prompt", i)
        at = _find(ids, turn, cursor)
        if at < 0 and turn:  # history rewritten (harmony drops the analysis of a turn a later final closes)
            at, turn = _rewritten(ids, turn, _generation_prompt(oracle, msgs[:i], tools, prompt), cursor)
        if not turn or at < 0:
            raise VendorRenderError(oracle.name, "cannot derive the assistant turn's loss mask: its ids "
                                    f"({len(turn)} tokens) are not in the full render after token {cursor}", i)
        preserving = preserving and ids[: len(whole)] == whole
        for p in range(at, at + len(turn)):
            mask[p], roles[p] = 1, "assistant"
        spans[i] = MessageSpan(i, "assistant", at, at + len(turn))
        cursor = at + len(turn)
    if add_generation_prompt:
        plain = oracle.encode(msgs, tools, False, history=True)
        if ids[: len(plain)] == plain:
            for p in range(len(plain), len(ids)):
                roles[p] = "generation_prompt"
    token_ids = tuple(ids)
    return RenderedContext(token_ids=token_ids, loss_mask=tuple(mask), roles=tuple(roles), spans=tuple(spans),
                           drifts=(), template_id=oracle.template_id,
                           tokenizer_id=getattr(tokenizer, "id", None) or oracle.tokenizer_id,
                           prefix_preserving=preserving, hash=context_hash(token_ids))


def _generation_prompt(oracle: VendorOracle, before: list[dict], tools: Any, prompt: list[int]) -> list[int]:
    """The ids the generation prompt adds to the render of `before` (empty when it adds none, or when the
    render without it is not a prefix of `prompt`)."""
    base = oracle.encode(before, tools, False, history=True) if before else []
    return prompt[len(base):] if base and prompt[: len(base)] == base else []


def _rewritten(ids: list[int], turn: list[int], opener: list[int], cursor: int) -> tuple[int, list[int]]:
    """Where the full render writes an assistant turn whose history form it rewrote: the longest proper
    suffix of `turn` found after `cursor` right behind the generation prompt's ids (`opener`, which must be
    non-empty: without one nothing anchors the turn). `(-1, turn)` when none is."""
    g = len(opener)
    if not g:
        return -1, turn
    for k in range(1, len(turn)):
        tail = turn[k:]
        p = _find(ids, tail, cursor + g)
        while p >= 0:
            if ids[p - g : p] == opener:
                return p, tail
            p = _find(ids, tail, p + 1)
    return -1, turn


def _find(ids: list[int], run: list[int], start: int) -> int:
    """The first position >= `start` where `run` occurs in `ids`, or -1."""
    n = len(run)
    if not n:
        return -1
    first = run[0]
    p = start
    while True:
        try:
            p = ids.index(first, p)
        except ValueError:
            return -1
        if ids[p : p + n] == run:
            return p
        p += 1


__all__ = ["check_tokenizer", "render_vendor"]
