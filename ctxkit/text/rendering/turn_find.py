"""Where an assistant message's produced text lies in a render: part of `ctxkit.text.rendering.mask`.

`find_turn` takes the turn's text from prefix renders (`mask.turn_text`) and finds it in the whole render:
behind its head, as a kept tail (a turn the template continues after tool responses), without content the
template moved after the messages that follow (Gemma 4), or between a head and the first turn closer.
`tool_result_inside_turn` refuses a render that writes a tool result inside the produced text.
"""

from __future__ import annotations

from ctxkit.errors import RenderError
from ctxkit.text.chat_messages import message_text


def past_closers(text: str, e: int, closers: tuple[str, ...]) -> int:
    """`e` moved past the turn closers written right after it (Command R7B ends a reply with
    `<|END_RESPONSE|><|END_OF_TURN_TOKEN|>`, both sampled)."""
    moved = True
    while moved:
        moved = False
        for c in closers:
            if text.startswith(c, e):
                e += len(c)
                moved = True
    return e


def _first_closer(text: str, closers: tuple[str, ...], start: int) -> tuple[int, int]:
    """`(position, end)` of the first turn closer in `text` from `start`, `(-1, -1)` when there is none."""
    best = (-1, -1)
    for c in closers:
        pos = text.find(c, start)
        if pos >= 0 and (best[0] < 0 or pos < best[0]):
            best = (pos, pos + len(c))
    return best


_SPLIT_TURN = ("(the model continues its turn once the results are in): one message's sampled ids cannot hold its "
               "calls and that content; give the calls with their sampled ids, then the content as the next "
               "assistant message")
"""Why a message holding calls and content the template writes after the results cannot carry sampled ids."""


def tool_result_inside_turn(text: str, body: str, out: list, i: int, template_id: str, chat: list) -> None:
    """`RenderError` when tool result `i`, found nowhere after the assistant turn before it, lies inside that
    turn's produced text (Gemma 4 writes tool responses inside the model turn): its tokens would be
    marked as sampled. Where the turn's own content follows the result (Gemma 4 writes a tool-call turn's
    content there), the error says how to give such a turn."""
    last = next((r for r in reversed(out) if r.kind == "produced"), None)
    if last is None or not (0 <= (at := text.find(body, last.start, last.end)) and at + len(body) <= last.end):
        return
    why = f"message {i} (tool): template {template_id} renders the tool result inside assistant turn {last.index}'s text"
    content = message_text(chat[last.index].get("content")).strip()  # templates may trim it
    if content and text.find(content, at + len(body), last.end) >= 0:
        raise RenderError(f"{why}, and that turn's content after it {_SPLIT_TURN}")
    raise RenderError(f"{why}; cannot derive a loss mask that leaves it out")


def turn_heads(head: str, markers: tuple[str, ...]) -> list[str]:
    """The prefixes of `head` that end at a special-token boundary (`markers`) or at its end, longest first."""
    cuts = _special_cuts(head, markers) | {len(head)}
    return [head[:n] for n in sorted(cuts, reverse=True) if n > 0]


def _special_cuts(text: str, markers: tuple[str, ...]) -> set[int]:
    """The char offsets where a special token of `text` (`markers`) starts or ends."""
    cuts: set[int] = set()
    for m in markers:
        at = text.find(m) if m else -1
        while at >= 0:
            cuts.update((at, at + len(m)))
            at = text.find(m, at + 1)
    return cuts


def find_turn(text: str, found: tuple[str, str] | None, heads: list[str], closers: tuple[str, ...], opener: str,
               cursor: int, i: int, template_id: str, starts: tuple[str, ...] = (),
               specials: tuple[str, ...] = (), moved: tuple[str, bool] = ("", False)) -> tuple[int, int, str]:
    """`(s, e, head)`: the char range of assistant message `i`'s produced text in `text`, from `cursor`, and the
    head written before it. Its text from prefix renders (`found`, see `turn_text`) behind `heads[0]` where
    the render holds it; else what the render writes between the next head and the first turn closer after
    it (the template re-renders the turn, e.g. drops its reasoning and the prompt's prefilled `<think>`, or
    rewrites it once more messages follow), the head being the longest of `heads` written there. A template
    with no closers (GLM-4) ends the turn where the next message starts (`starts`) or at the end of the text.
    `moved`: the message's content and whether it carries sampled ids (`_without_moved_content`)."""
    head = heads[0] if heads else ""
    if found is not None:
        turn = found[1]
        # Prefer the turn behind its head: the bare turn text (e.g. just the end-of-turn
        # token of an empty reply) may also close the previous message.
        s = text.find(head + turn, cursor) + len(head) if head else -1
        if s < len(head) or not head:
            s = text.find(turn, cursor)
        if s >= 0:
            return s, s + len(turn), head
        if (kept := _kept_tail(text, turn, cursor, opener, closers, specials)) is not None:
            return kept[0], kept[1], ""
        if (bare := _without_moved_content(text, turn, cursor, moved, i, template_id)) is not None:
            return bare[0], bare[1], head if text[max(0, bare[0] - len(head)) : bare[0]] == head else ""
    if opener and len(heads) > 1:  # a bare turn opener (Gemma's `<|turn>`) may open another role's turn
        heads = [h for h in heads if h != opener]
    at = text.find(heads[-1], cursor) if heads and (closers or starts) else -1
    if at >= 0 and not closers:
        head = next(h for h in heads if text.startswith(h, at))
        s = at + len(head)
        e = _first_closer(text, starts, s)[0]
        e = len(text) if e < 0 else e
        if e <= s:
            raise RenderError(f"message {i}: the assistant turn rendered by template {template_id} is empty; "
                              "cannot locate it for the loss mask")
        return s, e, head
    if at >= 0:
        head = next(h for h in heads if text.startswith(h, at))  # the longest head written there
        s = at + len(head)
        e, end = _first_closer(text, closers, s)
        if e < 0 or (opener and text.find(opener, s, e) >= 0):
            raise RenderError(
                f"message {i}: no end-of-turn {' or '.join(map(repr, closers))} closes the assistant turn rendered "
                f"by template {template_id}; cannot locate it for the loss mask"
            )
        return s, past_closers(text, end, closers), head
    if found is None:
        raise RenderError(f"message {i}: cannot derive the assistant turn's text from prefix renders of template "
                          f"{template_id}")
    raise RenderError(
        f"message {i}: the assistant turn is not rendered as sampled by template "
        f"{template_id} (it rewrites history); cannot locate it for the loss mask"
    )


def _without_moved_content(text: str, turn: str, cursor: int, moved: tuple[str, bool], i: int,
                           template_id: str) -> tuple[int, int] | None:
    """`(s, e)` of the turn without its content, when the template writes that content later once more messages
    follow (Gemma 4 writes a tool-call turn's content after its tool responses): the calls and their closer
    are the turn's produced text there, and the content stays unmasked. A turn given with sampled ids is
    refused then (they hold the content where the render does not): `RenderError` saying how to give it."""
    content, sampled = moved
    content = content if turn.count(content) == 1 else content.strip()  # templates may trim it
    if not content or turn.count(content) != 1:
        return None
    bare = turn.replace(content, "", 1)
    s = text.find(bare, cursor) if bare.strip() else -1
    if s < 0 or text.find(content, s + len(bare)) < 0:
        return None
    if sampled:
        raise RenderError(f"message {i}: template {template_id} writes the assistant turn's content after the "
                          f"messages that follow it {_SPLIT_TURN}")
    return s, s + len(bare)


def _kept_tail(text: str, turn: str, cursor: int, opener: str | None, closers: tuple[str, ...],
               specials: tuple[str, ...]) -> tuple[int, int] | None:
    """`(s, e)` of the longest tail of `turn` (its text as rendered last) that starts right after one of its
    special tokens, does not open a turn, holds more than closers and whitespace, and is written at or after
    `cursor` before the next turn opens; None when there is none. A template that continues the model turn
    after tool responses and drops the reasoning it wrote for the last turn (Gemma 4 v5) renders the turn in
    history as such a tail."""
    ends = {c for c in _special_cuts(turn, specials) if any(m and turn.endswith(m, 0, c) for m in specials)}
    for c in sorted(ends - {len(turn)}):
        tail = turn[c:]
        body = tail
        for cl in closers:
            body = body.replace(cl, "")
        if not body.strip():
            break  # shorter tails are only closers
        if opener and tail.lstrip().startswith(opener):
            continue  # a turn of its own (gpt-oss's final after its analysis): the head search below places it
        s = text.find(tail, cursor)
        if s >= 0 and not (opener and text.find(opener, cursor, s) >= 0):
            return s, s + len(tail)
    return None


# -- special tokens in content -------------------------------------------------------------------


__all__ = ["find_turn", "past_closers", "tool_result_inside_turn", "turn_heads"]
