"""The Jinja sandbox chat templates render in, with limits for untrusted templates.

Templates are untrusted code. `sandbox_environment()` is the environment `transformers` renders chat
templates in (`ImmutableSandboxedEnvironment`, `trim_blocks`, `lstrip_blocks`, `loopcontrols`, the same
filters and globals) with a pinned clock, so a render that stays within limits gives the same text.
Every render runs under `RenderLimits` (`ctxkit.text.template.limits`; `render_sandboxed`), enforced inside
the sandbox:

- time: a wall-clock deadline, checked on every call the template makes (macros, methods, globals,
  filters) and on every iteration of every `for` loop;
- recursion: the depth of nested calls (a self-recursive macro);
- size: strings and lists an operator (`*`, `+`, `%`), a method, a filter or a global builds are
  checked *before* they are built where the size is known in advance (`'a' * n`, `x.center(n)`,
  `'%*s'`, `'{:>n}'`, `range(n)`, ...) and after otherwise; values turned into text (output, `~`,
  `|string`, `|tojson`, `|join`, formatting) are measured first; every output (a template's, a
  macro's, a `{% set %}` block's) is counted as it grows, and their sum over a render is capped;
  integers are capped in bits.

A limit hit is a `TemplateError` naming the `RenderLimits` field (`render limit max_length=... exceeded:
...`). The defaults leave every real template's render of a long conversation unchanged.
"""

from __future__ import annotations

import functools
import itertools
import threading
import types
from datetime import datetime
from typing import Any

from ctxkit.errors import TemplateError
from ctxkit.text.template.limits import (
    OutputBuffer, RenderLimits, active_limits, check_binop, check_format_spec, check_length,
    check_result, check_str_method, check_text, current_budget, limit_exceeded, limit_filter, limited_range,
    loop_guard, render_budget, tojson,
)

_SIZED = (str, bytes, list, tuple, dict)

RENDER_CLOCK = datetime(2026, 1, 1, 12, 0, 0)
"""The date `strftime_now` reports in every render (recorded in each template's `options`)."""


@functools.lru_cache(maxsize=16)
def clock_function(clock: datetime):
    """The `strftime_now(format)` a template calls, reporting `clock` (one function per clock)."""

    def strftime_now(format):
        return clock.strftime(format)

    return strftime_now


class LoopView:
    """Base of the loop objects a rewritten template reads in place of Jinja's own (`iteration_reuse`,
    `scan_reuse`): slotted records of plain values, whose public attributes the sandbox reads directly."""

    __slots__ = ()


_ENV: Any = None
_ENV_LOCK = threading.Lock()


def sandbox_environment():
    """The shared sandboxed Jinja environment (built on first use): parse with it, compile with
    `compile_template`, render with `render_sandboxed`."""
    global _ENV
    with _ENV_LOCK:
        if _ENV is None:
            _ENV = _build_environment()
        return _ENV


def _build_environment():
    import jinja2  # lazy: jinja2 loads on first use
    import jinja2.ext  # lazy: jinja2 loads on first use
    from jinja2 import nodes  # lazy: jinja2 loads on first use
    from jinja2.compiler import CodeGenerator  # lazy: jinja2 loads on first use
    from jinja2.ext import Extension  # lazy: jinja2 loads on first use
    from jinja2.runtime import LoopContext, Macro  # lazy: jinja2 loads on first use
    # lazy: jinja2 loads on first use
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
    from jinja2.utils import Namespace, generate_lorem_ipsum  # lazy: jinja2 loads on first use
    from markupsafe import Markup  # lazy: markupsafe loads on first use

    class GenerationBlock(Extension):
        """Accepts `{% generation %}...{% endgeneration %}` (TRL training templates) and renders the body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    strftime_now = clock_function(RENDER_CLOCK)

    def lipsum(n=5, html=True, min=20, max=100):
        if isinstance(n, int) and isinstance(max, int):
            check_length(n * max * 12, "lipsum()")
        return generate_lorem_ipsum(n, html, min, max)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            check_text(value, f"namespace attribute {name!r}")
            Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")

    class LimitedFormatter(SandboxedFormatter):
        def format_field(self, value, format_spec):
            check_format_spec(format_spec)
            check_text(value, "a value formatted with str.format")
            return super().format_field(value, format_spec)

    class LimitedEscapeFormatter(LimitedFormatter, SandboxedEscapeFormatter):
        pass

    class LimitedCodeGenerator(CodeGenerator):
        def buffer(self, frame):  # captured output (macros, {% set %} blocks, call blocks) is counted
            frame.buffer = self.temporary_identifier()
            self.writeline(f"{frame.buffer} = environment.output_buffer()")

        def visit_Concat(self, node, frame):  # `a ~ b`: measured before it is joined
            if frame.eval_ctx.volatile:
                func_name = "(markup_join if context.eval_ctx.volatile else str_join)"
            else:
                func_name = "markup_join" if frame.eval_ctx.autoescape else "str_join"
            self.write(f"environment.join_values({func_name}, (")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    dict_names = frozenset(dir(dict))
    loop_names = frozenset(n for n in dir(LoopContext) if not n.startswith("_"))
    str_formats = frozenset({"format", "format_map"})  # wrapped by `wrap_str_format`
    # Callables Jinja's sandbox always lets through: built-in methods (of the values a template can reach:
    # str, dict views; list's mutators are refused at attribute access), which carry no `pass_context`-style
    # marker or `unsafe_callable` flag, and macros (given the caller's eval context, as Jinja does).
    builtin_method = types.BuiltinMethodType

    class Sandbox(ImmutableSandboxedEnvironment):
        """The sandbox transformers uses, with the limits of the module docstring and fast paths that give
        the same results: an item of a plain dict (what templates receive), a public attribute of `loop`, of
        a namespace or of a plain str, and a call of a built-in method or a macro."""

        intercepted_binops = frozenset({"*", "+", "%", "**"})
        code_generator_class = LimitedCodeGenerator

        def getattr(self, obj, attribute):
            if type(obj) is dict and attribute not in dict_names:
                try:
                    return obj[attribute]
                except (TypeError, LookupError):
                    return self.undefined(obj=obj, name=attribute)
            if type(obj) is LoopContext and attribute in loop_names:
                return getattr(obj, attribute)
            # a public attribute of these passes Jinja's checks (str's format methods are wrapped first)
            if attribute[:1] != "_" and (type(obj) is TemplateNamespace or isinstance(obj, LoopView)
                                         or type(obj) is str and attribute not in str_formats):
                try:
                    return getattr(obj, attribute)
                except AttributeError:
                    return self.undefined(obj=obj, name=attribute)
            return super().getattr(obj, attribute)

        def unsafe_undefined(self, obj, attribute):
            # Jinja returns an Undefined that renders as "" until used; a template touching Python
            # internals is refused outright instead.
            raise jinja2.exceptions.SecurityError(
                f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
            )

        def call_binop(self, context, operator, left, right):
            if operator == "+":  # the common case (string building, index arithmetic): checked inline
                if type(left) is str and type(right) is str:
                    if len(left) + len(right) > active_limits().max_length:
                        check_length(len(left) + len(right), "'+' on a str")
                    return left + right
                if type(left) is int and type(right) is int:
                    return left + right
            check_binop(operator, left, right)  # sizes are known before: no check after
            return self.binop_table[operator](left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - Jinja's signature
            budget = current_budget()
            if budget is None:
                return super().call(__context, __obj, *args, **kwargs)
            budget.tick()
            if budget.depth >= budget.limits.max_depth:
                limit_exceeded("max_depth", budget.limits.max_depth, "calls nested too deeply (recursion?)")
            cap = budget.limits.max_length
            for a in itertools.chain(args, kwargs.values()):
                if isinstance(a, _SIZED) and len(a) > cap:
                    check_result(a, "an argument")
            if isinstance(getattr(__obj, "__self__", None), str) and callable(__obj):
                args = check_str_method(__obj, args, kwargs)
            budget.depth += 1
            try:
                kind = type(__obj)
                if kind is builtin_method or kind is Macro:  # what Jinja's `Context.call` does, without its checks
                    kwargs.pop("_block_vars", None)
                    kwargs.pop("_loop_vars", None)
                    if kind is Macro:  # `Macro.__call__` is `pass_eval_context`: its autoescape is the caller's
                        args = (__context.eval_ctx, *args)
                    try:
                        result = __obj(*args, **kwargs)
                    except StopIteration:
                        result = __self.undefined("value was undefined because a callable raised a StopIteration "
                                                  "exception")
                else:
                    result = super().call(__context, __obj, *args, **kwargs)
            finally:
                budget.depth -= 1
            if isinstance(result, _SIZED) and len(result) > cap:
                check_result(result, "the result of a call")
            return result

        def wrap_str_format(self, value):
            if getattr(value, "__name__", None) not in ("format", "format_map") or not isinstance(
                    getattr(value, "__self__", None), str):
                return None
            f_self = value.__self__
            is_map = value.__name__ == "format_map"
            formatter = (LimitedEscapeFormatter(self, escape=f_self.escape) if isinstance(f_self, Markup)
                         else LimitedFormatter(self))

            def wrapper(*args, **kwargs):
                if is_map:
                    if kwargs or len(args) != 1:
                        raise TypeError("format_map() takes exactly one positional argument")
                    args, kwargs = (), args[0]
                return type(f_self)(formatter.vformat(f_self, args, kwargs))

            return functools.update_wrapper(wrapper, value)

        def concat(self, pieces):  # joins every output: the render's, a macro's, a {% set %} block's
            cap = active_limits().max_output_chars
            if type(pieces) is OutputBuffer:  # counted as it grew
                total = sum(map(len, pieces))
                if total > cap:
                    limit_exceeded("max_output_chars", cap, f"an output of {total} characters")
                return "".join(pieces)
            budget = current_budget()
            out, total = [], 0
            append = out.append
            for piece in pieces:  # streamed: refused as soon as it passes the cap
                total += len(piece)
                if total > cap:
                    limit_exceeded("max_output_chars", cap, "the output grew past it")
                append(piece)
            if budget is not None:
                budget.add_output(total)
            return "".join(out)

        @staticmethod
        def output_buffer():
            return OutputBuffer()

        def join_values(self, join, values):
            for v in values:
                check_text(v, "a value joined with '~'")
            out = join(values)
            check_length(len(out), "a string joined with '~'")
            return out

        def compile(self, source, name=None, filename=None, raw=False, defer_init=False):
            tree = self.parse(source, name, filename) if isinstance(source, str) else source
            for loop in tree.find_all(nodes.For):
                loop.iter = nodes.Filter(loop.iter, "ctxkit_loop_guard", [], [], None, None, lineno=loop.lineno)
            return super().compile(tree, name, filename, raw, defer_init)

    def finalize(value):  # a string is text already (its size was checked where it was built)
        if type(value) is not str:
            check_text(value, "a printed value")
        return value

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols],
                  finalize=finalize)
    env.filters["tojson"] = tojson
    for name, func in list(env.filters.items()):
        env.filters[name] = limit_filter(name, func)
    env.filters["ctxkit_loop_guard"] = loop_guard
    env.globals["range"] = limited_range
    env.globals["lipsum"] = lipsum
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


_COMPILED: dict[str, Any] = {}
_COMPILED_LOCK = threading.Lock()


def compile_template(source: str, key: str, name: str):
    """The compiled Jinja template for `source`, cached under `key` (its sha256); a syntax error is a
    `TemplateError` naming `name` and the line."""
    with _COMPILED_LOCK:
        compiled = _COMPILED.get(key)
    if compiled is not None:
        return compiled
    import jinja2  # lazy: jinja2 loads on first use

    try:
        compiled = sandbox_environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise TemplateError(f"template {name}: syntax error at line {exc.lineno}: {exc.message}") from exc
    # The environment's globals are fixed once built: a plain copy instead of Jinja's ChainMap over them,
    # which every render iterates twice to make its context (over a quarter of a short render's time).
    compiled.globals = dict(compiled.globals)
    with _COMPILED_LOCK:
        _COMPILED[key] = compiled
    return compiled


def render_sandboxed(compiled, limits: RenderLimits, variables: dict[str, Any], where: str) -> str:
    """Render a template from `compile_template` with `variables` under `limits`.

    Any failure is a `TemplateError` starting with `where` (e.g. `template <id>`): a limit hit (naming
    the limit), a sandbox violation, `raise_exception`, or a Python error the template ran into."""
    import jinja2  # lazy: jinja2 loads on first use

    try:
        with render_budget(limits):
            return compiled.render(**variables)
    except TemplateError as exc:
        raise TemplateError(f"{where}: {exc}") from exc
    except jinja2.exceptions.SecurityError as exc:
        raise TemplateError(f"{where}: sandbox violation: {exc}") from exc
    except jinja2.exceptions.TemplateError as exc:
        raise TemplateError(f"{where}: {exc}") from exc
    except RecursionError as exc:
        raise TemplateError(f"{where} failed to render: recursion too deep (Python's stack)") from exc
    except MemoryError as exc:
        raise TemplateError(f"{where} failed to render: out of memory") from exc
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, ZeroDivisionError) as exc:
        raise TemplateError(f"{where} failed to render: {type(exc).__name__}: {exc}") from exc


__all__ = ["RENDER_CLOCK", "LoopView", "clock_function", "compile_template", "render_sandboxed", "sandbox_environment"]
