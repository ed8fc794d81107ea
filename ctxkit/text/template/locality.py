"""Windowed (suffix) rendering of a growing conversation, for templates where it is exact.

For a "local" template the text that appending messages adds to a render can be computed from a short
suffix window of the conversation: render(lead + chat[j:m]) and render(lead + chat[j:n]) differ by
exactly what render(chat[:m]) and render(chat[:n]) differ by, where `lead` is the first message(s). A
template is local when the rendering of a message depends only on itself, its neighbours
(`messages[loop.index0 +- k]`, `loop.first/last`, `loop.previtem/nextitem`), the first message and
global values (tools, the generation prompt flag, special tokens), all identical in the window.
`locality_scan` reads the syntax tree, `window_delta` computes one delta and checks it against the
full text already known; `ctxkit.text.template.profile.template_locality` decides it per template and
tokenizer (the syntax tree plus a probe) as part of the template's profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxkit.text.template.sandbox import sandbox_environment

_LOOP_OK = frozenset({"first", "last", "previtem", "nextitem"})


@dataclass(frozen=True)
class Locality:
    """Whether windowed (suffix) rendering is exact for a template, and why not if not."""

    local: bool
    """Appending messages may be rendered from a suffix window (see `window_delta`)."""
    reason: str
    """Empty when local; otherwise what ruled it out (a syntax-tree use or a failed probe)."""
    reach: int = 1
    """Farthest neighbour a message's rendering looks at (`messages[loop.index0 - 2]` reaches 2)."""
    prompt: str | None = None
    """The constant text `add_generation_prompt` appends at the very end, when that is all it does (the
    template's last node is `{% if add_generation_prompt %}<constant>{% endif %}` and nothing else reads
    the flag; confirmed on the probe); None otherwise."""


def scan_locality(source: str) -> str | None:
    """Uses of the whole message list in a template's syntax tree that break locality, or None.

    Allowed: one `for` over `messages`; `messages[0]`; `messages[loop.index0 +- k]` (and `loop.index`)
    inside it; `loop.index0 == 0` / `loop.index == 1`; `loop.first/last/previtem/nextitem`; `messages`
    as a truth value. Anything else that sees the list (`messages|length`, `messages[-1]`, slices,
    reversed loops, `loop.length`, `loop.revindex`, namespace accumulators) is reported."""
    return locality_scan(source)[0]


def trailing_prompt(source: str) -> str | None:
    """The constant a template's final `{% if add_generation_prompt %}...{% endif %}` outputs, if that
    block is the template's last node, holds only constant output, and is the flag's only use; else None."""
    import jinja2  # lazy: jinja2 loads on first use
    from jinja2 import nodes  # lazy: jinja2 loads on first use

    try:
        tree = sandbox_environment().parse(source)
    except jinja2.exceptions.TemplateSyntaxError:
        return None
    uses = [n for n in tree.find_all(nodes.Name) if n.name == "add_generation_prompt"]
    body = [n for n in tree.body if not (isinstance(n, nodes.Output) and all(
        isinstance(c, nodes.TemplateData) and c.data == "" for c in n.nodes))]
    if len(uses) != 1 or not body:
        return None
    last = body[-1]
    if not (isinstance(last, nodes.If) and last.test is uses[0] and not last.elif_ and not last.else_):
        return None
    text = []
    for out in last.body:
        if not isinstance(out, nodes.Output):
            return None
        for c in out.nodes:
            if isinstance(c, nodes.TemplateData):
                text.append(c.data)
            elif isinstance(c, nodes.Const) and isinstance(c.value, str):
                text.append(c.value)
            else:
                return None
    return "".join(text)


def locality_scan(source: str) -> tuple[str | None, int]:
    """`(scan_locality(source), reach)`: reach is the farthest neighbour offset a message's rendering
    looks at (`messages[loop.index0 - 2]` reaches 2; at least 1)."""
    import jinja2  # lazy: jinja2 loads on first use
    from jinja2 import nodes  # lazy: jinja2 loads on first use

    try:
        tree = sandbox_environment().parse(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        return f"syntax error: {exc.message}", 1
    problems: list[str] = []
    loops = [0]
    reach = [1]

    def is_messages(n) -> bool:
        return isinstance(n, nodes.Name) and n.name == "messages"

    def loop_attr(n, names) -> bool:
        return (isinstance(n, nodes.Getattr) and isinstance(n.node, nodes.Name) and n.node.name == "loop"
                and n.attr in names)

    def const_int(n) -> bool:
        return isinstance(n, nodes.Const) and type(n.value) is int

    def visit(n, in_loop: bool) -> None:
        if isinstance(n, nodes.For):
            if is_messages(n.iter):
                loops[0] += 1
                if n.recursive or n.test is not None or in_loop:
                    problems.append(f"line {n.lineno}: filtered, recursive or nested loop over messages")
                for child in n.body:
                    visit(child, True)
                for child in n.else_:
                    visit(child, False)
                return
            visit(n.iter, in_loop)
            for child in list(n.body) + list(n.else_) + ([n.test] if n.test is not None else []):
                visit(child, False)  # `loop` in here is the inner loop's: local to the message
            return
        if isinstance(n, nodes.NSRef):
            problems.append(f"line {n.lineno}: namespace attribute assigned ({n.name}.{n.attr})")
            return
        if isinstance(n, nodes.Getitem) and is_messages(n.node):
            arg = n.arg
            if isinstance(arg, nodes.Const) and arg.value == 0:
                return
            if (in_loop and isinstance(arg, (nodes.Add, nodes.Sub)) and loop_attr(arg.left, ("index0", "index"))
                    and const_int(arg.right)):
                offset = arg.right.value * (1 if isinstance(arg, nodes.Add) else -1)
                if arg.left.attr == "index":  # messages[loop.index + k] is messages[loop.index0 + k + 1]
                    offset += 1
                reach[0] = max(reach[0], abs(offset))
                return
            problems.append(f"line {n.lineno}: messages[...] other than messages[0] or a neighbour")
            return
        if is_messages(n):
            problems.append(f"line {n.lineno}: the message list used as a whole")
            return
        if isinstance(n, (nodes.And, nodes.Or)):
            for child in (n.left, n.right):
                if not is_messages(child):
                    visit(child, in_loop)
            return
        if isinstance(n, nodes.Not) and is_messages(n.node):
            return
        if isinstance(n, (nodes.If, nodes.CondExpr)) and is_messages(n.test):
            for child in n.iter_child_nodes():
                if child is not n.test:
                    visit(child, in_loop)
            return
        if isinstance(n, nodes.Compare) and loop_attr(n.expr, ("index0", "index")) and len(n.ops) == 1:
            op = n.ops[0]
            first = 0 if n.expr.attr == "index0" else 1
            if op.op in ("eq", "ne") and isinstance(op.expr, nodes.Const) and op.expr.value == first:
                return
        if isinstance(n, nodes.Getattr) and isinstance(n.node, nodes.Name) and n.node.name == "loop":
            if in_loop and n.attr not in _LOOP_OK:
                problems.append(f"line {n.lineno}: loop.{n.attr} in the loop over messages")
            return
        if in_loop and isinstance(n, nodes.Name) and n.name == "loop" and n.ctx == "load":
            problems.append(f"line {n.lineno}: the loop object used as a whole")
            return
        for child in n.iter_child_nodes():
            visit(child, in_loop)

    visit(tree, False)
    if loops[0] != 1:
        problems.append(f"{loops[0]} loops over messages (expected exactly one)")
    return ("; ".join(problems) if problems else None), reach[0]


def window_start(chat: list[dict], m: int, reach: int = 1, max_back: int = 64) -> int:
    """Where `window_delta`'s window proper starts for the first `m` messages of `chat` (<= `max(1, reach)`:
    no window): `reach + 1` messages before `m` (at least 2), further back over a run of tool results, at
    most `max_back` messages before `m`."""
    lead = max(1, reach)
    j = m - max(2, reach + 1)
    while j > lead and chat[j].get("role") == "tool" and m - j < max_back:
        j -= 1
    return j


def window_delta(render, chat: list[dict], m: int, core: str, agp: bool, head: str | None = None,
                 reach: int = 1, prompt: str | None = None, max_back: int = 64,
                 mark: tuple[int, int] | None = None) -> tuple[str, str] | None:
    """`(render(chat, False), render(chat, agp))` from `core = render(chat[:m], False)` and renders of a
    suffix window only, or None where the window cannot be used or fails its check.

    `render(messages, agp) -> str` renders a list; `head` is `render(chat[:reach], False)` if known
    (the first `reach` messages lead every window: a lookup `messages[loop.index0 - k]` from one of
    them wraps to the end of the list, which the window shares with the whole). The window proper
    starts `reach + 1` messages before `m` (further back over a run of tool results, at most
    `max_back`), so every neighbour the new messages look at, and every old message that looks at a
    new one, is inside it; its render, past the first message, must equal the tail of `core`, and the
    window with the new messages must extend it. `prompt` (`Locality.prompt`) saves the render with the
    generation prompt.

    `mark = (j, p)`, when known: `core[:p]` is the render of `chat[:j]` (a core of an earlier build), with
    `max(1, reach) < j <= window_start(chat, m, reach, max_back)`. The window then starts at `j` and its
    old part is not rendered on its own: `core[p:]` is what the full render holds for `chat[j:m]`, and the
    window with the new messages must render them first, after `head`, as the check above demands of the
    old window's render. Only for templates `template_locality` finds local."""
    n = len(chat)
    lead = max(1, reach)  # messages kept at the front: their backward lookups wrap to the list's end
    if mark is not None:
        j, p = mark
        if not lead < j <= window_start(chat, m, reach, max_back) or not 0 < p < len(core):
            mark = None
    if mark is None:
        j = window_start(chat, m, reach, max_back)
    if j <= lead or n < m:
        return None  # the window would be the whole conversation
    first = chat[:lead]
    if head is None:
        head = render(first, False)
    if mark is not None:
        if n > m:
            return _extend_marked(render, first + chat[j:], agp, head, prompt, core, mark[1])
        if not agp or prompt is not None:
            return core, core if not agp else core + prompt
        with_prompt = _with_prompt(render, first + chat[j:], head, core, mark[1])
        return None if with_prompt is None else (core, with_prompt)
    old = render(first + chat[j:m], False)
    body = old[len(head):]
    if not body or not old.startswith(head) or not core.endswith(body):
        return None
    if n == m:
        new_core = core
    else:
        new = render(first + chat[j:], False)
        if not new.startswith(old):
            return None
        new_core = core + new[len(old):]
    if not agp:
        return new_core, new_core
    if prompt is not None:
        return new_core, new_core + prompt
    with_prompt = render(first + chat[j:], True)
    if not with_prompt.startswith(old):
        return None
    return new_core, core + with_prompt[len(old):]


def _with_prompt(render, window: list[dict], head: str, core: str, p: int) -> str | None:
    """The full render with the generation prompt from `window`'s (`window_delta` with a mark)."""
    text = render(window, True)
    at = len(head) + len(core) - p
    if not text.startswith(head) or not text.startswith(core[p:], len(head)):
        return None
    return core + text[at:]


def _extend_marked(render, window: list[dict], agp: bool, head: str, prompt: str | None, core: str,
                   p: int) -> tuple[str, str] | None:
    """`window_delta` with a mark `(j, p)` and new messages: `window` is the lead plus `chat[j:]`."""
    new = render(window, False)
    at = len(head) + len(core) - p
    if not new.startswith(head) or not new.startswith(core[p:], len(head)):
        return None
    new_core = core + new[at:]
    if not agp:
        return new_core, new_core
    if prompt is not None:
        return new_core, new_core + prompt
    with_prompt = _with_prompt(render, window, head, core, p)
    return None if with_prompt is None else (new_core, with_prompt)
