"""The compressor interface: specs, requests, the `Compressor` protocol and shared parameter handling.

A compressor looks at the current view (which already reflects every earlier compaction) and returns
a `Compaction` event carrying only its NEW edits (typed records of `ctxkit.edits`, applied by
`ctxkit.context.view`), or None when it has nothing to do. The builder appends that event to the log, so the view stays a pure function of the log
and replay never re-runs a compressor.

Common parameters (every compressor accepts them):

- `trigger`: when to compact. `"over_budget"` (default): when the measured view exceeds the budget;
  `"every_turn"`: at every build; `"tokens"`: when the view exceeds `trigger_tokens`; `"fraction"`: when
  it exceeds `trigger_fraction * budget`. A view over budget always triggers, whatever the setting.
- `trigger_tokens` (int, default 0 = unset), `trigger_fraction` (float in (0, 1], default 0.8).

Budgets are in real tokens of the final render: `CompressionRequest.measure(view)` renders the view
(pinned block and generation prompt included) and counts.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

from ctxkit.edits import Edit
from ctxkit.errors import ConfigError
from ctxkit.events import Compaction, Event
from ctxkit.context.view import View

TRIGGERS: tuple[str, ...] = ("over_budget", "every_turn", "tokens", "fraction")
"""Accepted values of the common `trigger` parameter."""

COMMON_DEFAULTS: Mapping[str, Any] = {"trigger": "over_budget", "trigger_tokens": 0, "trigger_fraction": 0.8}
"""Defaults of the parameters every compressor accepts."""


@dataclass(frozen=True)
class CompressorSpec:
    """What a compressor is: a versioned name and its full parameters (recorded in every log)."""

    name: str
    """Versioned name, e.g. `window-v1`."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Every parameter, defaults filled in (JSON-able)."""

    def to_dict(self) -> dict[str, Any]:
        """`{"name": ..., "params": {...}}`."""
        return {"name": self.name, "params": _plain(self.params)}


@dataclass(frozen=True)
class CompressionRequest:
    """Everything a compressor may look at when deciding a compaction."""

    view: View
    """The current view (earlier compactions applied, pinned block derived)."""
    events: Sequence[Event]
    """Every event of the log so far (read-only)."""
    tokenizer: Any
    """The `ctxkit.text.tokenizer.loader.Tokenizer` (use `count` for per-text token counts)."""
    template: Any
    """The `ctxkit.text.template.chat_template.ChatTemplate` the context is rendered with."""
    budget: int
    """Token budget of the final render (generation prompt and pinned block included)."""
    measure: Callable[[View], int]
    """Exact token count of the final render of a view (cached by view hash by the builder)."""
    pinned_texts: tuple[str, ...] = ()
    """Texts of the active pins (reserved first; they stay visible whatever the compressor does)."""
    turn_starts: Callable[[View], Sequence[int | None] | None] | None = None
    """Optional: per message of a view, the token where its turn begins in the view's final render (its
    turn opener), None for a message that opens no turn of its own; None when the template does not
    render a view as its turns one after another (then cutting messages out cannot be predicted). With
    it, the render of a view with messages `[a, b)` cut out is predicted to be `starts[b] - starts[a]`
    tokens shorter; compressors measure the candidate they choose to confirm it (`fit_window`)."""
    rendered: Callable[[View], Any] | None = None
    """Optional: the final render of a view (a `ctxkit.text.rendering.renderer.RenderedContext`: `token_ids`, and
    `spans`, the token range of each message's own text), cached by view hash by the builder. Version-3
    strategies read token counts and ids of the current view's messages off it (`ctxkit.context.compress.sized_in_context`)."""


@runtime_checkable
class Compressor(Protocol):
    """A compaction strategy."""

    spec: CompressorSpec

    def compact(self, request: CompressionRequest) -> Compaction | None:
        """A new (un-appended) `Compaction` with only the new edits, or None when nothing is needed."""
        ...


def versioned(name: str, version: int) -> str:
    """`"window", 1` -> `"window-v1"`."""
    return f"{name}-v{version}"


def split_versioned(name: str) -> tuple[str, int | None]:
    """`"window-v1"` -> `("window", 1)`; `"window"` -> `("window", None)`."""
    m = re.fullmatch(r"(.+)-v(\d+)", name)
    if m:
        return m.group(1), int(m.group(2))
    return name, None


class BaseCompressor:
    """Shared plumbing for the built-in compressors: parameter validation, spec, trigger test.

    Subclasses set `NAME`, `VERSION`, `DEFAULTS` (their own parameters; the common ones are added) and
    implement `check_params(params)` (raise `ConfigError` on bad values) and `propose(request)`.
    `FITS_BUDGET` says whether the strategy alone always brings an over-budget view within the budget
    (or raises `BudgetError` naming the sizes); one that does one thing only (mask, truncate,
    summarize) sets it False and is meant to be followed by a `window` stage in a pipeline.
    """

    NAME: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    DEFAULTS: ClassVar[Mapping[str, Any]] = {}
    FITS_BUDGET: ClassVar[bool] = True

    def __init__(self, **params: Any) -> None:
        self.params = resolve_params(type(self), params)
        self.check_common(self.params)
        self.check_params(self.params)
        self.spec = CompressorSpec(versioned(self.NAME, self.VERSION), _plain(self.params))

    @property
    def fits_budget(self) -> bool:
        """Whether this compressor alone always brings an over-budget view within the budget."""
        return self.FITS_BUDGET

    @classmethod
    def all_defaults(cls) -> dict[str, Any]:
        """Own defaults plus the common trigger parameters."""
        return {**COMMON_DEFAULTS, **cls.DEFAULTS}

    def check_params(self, params: Mapping[str, Any]) -> None:
        """Validate strategy-specific values (override)."""

    def check_common(self, p: Mapping[str, Any]) -> None:
        """Validate the common trigger parameters."""
        name = self.NAME
        if p["trigger"] not in TRIGGERS:
            raise ConfigError(f"{name}: parameter 'trigger' is {p['trigger']!r}; expected one of {list(TRIGGERS)}")
        require_int(name, p, "trigger_tokens", minimum=0)
        require_fraction(name, p, "trigger_fraction")
        if p["trigger"] == "tokens" and p["trigger_tokens"] <= 0:
            raise ConfigError(f"{name}: trigger 'tokens' needs 'trigger_tokens' > 0")

    def triggered(self, request: CompressionRequest) -> tuple[bool, int]:
        """Whether to compact now, and the measured size of the current view."""
        n = request.measure(request.view)
        trig = self.params["trigger"]
        if n > request.budget or trig == "every_turn":
            return True, n
        if trig == "tokens":
            return n > self.params["trigger_tokens"], n
        if trig == "fraction":
            return n > self.params["trigger_fraction"] * request.budget, n
        return False, n

    def compact(self, request: CompressionRequest) -> Compaction | None:
        """Run the trigger test, then `propose`; wraps non-empty edits in a `Compaction`."""
        fire, n = self.triggered(request)
        if not fire:
            return None
        result = self.propose(request, n)
        if result is None:
            return None
        edits, details = result
        if not edits and not details.get("overflow"):
            return None
        return Compaction(compressor=self.spec.name, params=dict(self.spec.params), edits=tuple(edits),
                          details={"tokens_before": n, **details})

    def propose(self, request: CompressionRequest, n_tokens: int) -> tuple[list[Edit], dict[str, Any]] | None:
        """The new typed edits and details for this view (override). `n_tokens` is the measured current size."""
        raise NotImplementedError


def resolve_params(cls: type, params: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults overlaid with `params`; an unknown parameter is a `ConfigError` naming the accepted ones."""
    defaults = cls.all_defaults() if hasattr(cls, "all_defaults") else dict(getattr(cls, "DEFAULTS", {}))
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ConfigError(
            f"compressor {getattr(cls, 'NAME', cls.__name__)!r}: unknown parameter(s) {unknown}; "
            f"accepted parameters: {sorted(defaults)}"
        )
    return {**defaults, **params}


def require_int(name: str, params: Mapping[str, Any], key: str, *, minimum: int = 0) -> int:
    """`params[key]` as an int >= minimum, or a `ConfigError` naming it."""
    v = params[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"{name}: parameter {key!r} is {v!r}; expected an integer >= {minimum}")
    return v


def require_fraction(name: str, params: Mapping[str, Any], key: str) -> float:
    """`params[key]` as a number in (0, 1], or a `ConfigError` naming it."""
    v = params[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise ConfigError(f"{name}: parameter {key!r} is {v!r}; expected a number in (0, 1]")
    return float(v)


def require_choice(name: str, params: Mapping[str, Any], key: str, choices: Sequence[str]) -> str:
    """`params[key]` if it is one of `choices`, or a `ConfigError` naming them."""
    v = params[key]
    if v not in choices:
        raise ConfigError(f"{name}: parameter {key!r} is {v!r}; expected one of {list(choices)}")
    return v


def _plain(obj: Any) -> Any:
    """A JSON-able deep copy (mappings -> dicts, sequences -> lists)."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    return obj
