"""The one mutable state of an `IncrementalRenderer`: `RenderState`, every field documented once.

Part of `ctxkit.text.rendering.renderer`. The renderer holds a `RenderState` (`IncrementalRenderer.state`) and
its configuration (tokenizer, template, profile, special-token policy, segment caches); each step of a
render is a function over the state that takes the configuration it needs explicitly: tokenizing
(`tokens`), producing the text (`window`, `splice`), locating and labelling (`mask`), cutting (`cut`) and
assembling the output (`output`).

The state has three parts. *Message-level* fields describe the messages held (cut with them by `cut`).
*Rendered-space* fields describe the last rendered text, its ids and labels (kept whole by `cut`: the next
render re-tokenizes and relabels only from where its text differs; dropped by `reset_rendered` after a
failed render). *Hints* describe one render only and are used up by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True, eq=False)
class RenderState:
    """What an `IncrementalRenderer` knows about its messages and its last render (see the module docstring)."""

    # -- message-level ---------------------------------------------------------------------------
    structural_ok: bool
    """Whether assistant turns may be located structurally (the template has a generation prompt and an
    end-of-turn token and no message text holds one of its markers)."""
    messages: list[dict] = field(default_factory=list)
    """The messages appended, as given."""
    chat: list[dict] = field(default_factory=list)
    """Their normalized chat dicts (`normalize_messages`), in order."""
    sampled: list[tuple[int, ...] | None] = field(default_factory=list)
    """Per message: the sampled `token_ids` of an assistant message, else None."""
    call_ids: set[str] = field(default_factory=set)
    """Tool-call ids made by the messages held (for the tool-result pairing check)."""
    specials: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    """Message index -> `(char, token)` of each special-token text in its content."""
    escape: bool = False
    """Some message whose role's policy escapes holds special-token text: tokenize with escapes."""
    marked_at: int | None = None
    """The message whose text turned structural location off (`structural_ok`), or None."""
    turn_text: dict[int, tuple[str, str] | None] = field(default_factory=dict)
    """Assistant message index -> `(head, produced text)` from prefix renders, or None (`mask.turn_text`), cached."""
    n_assistant: int = 0
    """Number of assistant messages held."""
    any_sampled: bool = False
    """Whether any message held carries sampled ids."""

    # -- rendered space ----------------------------------------------------------------------------
    text: str = ""
    """The last rendered text ("" after an escaped tokenization: no incremental reuse of it)."""
    ids: list[int] = field(default_factory=list)
    """Its token ids (before sampled-id substitution)."""
    starts: list[int] = field(default_factory=list)
    """Start char of each token in `text`."""
    sp_ends: list[int] = field(default_factory=list)
    """End char of each special token in `text`, in order."""
    sp_tok: list[int] = field(default_factory=list)
    """Per special token: the number of tokens up to and including it."""
    roles: list[str] = field(default_factory=list)
    """Per rendered token: its role (`TOKEN_ROLES`)."""
    mask: list[int] = field(default_factory=list)
    """Per rendered token: the loss mask (1 on produced tokens)."""
    regions: list[Any] = field(default_factory=list)
    """The located message regions (`mask.TextRegion`), in message order."""
    prefix_max: list[int] = field(default_factory=list)
    """Running max of region ends (monotonic, for bisect)."""
    final: Any = None
    """The region of the trailing generation prompt, if rendered."""
    located: int = 0
    """Number of messages whose regions are in `regions` (in order)."""
    new_at: int = 0
    """`regions[:new_at]` were kept from an earlier render by the last `mask.locate` (labelled before)."""
    gp_at: list[int] = field(default_factory=list)
    """Generation-prompt positions in the last located text (`mask.count_prompts`)."""
    unresolved: list[int] = field(default_factory=list)
    """Messages whose text was not found in the last render, ascending."""
    mode: str = ""
    """How the last render located assistant turns: `structural`, `turns`, or "" (none yet)."""
    hash_cp: list[tuple[int, Any]] = field(default_factory=list)
    """`(n, hash state of the output's first n ids)` checkpoints, by n (`output.resume_hash`)."""
    core: tuple[int, str] | None = None
    """`(m, render of the first m messages without the prompt)`: the base a suffix window extends."""
    core_marks: list[tuple[int, int]] = field(default_factory=list)
    """`(m, length of its core)` of earlier cores the current one extends (`cut.set_core`)."""
    head: str | None = None
    """Render of the first `reach` messages (see `window_delta`), or None."""
    reuse_bases: dict[bool, list[tuple[int, str, list[int], str, int, int, list[str] | None, dict | None]]] = field(
        default_factory=dict)
    """Generation-prompt flag -> the latest renders with that flag (`window.KEPT_BASES`), each `(m, text, ends,
    snapshot, offset, n, states, scans)`: a render of the first `n` messages through the marked template
    (`text.template.iteration_reuse`) whose main loop's first `m` iterations render messages `offset` to
    `offset + m - 1` as held now (`cut` lowers `m`), `ends[i]` the end char of iteration `i`'s text in `text`,
    `snapshot` the values the loop read (the offset among them), `states[i]` the carried namespaces' state at
    iteration `i`'s start (None when the template carries none), `scans` what its scans before the loop found
    (`text.template.scan_reuse.ScanRecord` by scan)."""
    text_memo: list[tuple[bool, list, str]] = field(default_factory=list)
    """The latest plain template renders, `(prompt flag, the chat dicts rendered, text)`: the same dicts (held,
    never changed) and flag render the same text, which locating the next turn asks for again."""
    subs: list[Any] = field(default_factory=list)
    """Sampled-id substitutions (`output.Sub`) of the last output, in order."""
    sub_cols: tuple[list, list, list, list] = field(default_factory=lambda: ([], [], [], []))
    """Per substitution, kept in step with `subs` (`output.assemble`): rendered end, cumulative shift after
    it, message index; and the positions in `subs` of those with a drift."""
    out: tuple[list, list, list] = field(default_factory=lambda: ([], [], []))
    """Output ids, mask and roles of the rendered tokens `[0, out_at)`."""
    out_at: int = 0
    """0, or the end of the last substitution that is not an identity."""
    span_list: list[Any] = field(default_factory=list)
    """Spans (`MessageSpan`) of the last output, in region order."""
    span_at: list[int] = field(default_factory=lambda: [0])
    """`span_at[i]`: the number of spans from `regions[:i]`."""
    span_dirty: int = 0
    """`regions[:i]` are unchanged since the last output for every `i <= span_dirty`."""

    # -- hints (each for one render) -----------------------------------------------------------
    splice: tuple[Any, int, int] | None = None
    """`(SpliceHint, a, s)` for the next render (`splice.expect_splice`), or None."""
    last_agp: bool | None = None
    """The `add_generation_prompt` of the last render (None before the first)."""
    kept_tail: tuple[int, int] | None = None
    """`(char in the old text, char in the new)` of a tail a splice kept, for the next tokenization."""
    tail_regions: tuple | None = None
    """`(old index of the first kept message, its regions on[, index shift])` kept by `splice`."""
    tail_map: tuple[int, int, int] | None = None
    """`(old token, new token, char shift)` of a kept tail's ids (`splice.append_tail`)."""
    tail_labels: tuple[int, int, int] | None = None
    """`(old token, new token, regions)` of a tail kept labelled (`splice.attach_tail`), for `mask.relabel`."""

    # -- counters ------------------------------------------------------------------------------
    window_renders: int = 0
    """Renders whose text came from a suffix window (`text.template.locality.window_delta`)."""
    full_renders: int = 0
    """Renders of the whole conversation through the template."""
    reuse_renders: int = 0
    """Renders that kept the main loop's earlier iterations from `reuse_base` (`window.reused_text`)."""
    splice_renders: int = 0
    """Renders whose text was spliced from the previous text and windows around a changed block."""
    tail_reuses: int = 0
    """Spliced renders that kept the tail's located regions and labels, shifted (`splice.attach_tail`)."""


def reset_rendered(st: RenderState) -> None:
    """Forget the rendered-space state and this render's hints (not the messages, `head` or the counters): the
    next render starts from scratch rather than from half-updated state."""
    st.text, st.roles, st.mask = "", [], []
    st.ids, st.starts, st.sp_ends, st.sp_tok = [], [], [], []
    st.regions, st.prefix_max, st.unresolved = [], [], []
    st.final, st.located, st.mode, st.core = None, 0, "", None
    st.reuse_bases = {}
    st.new_at, st.gp_at = 0, []
    st.hash_cp = []
    st.subs, st.out, st.out_at = [], ([], [], []), 0
    st.span_list, st.span_at, st.span_dirty = [], [0], 0
    st.kept_tail = st.tail_regions = st.tail_map = st.tail_labels = None
