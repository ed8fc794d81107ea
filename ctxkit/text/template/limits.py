"""Limits for rendering untrusted chat templates, and the checks that enforce them.

`RenderLimits` (time, output size, string/list sizes, integer size, call depth, range size) apply to
one render, run inside `render_budget(limits)`. The sandbox of `ctxkit.text.template.sandbox` calls the
checks here from its hooks; each limit hit is a `TemplateError` naming the `RenderLimits` field:
`render limit max_length=16000000 exceeded: '*' on a str would be 1000000000 long`.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields
from typing import Any, Iterator, NoReturn

from ctxkit.errors import ConfigError, TemplateError


@dataclass(frozen=True)
class RenderLimits:
    """Limits one template render runs under (see the module docstring for where each is enforced)."""

    max_seconds: float = 10.0
    """Wall-clock seconds one render may take."""
    max_output_chars: int = 64_000_000
    """Characters output in one render: the render's own plus every macro's and `{% set %}` block's."""
    max_length: int = 16_000_000
    """Characters of one string, items of one list, or text one value stands for when printed."""
    max_range: int = 100_000
    """Items of one `range(...)` (Jinja's own sandbox limit, so also transformers')."""
    max_depth: int = 64
    """Nested calls (macros calling macros, recursive loops)."""
    max_int_bits: int = 65_536
    """Bits of an integer built by `*` or `**`."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"RenderLimits.{f.name} must be a positive number, got {value!r}")


DEFAULT_LIMITS = RenderLimits()
"""The limits of a template loaded without `limits=`."""


class RenderBudget:
    """One render's limits, deadline, call depth and output so far (`render_budget` starts one)."""

    __slots__ = ("limits", "deadline", "depth", "output")

    def __init__(self, limits: RenderLimits):
        self.limits = limits
        self.deadline = time.monotonic() + limits.max_seconds
        self.depth = 0
        self.output = 0  # characters output so far (root and captured blocks; a capture printed counts twice)

    def add_output(self, n: int) -> None:
        """Count `n` characters of output; raise past `max_output_chars`."""
        self.output += n
        if self.output > self.limits.max_output_chars:
            limit_exceeded("max_output_chars", self.limits.max_output_chars,
                      f"{self.output} characters output (captured blocks and macro output included)")

    def tick(self) -> None:
        """Raise if the deadline has passed."""
        if time.monotonic() > self.deadline:
            limit_exceeded("max_seconds", self.limits.max_seconds, "the render took longer")


_ACTIVE: ContextVar[RenderBudget | None] = ContextVar("ctxkit_render_budget", default=None)


def current_budget() -> RenderBudget | None:
    """The budget of the render in progress in this thread/context, None outside a render."""
    return _ACTIVE.get()


@contextmanager
def render_budget(limits: RenderLimits) -> Iterator[RenderBudget]:
    """Run a render under `limits`: the checks of this module read the budget this makes current."""
    budget = RenderBudget(limits)
    token = _ACTIVE.set(budget)
    try:
        yield budget
    finally:
        _ACTIVE.reset(token)


def active_limits() -> RenderLimits:
    """The limits of the render in progress (`DEFAULT_LIMITS` outside one, e.g. constant folding)."""
    budget = _ACTIVE.get()
    return DEFAULT_LIMITS if budget is None else budget.limits


def limit_exceeded(name: str, value: Any, what: str) -> NoReturn:
    """Raise the `TemplateError` for limit `name` (its value) and what went past it."""
    raise TemplateError(f"render limit {name}={value} exceeded: {what}")


def check_length(n: int, what: str) -> None:
    """Refuse a string or list of `n` characters or items (`max_length`)."""
    cap = active_limits().max_length
    if n > cap:
        limit_exceeded("max_length", cap, f"{what} would be {n} long")


def _text_weight(value: Any, cap: int) -> tuple[int, int]:
    """`(size, depth)`: characters and items `value` stands for as text, counted until `cap` is
    passed (so a list holding one list many times costs what its text would, not its memory; a
    container met again is counted from a memo, not walked again)."""
    if isinstance(value, (str, bytes)):
        return len(value), 0
    if not isinstance(value, _CONTAINERS):
        return _scalar_weight(value), 0
    memo: dict[int, int] = {}
    total, depth = len(value) + 2, 1
    stack = [(value, _children(value), 0)]
    while stack:
        container, children, start = stack[-1]
        for v in children:
            if isinstance(v, (str, bytes)):
                total += len(v)
            elif isinstance(v, _CONTAINERS):
                known = memo.get(id(v))
                if known is None:
                    stack.append((v, _children(v), total))
                    total += len(v) + 2
                    depth = max(depth, len(stack))
                    if total > cap:
                        return total, depth
                    break
                total += known
            else:
                total += _scalar_weight(v)
            if total > cap:
                return total, depth
        else:
            stack.pop()
            memo[id(container)] = total - start
    return total, depth


_CONTAINERS = (list, tuple, dict, set, frozenset)


def _children(container: Any) -> Any:
    return itertools.chain.from_iterable(container.items()) if isinstance(container, dict) else iter(container)


def _scalar_weight(v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v.bit_length() // 3 + 1
    return 8


def check_text(value: Any, what: str) -> None:
    """Refuse to turn `value` into text longer than `max_length`."""
    if type(value) is str:
        n = len(value)
    else:
        n = _text_weight(value, active_limits().max_length)[0]
    check_length(n, what)


def check_result(value: Any, what: str) -> Any:
    """`value`, after checking a string's, list's or dict's length (`max_length`)."""
    if isinstance(value, (str, bytes, list, tuple, dict)):
        check_length(len(value), what)
    return value


_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")
_SPEC = re.compile(r"^(?:.?[<>=^])?[-+ ]?z?#?0?(\d*)[,_]?(?:\.(\d+))?")


def check_format_spec(spec: str) -> None:
    """A `str.format` field's spec (`>1000`): refuse widths and precisions past `max_length`."""
    m = _SPEC.match(spec)
    cap = active_limits().max_length
    for w in m.groups() if m else ():
        if w and int(w) > cap:
            limit_exceeded("max_length", cap, f"a format width of {w}")


def _check_printf(fmt: str, args: Any) -> None:
    """`fmt % args`: widths and precisions, given or taken from `args` (`*`), and the values printed."""
    cap = active_limits().max_length
    for m in _PRINTF.finditer(fmt):
        for w in m.groups():
            if w == "*":
                values = args if isinstance(args, tuple) else (args,)
                for v in values:
                    if isinstance(v, int) and abs(v) > cap:
                        limit_exceeded("max_length", cap, f"a '%*' width of {v}")
            elif w and int(w) > cap:
                limit_exceeded("max_length", cap, f"a '%' format width of {w}")
    check_text(args, "the values formatted with '%'")


def _int_bits(a: int, b: int, op: str) -> None:
    cap = active_limits().max_int_bits
    if op == "*":
        bits = a.bit_length() + b.bit_length()
    elif b > 0 and abs(a) > 1:
        bits = b * a.bit_length()
    else:
        return
    if bits > cap:
        limit_exceeded("max_int_bits", cap, f"an integer {op} would have about {bits} bits")


_SEQ = (str, bytes, list, tuple)


def check_binop(op: str, left: Any, right: Any) -> None:
    """Before `left <op> right` (`*`, `+`, `%`, `**`): refuse results past `max_length`/`max_int_bits`."""
    if op == "*":
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(seq, _SEQ) and isinstance(n, int):
            check_length(len(seq) * n, f"'*' on a {type(seq).__name__}")
        elif isinstance(left, int) and isinstance(right, int):
            _int_bits(left, right, "*")
    elif op == "+":
        if isinstance(left, _SEQ) and isinstance(right, _SEQ):
            check_length(len(left) + len(right), f"'+' on a {type(left).__name__}")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int):
            _int_bits(left, right, "**")
    elif op == "%" and isinstance(left, str):
        _check_printf(left, right)


def check_str_method(method: Any, args: tuple, kwargs: dict) -> tuple:
    """Check a call of a `str` method that can build a long string; returns the args to call it with."""
    s, name = method.__self__, method.__name__
    cap = active_limits().max_length
    if name in ("ljust", "rjust", "center", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        if isinstance(width, int):
            check_length(width, f"str.{name}")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            check_length(len(s) + s.count("\t") * max(size, 0), "str.expandtabs")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        old, new = args[0], args[1]
        n = s.count(old) if old else len(s) + 1
        count = args[2] if len(args) > 2 else kwargs.get("count", -1)
        if isinstance(count, int) and count >= 0:
            n = min(n, count)
        check_length(len(s) + n * (len(new) - len(old)), "str.replace")
    elif name == "join" and args:
        items = args[0] if isinstance(args[0], (list, tuple)) else list(args[0])
        check_length(len(s) * len(items) + _text_weight(items, cap)[0], "str.join")
        args = (items, *args[1:])
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
        check_length(len(s) * max(longest, 1), "str.translate")
    return args


def loop_guard(iterable: Any) -> Any:
    """Wraps the iterable of every `for` loop: checks the render's deadline as it iterates."""
    budget = _ACTIVE.get()
    if budget is None:
        return iterable
    return _GuardedIterable(iterable, budget)


class _GuardedIterable:
    __slots__ = ("_it", "_budget")

    def __init__(self, it: Any, budget: RenderBudget):
        self._it, self._budget = it, budget

    def __len__(self) -> int:  # loop.length / revindex without a copy where the iterable is sized
        return len(self._it)

    def __iter__(self):
        budget = self._budget
        for n, item in enumerate(self._it):
            if not n & 15:
                budget.tick()
            yield item


class OutputBuffer(list):
    """The list where a macro, a `{% set %}` block or a call block collects its output: counted as it grows."""

    __slots__ = ()

    def append(self, piece: Any) -> None:
        budget = _ACTIVE.get()
        if budget is not None:
            budget.add_output(len(piece))
        list.append(self, piece)

    def extend(self, pieces: Any) -> None:
        pieces = tuple(pieces)
        budget = _ACTIVE.get()
        if budget is not None:
            budget.add_output(sum(map(len, pieces)))
        list.extend(self, pieces)


def limit_filter(name: str, func: Any) -> Any:
    """The filter `func` (registered as `name`) with the limits applied around it (pass-arg markers kept)."""
    offset = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0
    stringifies = name in _STRINGIFYING

    what = f"the result of |{name}"

    if not stringifies and name not in _ARG_CHECKED:  # `_filter_check` would return the arguments as given

        @functools.wraps(func)
        def limited(*args: Any, **kwargs: Any) -> Any:
            budget = _ACTIVE.get()
            if budget is not None:
                budget.tick()
            return check_result(func(*args, **kwargs), what)

        return limited

    @functools.wraps(func)
    def limited(*args: Any, **kwargs: Any) -> Any:
        budget = _ACTIVE.get()
        if budget is not None:
            budget.tick()
        args = _filter_check(name, args, offset, kwargs, stringifies)
        return check_result(func(*args, **kwargs), what)

    return limited


_ARG_CHECKED = frozenset({"join", "center", "indent", "batch", "slice", "format", "replace", "wordwrap", "sum"})
"""Filters whose arguments `_filter_check` looks at (besides the stringifying ones)."""


_STRINGIFYING = frozenset({
    "string", "pprint", "join", "center", "indent", "format", "wordwrap", "truncate", "escape", "e",
    "forceescape", "urlencode", "urlize", "striptags", "title", "capitalize", "upper", "lower", "trim",
    "replace", "wordcount", "xmlattr", "safe", "filesizeformat",
})


def _arg(args: tuple, kwargs: dict, i: int, key: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(key, default)


def _filter_check(name: str, args: tuple, offset: int, kwargs: dict, stringifies: bool) -> tuple:
    """Check a filter's arguments before it runs (a name given a branch here must be in `_ARG_CHECKED`)."""
    if len(args) <= offset:
        return args
    value = args[offset]
    if name == "join" and not isinstance(value, (list, tuple, str, dict)):
        value = list(value)
        args = (*args[:offset], value, *args[offset + 1 :])
    if stringifies:
        check_text(value, f"the value given to |{name}")
    rest = args[offset + 1 :]
    if name == "center":
        width = _arg(rest, kwargs, 0, "width", 80)
        if isinstance(width, int):
            check_length(width, "|center")
    elif name == "indent":
        width = _arg(rest, kwargs, 0, "width", 4)
        w = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        lines = str(value).count("\n") + 1
        check_length(len(str(value)) + lines * max(w, 0), "|indent")
    elif name in ("batch", "slice"):
        count = _arg(rest, kwargs, 0, "linecount" if name == "batch" else "slices", 0)
        if isinstance(count, int):
            check_length(count, f"|{name}")
    elif name == "format" and isinstance(value, str):
        _check_printf(value, tuple(rest) or tuple(kwargs.values()))
    elif name == "join":
        sep = _arg(rest, kwargs, 0, "d", "")
        n = len(value) if hasattr(value, "__len__") else 0
        check_length(len(str(sep)) * n + _text_weight(value, active_limits().max_length)[0], "|join")
    elif name == "replace" and isinstance(value, str) and len(rest) >= 2:
        count = _arg(rest, kwargs, 2, "count", None)
        check_str_method(value.replace, (str(rest[0]), str(rest[1]), -1 if count is None else count), {})
    elif name == "wordwrap":
        width = _arg(rest, kwargs, 0, "width", 79)
        wrap = _arg(rest, kwargs, 2, "wrapstring", None)
        if isinstance(wrap, str) and isinstance(width, int):
            text = str(value)
            check_length(len(text) + (len(text) // max(width, 1) + 1) * len(wrap), "|wordwrap")
    elif name == "sum" and isinstance(_arg(rest, kwargs, 1, "start", 0), (list, tuple)):
        items = list(value)
        check_length(sum(len(x) for x in items if isinstance(x, _SEQ)), "|sum")
        args = (*args[:offset], items, *args[offset + 1 :])
    return args


_WEIGHTS: dict[int, tuple[Any, int, int, int, dict]] = {}  # id -> (value, cap, size, depth, JSON texts), see tojson


def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """transformers' `tojson` (non-ASCII kept), measured first. A container's measure and JSON text are kept
    by identity (`_WEIGHTS`): the plain copies ctxkit renders from (a renderer's tools, each message's
    tool-call arguments) are never changed and are rendered again at every turn."""
    cap = active_limits().max_length
    hit = _WEIGHTS.get(id(x)) if isinstance(x, (dict, list)) else None
    if hit is None or hit[0] is not x or hit[1] != cap:
        size, depth = _text_weight(x, cap)
        hit = (x, cap, size, depth, {})
        if isinstance(x, (dict, list)):
            if len(_WEIGHTS) >= 4096:
                _WEIGHTS.clear()
            _WEIGHTS[id(x)] = hit  # holds x, so its id is not reused while kept
    size, depth, texts = hit[2], hit[3], hit[4]
    width = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
    check_length(size * (1 + max(width, 0) * max(depth, 1)) if width else size, "|tojson")
    key = (ensure_ascii, indent, separators, sort_keys)
    try:
        text = texts.get(key)
    except TypeError:  # unhashable options (a list of separators): not kept
        key, text = None, None
    if text is None:
        text = json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        if key is not None:
            texts[key] = text
    return text


def limited_range(*args: int) -> range:
    """`range` capped at `RenderLimits.max_range` items."""
    rng = range(*args)
    cap = active_limits().max_range
    if len(rng) > cap:
        limit_exceeded("max_range", cap, f"range of {len(rng)} items")
    return rng


__all__ = [
    "DEFAULT_LIMITS", "OutputBuffer", "RenderBudget", "RenderLimits", "active_limits", "check_binop", "check_format_spec",
    "check_length", "check_result", "check_str_method", "check_text", "current_budget", "limit_exceeded", "limit_filter",
    "limited_range", "loop_guard", "render_budget", "tojson",
]
