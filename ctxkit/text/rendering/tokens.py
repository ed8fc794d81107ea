"""Bringing a renderer's ids up to date with a new rendered text, re-encoding only after the last stable
special-token boundary.

Part of `ctxkit.text.rendering.renderer`: `retokenize` updates `RenderState.ids`, `starts`, `sp_ends` and `sp_tok`
for the new text. A segmentable tokenizer encodes the text from the last special token before the first
difference with the old text; with a safe turn opener (`segments.safe_opener`) it goes segment by segment
through the shared `SegmentCache` and shifts the ids of a tail a splice kept (`splice.tail_tokens`).
"""

from __future__ import annotations

import bisect
from typing import Any, Mapping

from ctxkit.text.rendering.segments import SegmentCache, encode_segments
from ctxkit.text.rendering.splice import append_tail, tail_tokens
from ctxkit.text.rendering.state import RenderState


def common_prefix(text: str, prev: str) -> int:
    """Length of the longest common prefix of two texts (by bisection: memcmp-speed slices)."""
    if text.startswith(prev):
        return len(prev)
    lo, hi = 0, min(len(text), len(prev))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text[:mid] == prev[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def retokenize(st: RenderState, tokenizer: Any, segments: SegmentCache | None, opener: str | None,
               special_len: Mapping[int, int], text: str) -> int:
    """Bring the ids and starts of `st` up to date with `text`; return the char offset from which labels may
    change. `opener`: the safe turn opener when `segments` are shared, else None."""
    common = common_prefix(text, st.text)
    if not tokenizer.segmentable:
        ids, starts = tokenizer.encode_with_offsets(text)
        st.ids, st.starts, st.sp_ends, st.sp_tok = ids, starts, [], []
        st.text = text
        return 0
    sp_ends = st.sp_ends
    j = bisect.bisect_right(sp_ends, common)
    b = sp_ends[j - 1] if j else 0
    k = st.sp_tok[j - 1] if j else 0
    if opener is not None:  # segment by segment, re-using ids of segments seen before or a kept tail
        encode_from(st, tokenizer, segments, opener, special_len, text, b, j, k)
    else:
        ids, starts, sp_tok = st.ids, st.starts, st.sp_tok
        del ids[k:], starts[k:], sp_ends[j:], sp_tok[j:]
        new_ids, new_starts = tokenizer.encode_with_offsets(text[b:], at_start=(b == 0))
        for n in [n for n, tid in enumerate(new_ids) if tid in special_len]:  # specials are few
            sp_ends.append(b + new_starts[n] + special_len[new_ids[n]])
            sp_tok.append(k + n + 1)
        ids.extend(new_ids)
        starts.extend(map(b.__add__, new_starts)) if b else starts.extend(new_starts)
    st.text = text
    return b


def encode_from(st: RenderState, tokenizer: Any, segments: SegmentCache, opener: str,
                special_len: Mapping[int, int], text: str, b: int, j: int, k: int) -> None:
    """`retokenize` with a turn-opener cut (`segments.encode_segments`): drop the tokens from token `k`
    (special token `j`) on and encode `text` from char `b`, shifting the ids of a kept tail when a splice
    left one."""
    tail = tail_tokens(st, tokenizer, opener, b, len(text)) if st.kept_tail is not None else None
    out = (st.ids, st.starts, st.sp_ends, st.sp_tok)
    del out[0][k:], out[1][k:], out[2][j:], out[3][j:]
    end = len(text) if tail is None else tail[0]
    encode_segments(segments, tokenizer, text[b:end], b, opener, special_len, out)
    if tail is not None:
        append_tail(st, *tail)
