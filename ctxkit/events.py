"""Immutable, typed events: the only things an episode log holds.

One frozen dataclass per concept, tagged by its `kind`. Chat-shaped events follow the OpenAI/HF message
shape (role, content, tool_calls with id/name/arguments, tool messages with tool_call_id).

Every event carries `seq` (0-based position in the log), `id` and `ts` (unix seconds). They are `None`
on an event you build; `EventLog.append` fills them in and returns the recorded copy.

Fields with a closed vocabulary are checked when an event is built (`__post_init__`), so a bad value never
reaches a log: `Message.role` (`ROLES`), `Step.logprob_kind` (`LOGPROB_KINDS` or None), `Step.finish_reason`
(`FINISH_REASONS` or None), `ToolResult.status` (`TOOL_STATUSES`), `EpisodeEnd.outcome` (`END_OUTCOMES`) and
`EpisodeEnd.reward_kind` (`REWARD_KINDS`). A bad value is an `EventFormatError` naming the field, the value
and the allowed ones; `event_from_dict` turns it into a `LogFormatError` (the log reader adds file and line).
A `Step`'s per-token lists are checked the same way: `logprobs`, `raw_logprobs` and `kept_set`, when given, hold
one entry per `token_ids` entry, else an `AlignmentError` (an `EventFormatError`) names the field and both lengths.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Mapping, Union
import hashlib
import orjson

from ctxkit.content import check_content, flatten_content
from ctxkit.errors import AlignmentError, EventFormatError, LogFormatError, MessageFormatError
from ctxkit.edits import Edit, edit_from_dict, edit_to_dict
from ctxkit.kept_set import KeptSet, kept_set_from_dict, kept_set_to_dict

SCHEMA_VERSION = 1
"""Version of the event schema written in every log header."""

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = Role.__args__  # type: ignore[attr-defined]

LogprobKind = Literal["raw", "processed", "recomputed", "none"]
"""Which distribution a log-prob is from: `raw` model softmax at temperature 1, `processed` after the
sampling transforms (temperature, top-k/top-p/min-p) that sampling actually used, `recomputed` by a
trainer's forward pass. `none` states that no behaviour log-probs exist: an offline step made from a
saved trajectory (`ctxkit.training.offline_steps`), whose `logprobs` are None by construction; such steps serve
supervised training, not importance-weighted RL (a live step without log-probs leaves the kind None)."""

LOGPROB_KINDS: tuple[str, ...] = LogprobKind.__args__  # type: ignore[attr-defined]

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call", "abort", "error"]
"""Why sampling stopped, in the OpenAI/vLLM vocabulary: `stop` (end of turn, EOS or a stop string), `length`
(max tokens), `tool_calls` (OpenAI chat: the turn ends in tool calls), `content_filter`, `function_call`
(OpenAI's deprecated form of `tool_calls`), `abort` (vLLM/SGLang: the request was cancelled, or the client
gave up, e.g. a timeout), `error` (vLLM: the engine failed mid-request). An engine speaking another dialect
(Anthropic `end_turn`/`max_tokens`, TGI `eos_token`) must be mapped onto these by the agent that calls it."""
FINISH_REASONS: tuple[str, ...] = FinishReason.__args__  # type: ignore[attr-defined]

ToolStatus = Literal["ok", "error", "timeout"]
TOOL_STATUSES: tuple[str, ...] = ToolStatus.__args__  # type: ignore[attr-defined]
EndOutcome = Literal["terminated", "truncated"]
END_OUTCOMES: tuple[str, ...] = EndOutcome.__args__  # type: ignore[attr-defined]
RewardKind = Literal[
    "scored",
    "unscored",
    "tool_failure",
    "task_failure",
    "length_truncation",
    "limit_truncation",
    "constraint_violation",
]
REWARD_KINDS: tuple[str, ...] = RewardKind.__args__  # type: ignore[attr-defined]

Content = Union[str, tuple[Mapping[str, Any], ...], None]
"""Message content: a string, a tuple of text parts `{"type": "text", "text": ...}`, or None."""


def check_choice(kind: str, field_name: str, value: Any, allowed: tuple, *, optional: bool = False) -> None:
    """`EventFormatError` unless `value` is one of `allowed` (or None when `optional`)."""
    if (value is None and optional) or (type(value) is str and value in allowed):
        return
    raise EventFormatError(kind, field_name, value, ((None,) if optional else ()) + tuple(allowed))


CLOSED_FIELDS: dict[str, tuple[tuple[str, tuple, bool], ...]] = {
    "message": (("role", ROLES, False),),
    "step": (("logprob_kind", LOGPROB_KINDS, True), ("finish_reason", FINISH_REASONS, True)),
    "tool_result": (("status", TOOL_STATUSES, False),),
    "episode_end": (("outcome", END_OUTCOMES, False), ("reward_kind", REWARD_KINDS, False)),
}
"""Event kind -> (field, allowed values, None allowed) of each closed-vocabulary field."""


def check_vocabulary(event: Any) -> None:
    """`EventFormatError` if a closed-vocabulary field of `event` holds a value outside its vocabulary: the
    check an event passed when it was built, run again where a log records it (a frozen dataclass can be
    forced with `object.__setattr__`)."""
    for name, allowed, optional in CLOSED_FIELDS.get(event.kind, ()):
        check_choice(event.kind, name, getattr(event, name), allowed, optional=optional)

@dataclass(frozen=True)
class ToolCall:
    """One tool call inside an assistant message."""

    id: str
    """Call id; a tool message answers it with the same `tool_call_id`."""
    name: str
    """Tool (function) name."""
    arguments: str | Mapping[str, Any]
    """Arguments exactly as given: the JSON text the model produced (kept verbatim, never re-serialized,
    recorded even when it is not valid JSON, as a policy may sample), or an object when the conversation gave
    one (HF style), so templates render it as the source did. `render()` of raw chat dicts, an edge where
    such text is a mistake, refuses arguments that are not JSON."""

    def arguments_text(self) -> str:
        """The arguments as JSON text: verbatim when given as text, else the object serialized."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI wire shape `{"id", "type": "function", "function": {"name", "arguments"}}`."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @cached_property
    def _hash(self) -> int:
        arguments = self.arguments
        if not isinstance(arguments, str):
            arguments = ("object", json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=repr))
        return hash((self.id, self.name, arguments))

    def __getstate__(self) -> dict[str, Any]:
        # the cached hash is this process's (string hashing is salted per process): never pickle it
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __hash__(self) -> int:
        # Object arguments are dicts, which do not hash: hash their canonical JSON (once per call object), so
        # a call, and every frozen record holding one (a view message keying a render cache), is hashable
        # either way. Equal calls hash equal: equal objects have equal canonical JSON.
        return self._hash


@dataclass(frozen=True, kw_only=True)
class EventBase:
    """Fields every event has; filled by the log on append."""

    seq: int | None = None
    """0-based position in the log (the header is not an event)."""
    id: str | None = None
    """Unique event id, `e<seq>-<8 hex>`."""
    ts: float | None = None
    """Unix time when the event was appended."""


@dataclass(frozen=True, kw_only=True)
class EpisodeStart(EventBase):
    """First event of an episode: what it is, the tools offered, and how contexts are built."""

    kind: Literal["episode_start"] = "episode_start"
    episode_id: str = ""
    """Stable id of the episode (task, seed, arm)."""
    tools: tuple[Mapping[str, Any], ...] = ()
    """Tool schemas offered to the policy, in the OpenAI `{"type": "function", "function": {...}}` shape."""
    task: Mapping[str, Any] = field(default_factory=dict)
    """Task name, seed and parameters (free-form, JSON-able)."""
    context: Mapping[str, Any] = field(default_factory=dict)
    """How contexts are built: tokenizer id, template id, compressor spec, budget (filled by the builder)."""
    sampler: Mapping[str, Any] = field(default_factory=dict)
    """Default sampling config and seed for the episode."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Anything else worth keeping (free-form, JSON-able)."""


@dataclass(frozen=True, kw_only=True)
class Message(EventBase):
    """A chat message not sampled by the policy: system, user, an imported assistant turn, or a tool reply."""

    kind: Literal["message"] = "message"
    role: Role = "user"
    content: Content = None
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls of an assistant message."""
    tool_call_id: str | None = None
    """For `role="tool"`: the id of the call this answers."""
    name: str | None = None
    """Optional author or tool name."""
    reasoning_content: str | None = None
    """Assistant reasoning text, for templates that render it (Qwen3 `<think>`)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Other keys of the original message, kept so import/export round-trips losslessly."""

    def __post_init__(self) -> None:
        check_choice(self.kind, "role", self.role, ROLES)


@dataclass(frozen=True, kw_only=True)
class Step(EventBase):
    """One policy decision: the context it saw, the tokens it sampled and how, and the message they decode to."""

    kind: Literal["step"] = "step"
    context_hash: str = ""
    """Hash of the rendered context the policy was given (`RenderedContext.hash`)."""
    context_length: int = 0
    """Number of tokens in that context."""
    token_ids: tuple[int, ...] = ()
    """Sampled token ids, including the end-of-turn token when the model emitted it."""
    logprobs: tuple[float, ...] | None = None
    """Log-prob of each sampled token, aligned with `token_ids`; None when the engine gave none."""
    logprob_kind: LogprobKind | None = None
    """Which distribution `logprobs` are from (see `LogprobKind`)."""
    raw_logprobs: tuple[float, ...] | None = None
    """Optional raw (temperature 1, unfiltered) log-probs when `logprobs` are processed ones."""
    sampling: Mapping[str, Any] = field(default_factory=dict)
    """Sampling config used: temperature, top_p, top_k, min_p, max_tokens, seed."""
    policy_version: str | int | None = None
    """Version of the weights that sampled (a training step or checkpoint id)."""
    finish_reason: FinishReason | None = None
    """Engine finish reason (see `FinishReason`): `stop`, `length`, `tool_calls`, `abort`, ..."""
    content: Content = None
    """Text content of the assistant message the tokens decode to."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls parsed from the sampled tokens."""
    reasoning_content: str | None = None
    """Reasoning text parsed from the sampled tokens, if any."""
    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds spent: `build`, `prefill`, `decode`, ... (free-form keys)."""
    kept_set: KeptSet | None = None
    """The sampler's kept support per sampled token (`ctxkit.kept_set.KeptSet`), when the engine gave it; left out
    of the event's dict (so of its line and id) when None (`OMITTED_WHEN_NONE`)."""

    def __post_init__(self) -> None:
        check_choice(self.kind, "logprob_kind", self.logprob_kind, LOGPROB_KINDS, optional=True)
        check_choice(self.kind, "finish_reason", self.finish_reason, FINISH_REASONS, optional=True)
        n_tokens = len(self.token_ids)
        if self.kept_set is not None:
            object.__setattr__(self, "kept_set", kept_set_from_dict(self.kept_set))
        for name in ("logprobs", "raw_logprobs", "kept_set"):
            values = getattr(self, name)
            if values is not None and len(values) != n_tokens:
                raise AlignmentError(self.kind, name, len(values), n_tokens)


@dataclass(frozen=True, kw_only=True)
class ToolResult(EventBase):
    """The raw result of one tool call (kept in full even when a view masks it)."""

    kind: Literal["tool_result"] = "tool_result"
    tool_call_id: str = ""
    """Id of the call this answers."""
    name: str | None = None
    """Tool name."""
    content: Content = None
    """The tool output as given to the policy."""
    status: ToolStatus = "ok"
    """`ok`, `error` (the tool failed; `content` says how) or `timeout`."""
    duration_s: float | None = None
    """Wall time the tool took."""

    def __post_init__(self) -> None:
        check_choice(self.kind, "status", self.status, TOOL_STATUSES)


@dataclass(frozen=True, kw_only=True)
class Pin(EventBase):
    """A constraint that must appear verbatim in every context while active."""

    kind: Literal["pin"] = "pin"
    pin_id: str = ""
    """Stable id of the pin; an `Unpin` names it."""
    text: str = ""
    """The exact text that must be visible."""
    source_event_id: str | None = None
    """The message the text comes from, if any."""
    rule: str | None = None
    """`explicit`, or the detector rule that found it, e.g. `constraint-rules-v1:prohibition`."""


@dataclass(frozen=True, kw_only=True)
class Unpin(EventBase):
    """Retires a pin (the constraint was lifted)."""

    kind: Literal["unpin"] = "unpin"
    pin_id: str = ""
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class Compaction(EventBase):
    """A compressor's decision. The view is rebuilt from these, so replay never re-runs a compressor."""

    kind: Literal["compaction"] = "compaction"
    compressor: str = ""
    """Versioned compressor name, e.g. `mask-observations-v1`."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """The compressor's parameters."""
    edits: tuple[Edit, ...] = ()
    """Edits to the view, typed records from `ctxkit.edits` (`DropEdit`, `MaskEdit`, ...), applied in order by
    `ctxkit.context.view`. Given as JSON objects `{"op": kind, ...}` (the on-disk shape), they are read into records;
    an unknown kind is a `LogFormatError` naming the known ones."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """Provenance: summarizer id/version, retrieval scores, token counts before/after."""

    def __post_init__(self) -> None:
        edits = self.edits
        if isinstance(edits, (str, bytes, Mapping)) or not isinstance(edits, (list, tuple)):
            raise LogFormatError(f"compaction {self.compressor!r}: 'edits' is {type(edits).__name__}; expected a list of edits")
        object.__setattr__(self, "edits", tuple(
            edit_from_dict(e, where=f"compaction {self.compressor!r}: edit {i}") for i, e in enumerate(edits)))


@dataclass(frozen=True, kw_only=True)
class StateSnapshot(EventBase):
    """Reference to an external-state snapshot in the content-addressed store beside the log."""

    kind: Literal["state_snapshot"] = "state_snapshot"
    adapter: str = ""
    """`directory` or `json`."""
    name: str = ""
    """Which piece of state (e.g. `workdir`)."""
    manifest_sha256: str = ""
    """sha256 of the snapshot manifest blob."""
    after_event_id: str | None = None
    """The event (usually a tool result) after which the state was captured."""


@dataclass(frozen=True, kw_only=True)
class EpisodeEnd(EventBase):
    """Why the episode ended and what it earned."""

    kind: Literal["episode_end"] = "episode_end"
    outcome: EndOutcome = "terminated"
    """`terminated`: the task itself ended. `truncated`: an external limit stopped collection."""
    cause: str = ""
    """Why: `answered`, `task_failed`, `tool_failed`, `max_steps`, `context_budget`, `wall_time`, ..."""
    reward: float | None = None
    """Numeric reward; None when unscored."""
    reward_kind: RewardKind = "unscored"
    """Where the reward comes from, so equal numbers with different meanings stay distinguishable."""
    scores: Mapping[str, Any] = field(default_factory=dict)
    """Scorer details (quality, violations, ...)."""

    def __post_init__(self) -> None:
        check_choice(self.kind, "outcome", self.outcome, END_OUTCOMES)
        check_choice(self.kind, "reward_kind", self.reward_kind, REWARD_KINDS)


Event = Union[EpisodeStart, Message, Step, ToolResult, Pin, Unpin, Compaction, StateSnapshot, EpisodeEnd]

EVENT_TYPES: dict[str, type] = {
    "episode_start": EpisodeStart,
    "message": Message,
    "step": Step,
    "tool_result": ToolResult,
    "pin": Pin,
    "unpin": Unpin,
    "compaction": Compaction,
    "state_snapshot": StateSnapshot,
    "episode_end": EpisodeEnd,
}
"""Registry of event kinds (an explicit dict)."""

_TUPLE_FIELDS = {"tools", "token_ids", "logprobs", "raw_logprobs", "edits", "tool_calls"}

OMITTED_WHEN_NONE: dict[str, tuple[str, ...]] = {"step": ("kept_set",)}
"""Event kind -> fields added after logs existed: absent from the event's dict when None, so an event without
them has the bytes and id it always had (and an old log reads back unchanged)."""


def _freeze_content(content: Any, where: str) -> Content:
    check_content(content, where)  # the one content rule (ctxkit.content)
    if isinstance(content, (list, tuple)):
        return tuple(dict(part) for part in content)
    return content


def content_text(content: Content) -> str:
    """The plain text of a message content (`ctxkit.content.flatten_content`: text parts joined without separator)."""
    return flatten_content(content)


def _tool_call_from(obj: Any, where: str) -> ToolCall:
    if isinstance(obj, ToolCall):
        return obj
    if not isinstance(obj, Mapping):
        raise MessageFormatError(f"{where}: tool call {obj!r} is not an object")
    fn = obj.get("function", obj)
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str) or not name:
        raise MessageFormatError(f"{where}: tool call has no function name")
    args = fn.get("arguments", "{}")
    if not isinstance(args, (str, Mapping)):
        raise MessageFormatError(f"{where}: tool call {name!r} arguments are {type(args).__name__}; expected JSON text or an object")
    if isinstance(args, Mapping):
        args = dict(args)
    call_id = obj.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise MessageFormatError(f"{where}: tool call {name!r} has no id")
    return ToolCall(id=call_id, name=name, arguments=args)


def event_to_dict(event: Event) -> dict[str, Any]:
    """A JSON-able dict of an event (tuples become lists, tool calls become dicts)."""
    out: dict[str, Any] = {}
    omitted = OMITTED_WHEN_NONE.get(event.kind, ())
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if f.name in omitted and value is None:
            continue
        if f.name == "kept_set":
            value = kept_set_to_dict(value)
        elif f.name == "tool_calls":
            value = [dataclasses.asdict(tc) for tc in value]
        elif f.name == "edits":
            value = [edit_to_dict(e) for e in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def event_from_dict(data: Mapping[str, Any], *, where: str = "event") -> Event:
    """Rebuild an event from `event_to_dict` output; unknown kinds or fields raise `LogFormatError`."""
    kind = data.get("kind")
    cls = EVENT_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise LogFormatError(f"{where}: unknown event kind {kind!r}; known kinds: {sorted(EVENT_TYPES)}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise LogFormatError(f"{where}: unknown field(s) {sorted(unknown)} for event kind {kind!r}")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "tool_calls":
            value = tuple(_tool_call_from(tc, where) for tc in value or ())
        elif key == "content":
            value = _freeze_content(value, where)
        elif key in _TUPLE_FIELDS and value is not None:
            value = tuple(value)
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except EventFormatError as exc:
        raise LogFormatError(f"{where}: {exc}") from None
    except TypeError as exc:  # pragma: no cover - guarded by the field check above
        raise LogFormatError(f"{where}: {exc}") from exc


def message_from_openai(msg: Any, *, where: str = "message") -> Message:
    """Build a `Message` event from an OpenAI/HF chat message dict, validating role and content."""
    if not isinstance(msg, Mapping):
        raise MessageFormatError(f"{where}: expected an object, got {type(msg).__name__}")
    role = msg.get("role")
    if role not in ROLES:
        raise MessageFormatError(f"{where}: unknown role {role!r}; expected one of {list(ROLES)}")
    known = {"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content"}
    tool_calls = tuple(_tool_call_from(tc, f"{where}.tool_calls[{i}]") for i, tc in enumerate(msg.get("tool_calls") or ()))
    if tool_calls and role != "assistant":
        raise MessageFormatError(f"{where}: only assistant messages may have tool_calls (role is {role!r})")
    tool_call_id = msg.get("tool_call_id")
    if role == "tool" and not isinstance(tool_call_id, str):
        raise MessageFormatError(f"{where}: a tool message needs a string tool_call_id")
    return Message(
        role=role,
        content=_freeze_content(msg.get("content"), where),
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
        name=msg.get("name"),
        reasoning_content=msg.get("reasoning_content"),
        extra={k: v for k, v in msg.items() if k not in known},
    )


def message_to_openai(event: Message | Step | ToolResult) -> dict[str, Any]:
    """The OpenAI/HF chat message dict of a chat-shaped event (the inverse of `message_from_openai`)."""
    if isinstance(event, ToolResult):
        out: dict[str, Any] = {"role": "tool", "tool_call_id": event.tool_call_id, "content": _thaw(event.content)}
        if event.name is not None:
            out["name"] = event.name
        return out
    role = "assistant" if isinstance(event, Step) else event.role
    out = {"role": role, "content": _thaw(event.content)}
    if event.tool_calls:
        out["tool_calls"] = [tc.to_openai() for tc in event.tool_calls]
    if isinstance(event, Message):
        if event.tool_call_id is not None:
            out["tool_call_id"] = event.tool_call_id
        if event.name is not None:
            out["name"] = event.name
        for key, value in event.extra.items():
            out[key] = value
    if event.reasoning_content is not None:
        out["reasoning_content"] = event.reasoning_content
    return out


def _thaw(content: Content) -> Any:
    if isinstance(content, tuple):
        return [dict(part) for part in content]
    return content


def event_id(event: Event, seq: int) -> str:
    """The id a log gives `event` at position `seq`: `e<seq>-<8 hex>` of its content, measured times
    (`ts`, a step's `timings`, a tool result's `duration_s`) excluded.

    Deterministic, so re-running an episode (or resuming it) yields the same ids, and placeholders
    that name an event id render to the same tokens.
    """
    timeless = dataclasses.replace(event, seq=None, id=None, ts=None)
    if isinstance(timeless, Step):
        timeless = dataclasses.replace(timeless, timings={})
    elif isinstance(timeless, ToolResult):
        timeless = dataclasses.replace(timeless, duration_s=None)
    body = orjson.dumps(event_to_dict(timeless), option=orjson.OPT_SORT_KEYS)
    return f"e{seq}-{hashlib.sha256(body).hexdigest()[:8]}"
