"""Rendering a growing conversation from a message on, the main loop's earlier iterations kept.

A template that rewrites history (Qwen3: a namespace computed from the whole list before its loop over
messages, `loop.last` inside it) is not local (`locality`), so an append used to re-render every message.
Its main loop's iterations are still independent: Jinja resets `{% set %}` names on every iteration, so
the text iteration `i` writes depends only on what its body reads. `reuse_plan` reads the syntax tree and
accepts a template whose main loop (`{% for message in messages %}` at the top level) reads nothing but:
message `i`, `messages[0]`, neighbours `messages[loop.index0 +- k]` (`k <= reach`), `loop.first / last /
index / index0 / previtem / nextitem`, names the template sets before the loop (the *snapshot*, e.g.
`ns`), the generation-prompt flag, and values every render is given alike (tools, special tokens, globals,
macros that read only their arguments). Refused, with the reason: `messages|length` or other whole-list
uses in the body, `loop.length / revindex / changed / cycle`, a namespace attribute assigned in the body,
`break`, a macro reading a template variable, includes and imports, and `messages` assigned anything but
`messages[c:]` or assigned in the loop (Llama 3.2 shortens it so: the loop then iterates a suffix of the list
given, and the snapshot records how many messages it skips).

`render_pieces` renders a copy of the template (compiled once per template) whose loop writes only
iterations `< lead` and `>= start`, each after a marker, and prints the snapshot before the loop. After
appending to `m` messages whose render is known, `start = m - reach` and `lead = reach`: every iteration
in `[lead, start)` reads messages below `m` only (unchanged), `loop.last` is false in both renders, and
its backward neighbours do not wrap to the list's end (those of the first `reach` iterations may: they
are re-rendered). So when the snapshot's text equals the earlier render's, those iterations' text equals
the earlier text, and the whole render is the fresh prelude and lead, the kept middle, and the fresh tail
(`text.rendering.window.resumed_text`). Exact by construction; tests compare with full renders.
"""

from __future__ import annotations

import copy
import functools
import secrets
import threading
from dataclasses import dataclass
from typing import Any

from ctxkit.errors import TemplateError
from ctxkit.text.template.chat_template import ChatTemplate
from ctxkit.text.template.loop_select import rename_loop, select_iterations
from ctxkit.text.template.sandbox import compile_template, render_sandboxed, sandbox_environment
from ctxkit.text.template.scan_reuse import HIT, SCAN, LastMatchScan, ScanRecord, hit, last_match_scans, mark_scans, scan
from ctxkit.text.template.scan_reuse import scan_records

_LOOP_ATTRS = frozenset({"first", "last", "index", "index0", "previtem", "nextitem"})
_CONSTANT = frozenset({"tools", "documents"})
"""Render variables every render of one renderer is given alike (besides the template's `variables`)."""
_NONCE = secrets.token_hex(8)
SECTION = f"\x1ectxkit-section-{_NONCE}\x1e"
"""Marks the snapshot's ends and the loop's end in a marked render (random per process)."""
ITERATION = f"\x1ectxkit-iteration-{_NONCE}\x1e"
"""Opens each iteration a marked render writes."""
STATE = f"\x1ectxkit-state-{_NONCE}\x1e"
"""Ends the carried namespaces' state written after an iteration's marker (`ReusePlan.carried`)."""
LEAD, START, SNAPSHOT, GIVEN, CARRIED, RESTORE = ("__ctxkit_lead", "__ctxkit_start", "__ctxkit_snapshot",
                                                 "__ctxkit_messages", "__ctxkit_carried", "__ctxkit_restore")
SELECT, LOOP = "__ctxkit_select", "__ctxkit_loop"


@dataclass(frozen=True)
class ReusePlan:
    """Whether a template's main loop may be rendered from a message on (`reuse_plan`), and how."""

    ok: bool
    """Iterations before a start may be taken from an earlier render (module docstring)."""
    reason: str
    """Empty when ok; otherwise what ruled it out."""
    reach: int = 1
    """Farthest neighbour the loop body reads (`messages[loop.index0 + 2]` reaches 2; at least 1)."""
    names: tuple[str, ...] = ()
    """Names the loop body reads whose values may differ between renders: printed as the snapshot."""
    loop_list: str = "messages"
    """The list the main loop iterates: `messages` or an alias of `messages` or `messages[c:]` (`loop_messages`);
    the snapshot holds how many messages precede its first."""
    carried: tuple[str, ...] = ()
    """Namespaces set before the loop whose attributes the loop (or a macro it calls) assigns (Qwen 3.5's image
    counters, DeepSeek's turn flags): a marked render records their state at each iteration's start, and one
    that skips iterations sets them, at the first iteration after the gap, to the state the earlier render
    had there (module docstring)."""
    scans: tuple[LastMatchScan, ...] = ()
    """Loops before the main one that find the last matching message (`scan_reuse`): a marked render resumes
    them from an earlier one's `ScanRecord`s."""


@dataclass(frozen=True)
class Pieces:
    """A marked render cut at its markers."""

    prelude: str
    """The text before the main loop."""
    snapshot: str
    """The snapshot's text (`ReusePlan.names`' values as the loop saw them)."""
    iterations: list[str]
    """The text of each iteration written (`< lead`, then `>= start`), in order."""
    epilogue: str
    """The text after the loop."""
    offset: int = 0
    """Messages before the loop's first (`ReusePlan.loop_list`): iteration `i` renders message `i + offset`."""
    states: list[tuple[str, tuple]] | None = None
    """With `ReusePlan.carried`: per iteration written, the carried namespaces' state at its start, before any
    `restore` (its text, and a copy of each namespace's attributes); else None."""
    scans: dict[int, ScanRecord] | None = None
    """Per scan of `ReusePlan.scans` (by position) that ran over the messages given, what it found."""


def _is_messages(n, nodes, lists: Any = ("messages",)) -> bool:
    return isinstance(n, nodes.Name) and n.name in lists


def _aliases(tree, nodes) -> dict[str, int]:
    """Names every assignment of which is `messages` or `messages[c:]` (Llama 3's `loop_messages`), each with
    the largest `c`."""
    out: dict[str, int] = {}
    refused: set[str] = set()
    for node in tree.find_all(nodes.Assign):
        if not isinstance(node.target, nodes.Name):
            continue
        name, start = node.target.name, _suffix_start(node.node, nodes)
        if start is None:
            refused.add(name)
        else:
            out[name] = max(out.get(name, 0), start)
    stored_otherwise = {n.name for n in tree.find_all(nodes.Name) if n.ctx == "param"}
    stored_otherwise |= {n.name for f in tree.find_all(nodes.For) for n in [f.target, *f.target.find_all(nodes.Name)]
                         if isinstance(n, nodes.Name)}
    stored_otherwise |= {b.target.name for b in tree.find_all(nodes.AssignBlock) if isinstance(b.target, nodes.Name)}
    return {k: v for k, v in out.items() if k not in refused | stored_otherwise and k != "messages"}


def _suffix_start(value, nodes) -> int | None:
    """`c` when `value` is `messages[c:]` (a constant `c >= 0`; `messages` itself is 0), else None."""
    if _is_messages(value, nodes):
        return 0
    if (isinstance(value, nodes.Getitem) and _is_messages(value.node, nodes) and isinstance(value.arg, nodes.Slice)
            and value.arg.stop is None and value.arg.step is None and isinstance(value.arg.start, nodes.Const)
            and type(value.arg.start.value) is int and value.arg.start.value >= 0):
        return value.arg.start.value
    return None


def _messages_assignments(tree, main, nodes) -> str:
    """Why the template's assignments to `messages` rule reuse out, or "" when each is `messages[c:]` outside the
    main loop (Llama 3.2 drops the system and first user messages so): the list the loop then iterates is a
    suffix of the one given, whose offset the snapshot records."""
    inside = {id(n) for n in main.find_all(nodes.Name)}
    for n in tree.find_all(nodes.Name):
        if n.name != "messages" or n.ctx == "load":
            continue
        if id(n) in inside:
            return f"line {n.lineno}: the loop over messages assigns messages"
        assign = next((a for a in tree.find_all(nodes.Assign) if a.target is n), None)
        if assign is None or _suffix_start(assign.node, nodes) is None:
            return f"line {n.lineno}: the template assigns messages something other than messages[c:]"
    return ""


def reuse_plan(source: str, constant: frozenset[str] = frozenset()) -> ReusePlan:
    """The plan for template `source` (module docstring); `constant`: render variables given alike to
    every render besides tools and documents (the template's special-token variables)."""
    import jinja2  # lazy: jinja2 loads on first use
    from jinja2 import nodes  # lazy: jinja2 loads on first use

    try:
        tree = sandbox_environment().parse(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        return ReusePlan(False, f"syntax error: {exc.message}")
    if any(True for _ in tree.find_all((nodes.Extends, nodes.Include, nodes.Import, nodes.FromImport, nodes.Block))):
        return ReusePlan(False, "extends, includes, imports or blocks")
    aliases = _aliases(tree, nodes)
    main = _main_loop(tree, nodes, aliases)
    if isinstance(main, str):
        return ReusePlan(False, main)
    loop_list = main.iter.name
    top_set = {name for stmt in tree.body if stmt is not main for name in _stored(stmt, nodes)}
    if why := _messages_assignments(tree, main, nodes):
        return ReusePlan(False, why)
    macros = {m.name: m for m in tree.body if isinstance(m, nodes.Macro)}
    spaces = _top_namespaces(tree, main, nodes)
    scan = _BodyScan(nodes, ("messages", loop_list), aliases.get(loop_list, 0), spaces)
    for child in main.body:
        scan.visit(child, True)
    problems, carried = scan.problems, set(scan.carried)
    reached, todo = set(), [n for n in scan.loaded if n in macros]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        problems += _macro_problems(macros[name], top_set, macros, todo, nodes, spaces, carried)
    if carried & scan.stored:
        problems.append(f"the loop sets {sorted(carried & scan.stored)} itself")
    if problems:
        return ReusePlan(False, "; ".join(dict.fromkeys(problems)))
    targets = set(_stored(main.target, nodes))
    fixed = _CONSTANT | constant | set(sandbox_environment().globals)
    names = sorted(n for n in (scan.loaded | carried) - targets - {"messages", "loop", loop_list} - set(macros)
                   if n in top_set or n not in fixed and n not in scan.stored or n == "add_generation_prompt")
    scans = last_match_scans(tree, main, nodes, ("messages", *aliases), frozenset(fixed))
    return ReusePlan(True, "", scan.reach, tuple(names), loop_list, tuple(sorted(carried)), scans)


def _top_namespaces(tree, main, nodes) -> frozenset[str]:
    """Names every assignment of which is a `namespace(...)` call outside the main loop (and outside macros)."""
    inside = {id(a) for a in main.find_all(nodes.Assign)}
    inside |= {id(a) for m in tree.find_all(nodes.Macro) for a in m.find_all(nodes.Assign)}
    made, other = set(), set()
    for a in tree.find_all(nodes.Assign):
        if isinstance(a.target, nodes.Name):
            is_ns = (id(a) not in inside and isinstance(a.node, nodes.Call) and isinstance(a.node.node, nodes.Name)
                     and a.node.node.name == "namespace")
            (made if is_ns else other).add(a.target.name)
    return frozenset(made - other)


def _main_loop(tree, nodes, aliases: dict[str, int]):
    """The top-level `for ... in messages` (or an alias of it, `_aliases`) loop that writes text (others over
    the list, scans that set a namespace, are part of the prelude), or why there is none to use."""
    lists = ("messages", *aliases)
    loops = [n for n in tree.find_all(nodes.For) if _is_messages(n.iter, nodes, lists)]
    top = [n for n in tree.body if isinstance(n, nodes.For) and _is_messages(n.iter, nodes, lists) and _writes(n, nodes)]
    if len(top) != 1 or any(inner is not top[0] for inner in top[0].find_all(nodes.For) if inner in loops):
        return f"{len(loops)} loops over messages, {len(top)} writing text at the top level (expected exactly one)"
    main = top[0]
    if main.recursive or main.test is not None or main.else_:
        return f"line {main.lineno}: the loop over messages is filtered, recursive or has an else"
    return main


def _writes(loop, nodes) -> bool:
    """Whether a loop's body writes anything (text that is not empty, or a value)."""
    return any(not (isinstance(c, nodes.TemplateData) and not c.data)
               for out in loop.find_all(nodes.Output) for c in out.nodes)


def _stored(node, nodes) -> list[str]:
    """Names a statement assigns (set, set block, for and with targets, a macro's name), at any depth outside
    macro bodies (a macro's parameters and locals are its own)."""
    if isinstance(node, nodes.Macro):
        return [node.name]
    if isinstance(node, nodes.Name):
        return [node.name] if node.ctx in ("store", "param") else []
    return [name for child in node.iter_child_nodes() for name in _stored(child, nodes)]


def _macro_problems(macro, top_set: set[str], macros: dict, todo: list, nodes, spaces: frozenset[str] = frozenset(),
                    carried: set[str] | None = None) -> list[str]:
    """Why a macro the loop calls makes iterations depend on more than they read (and the macros it calls
    go to `todo`). A namespace of `spaces` it reads or assigns attributes of is carried state (`carried`)."""
    problems = []
    carried = set() if carried is None else carried
    own = {a.name for a in macro.args} | {n.name for n in macro.find_all(nodes.Name) if n.ctx in ("store", "param")}
    for n in macro.find_all(nodes.Name):
        if n.ctx != "load" or n.name in own:
            continue
        if n.name in macros:
            todo.append(n.name)
        elif n.name in spaces:
            carried.add(n.name)
        elif n.name == "messages" or n.name in top_set:
            problems.append(f"line {n.lineno}: macro {macro.name} reads {n.name}")
    for ref in macro.find_all(nodes.NSRef):
        if ref.name in spaces and ref.name not in own:
            carried.add(ref.name)
        else:
            problems.append(f"macro {macro.name} assigns a namespace attribute ({ref.name}.{ref.attr})")
    return problems


class _BodyScan:
    """Walks the main loop's body: what it loads and stores, its reach, and what breaks independence."""

    def __init__(self, nodes, lists: tuple[str, ...], shift: int, spaces: frozenset[str] = frozenset()):
        self.nodes = nodes
        self.spaces = spaces
        """Namespaces set before the loop: attributes of these assigned in the body are carried state."""
        self.carried: set[str] = set()
        self.lists = lists
        """`messages` and the list the loop iterates (the same, or an alias starting `shift` messages later)."""
        self.shift = shift
        self.loaded: set[str] = set()
        self.stored: set[str] = set()
        self.problems: list[str] = []
        self.reach = 1

    def _offset(self, arg) -> int | None:
        nodes = self.nodes
        if self._loop_attr(arg, ("index0", "index")):
            return 0 if arg.attr == "index0" else 1
        if (isinstance(arg, (nodes.Add, nodes.Sub)) and self._loop_attr(arg.left, ("index0", "index"))
                and isinstance(arg.right, nodes.Const) and type(arg.right.value) is int):
            offset = arg.right.value * (1 if isinstance(arg, nodes.Add) else -1)
            return offset + (arg.left.attr == "index")
        return None

    def _loop_attr(self, n, names) -> bool:
        nodes = self.nodes
        return (isinstance(n, nodes.Getattr) and isinstance(n.node, nodes.Name) and n.node.name == "loop"
                and n.attr in names)

    def visit(self, n, main: bool) -> None:
        """Visit `n`; `main`: `loop` here is the main loop's (not an inner loop's)."""
        nodes = self.nodes
        if isinstance(n, nodes.For):
            self.visit(n.iter, main)
            for child in n.else_:
                self.visit(child, main)
            for child in [n.target, *n.body] + ([n.test] if n.test is not None else []):
                self.visit(child, False)
            return
        if isinstance(n, nodes.Break) and main:
            self.problems.append(f"line {n.lineno}: break in the loop over messages")
        elif isinstance(n, nodes.NSRef):
            if n.name in self.spaces:
                self.carried.add(n.name)
            else:
                self.problems.append(f"line {n.lineno}: namespace attribute assigned in the loop ({n.name}.{n.attr})")
        elif isinstance(n, nodes.Getitem) and _is_messages(n.node, nodes, self.lists):
            arg = n.arg
            if isinstance(arg, nodes.Const) and arg.value == 0:
                return
            offset = self._offset(arg) if main else None
            if offset is None:
                self.problems.append(f"line {n.lineno}: {n.node.name}[...] other than [0] or a neighbour")
            else:  # messages[i + k] in a loop over messages[c:] is iteration i + k - c
                self.reach = max(self.reach, abs(offset) + (self.shift if n.node.name == "messages" else 0))
            return
        elif _is_messages(n, nodes, self.lists):
            if not self._truth_use:
                self.problems.append(f"line {n.lineno}: the message list used as a whole")
            return
        elif isinstance(n, nodes.Getattr) and isinstance(n.node, nodes.Name) and n.node.name == "loop":
            if main and n.attr not in _LOOP_ATTRS:
                self.problems.append(f"line {n.lineno}: loop.{n.attr} in the loop over messages")
            return
        elif isinstance(n, nodes.Name):
            if n.name == "loop" and main and n.ctx == "load":
                self.problems.append(f"line {n.lineno}: the loop object used as a whole")
            (self.loaded if n.ctx == "load" else self.stored).add(n.name)
            return
        elif isinstance(n, nodes.Macro):
            self.stored.add(n.name)
        for child in n.iter_child_nodes():
            self._truth_use = self._is_truth_use(n, child)
            self.visit(child, main)
        self._truth_use = False

    _truth_use = False

    def _is_truth_use(self, parent, child) -> bool:
        """`messages` as a truth value: an `if`'s or `and`/`or`/`not`'s operand."""
        nodes = self.nodes
        if not _is_messages(child, nodes, self.lists):
            return False
        return (isinstance(parent, (nodes.And, nodes.Or, nodes.Not))
                or isinstance(parent, (nodes.If, nodes.CondExpr)) and child is parent.test)


_COMPILED: dict[str, Any] = {}
_LOCK = threading.Lock()


def _marked_template(template: ChatTemplate, plan: ReusePlan):
    """The compiled copy of `template` with the markers and the lead / start test (module docstring)."""
    from jinja2 import nodes  # lazy: jinja2 loads on first use

    key = f"{template.sha256}:reuse"
    with _LOCK:
        hit = _COMPILED.get(key)
    if hit is not None:
        return hit
    env = sandbox_environment()
    tree = env.parse(template.source)
    main = _main_loop(tree, nodes, _aliases(tree, nodes))
    mark_scans(tree, nodes, plan.scans)
    line = main.lineno
    selected = isinstance(main.target, nodes.Name)
    if selected:  # the loop iterates only the iterations written: the others cost nothing at all
        rename_loop(main.body, nodes, LOOP)
        main.iter = nodes.Call(nodes.Name(SELECT, "load"), [main.iter, nodes.Name(LEAD, "load"),
                                                             nodes.Name(START, "load")], [], None, None)
        main.target = nodes.Tuple([nodes.Name(LOOP, "store"), main.target], "store")
    index0 = nodes.Getattr(nodes.Name(LOOP if selected else "loop", "load"), "index0", "load")
    test = nodes.Or(nodes.Compare(index0, [nodes.Operand("lt", nodes.Name(LEAD, "load"))]),
                    nodes.Compare(index0, [nodes.Operand("gteq", nodes.Name(START, "load"))]))
    opening = [nodes.Output([nodes.TemplateData(ITERATION)])]
    if plan.carried:
        spaces = [nodes.Name(n, "load") for n in plan.carried]
        at_start = nodes.Compare(index0, [nodes.Operand("eq", nodes.Name(START, "load"))])
        opening = [nodes.Output([nodes.TemplateData(ITERATION), nodes.Call(nodes.Name(CARRIED, "load"), spaces, [],
                                                                           None, None), nodes.TemplateData(STATE)]),
                   nodes.If(at_start, [nodes.Output([nodes.Call(nodes.Name(RESTORE, "load"), spaces, [], None, None)])],
                            [], [])]
    main.body = [*opening, *main.body] if selected else [nodes.If(test, [*opening, *main.body], [], [])]
    snapshot = nodes.Call(nodes.Name(SNAPSHOT, "load"), [nodes.Name(n, "load") for n in
                                                        (GIVEN, "messages", plan.loop_list, *plan.names)], [], None, None)
    at = tree.body.index(main)
    tree.body[at:at + 1] = [nodes.Output([nodes.TemplateData(SECTION), snapshot, nodes.TemplateData(SECTION)]),
                            main, nodes.Output([nodes.TemplateData(SECTION)])]
    for node in tree.find_all(nodes.Node):
        if node.lineno is None:
            node.lineno = line
    tree.set_environment(env)
    compiled = compile_template(tree, key, template.name)
    with _LOCK:
        _COMPILED[key] = compiled
    return compiled


def _snapshot(record: dict, given: Any, messages: Any, loop_list: Any, *values: Any) -> str:
    """The text a snapshot compares by: how many of the messages given precede the loop's first (kept in
    `record`) and the first of `messages` as the loop sees it (a template may drop leading ones), and each
    value's type and repr (an object without a value repr shows its identity, so it never compares equal
    across renders: a full render then)."""
    record["offset"] = offset = len(given) - len(loop_list)
    return repr([offset, len(given) - len(messages), *((type(v).__name__, v) for v in values)])


def _attrs(space: Any) -> dict:
    """A namespace's attribute dict itself (Jinja keeps it private)."""
    return object.__getattribute__(space, "_Namespace__attrs")


def _carried_state(record: list, *spaces: Any) -> str:
    """The text a carried state compares by (`ReusePlan.carried`): each namespace's type and repr; a copy of
    each one's attributes goes to `record`."""
    from jinja2.utils import Namespace  # lazy: jinja2 loads on first use

    text = repr([(type(v).__name__, v) for v in spaces])
    record.append((text, tuple(copy.deepcopy(_attrs(v)) if isinstance(v, Namespace) else None for v in spaces)))
    return ""


def _restore(values: tuple | None, *spaces: Any) -> str:
    """Set each carried namespace's attributes to a copy of `values` (recorded by `_carried_state`)."""
    from jinja2.utils import Namespace  # lazy: jinja2 loads on first use

    if values is None:
        return ""
    for space, attrs in zip(spaces, values, strict=True):
        if not isinstance(space, Namespace) or attrs is None:
            raise TemplateError("a carried namespace is no namespace here: cannot restore its state")
        _attrs(space).clear()
        _attrs(space).update(copy.deepcopy(attrs))
    return ""


def render_pieces(template: ChatTemplate, plan: ReusePlan, chat: list[dict], tools: Any, agp: bool,
                  lead: int, start: int, restore: tuple | None = None,
                  resume: dict[int, ScanRecord] | None = None) -> Pieces | None:
    """Render `chat` through the marked copy of `template`, writing iterations `< lead` and `>= start`;
    `restore`: the carried namespaces' attributes to set at iteration `start` (`Pieces.states`); `resume`: the
    scans' records of an earlier render whose first `known` messages are these (`scan_reuse`). None when the
    markers do not cut it as expected (a message's text holding one)."""
    compiled = _marked_template(template, plan)
    variables = template.render_variables(chat, tools, agp)
    record: dict[str, int] = {}
    states: list = []
    found: dict = {}
    variables.update({SCAN: functools.partial(scan, found, resume or {}, variables["messages"]),
                      HIT: functools.partial(hit, found)})
    variables.update({LEAD: lead, START: start, SELECT: select_iterations, SNAPSHOT: functools.partial(_snapshot, record),
                      GIVEN: variables["messages"], CARRIED: functools.partial(_carried_state, states),
                      RESTORE: functools.partial(_restore, restore)})
    text = render_sandboxed(compiled, template.limits, variables, f"template {template.id}")
    parts = text.split(SECTION)
    if len(parts) != 4:
        return None
    iterations = parts[2].split(ITERATION)
    offset = record.get("offset", -1)
    n = len(chat) - offset
    if offset < 0 or iterations[0] or len(iterations) - 1 != min(lead, n) + max(0, n - max(start, lead)):
        return None
    if plan.carried:
        if any(not it.startswith(STATE) for it in iterations[1:]) or len(states) != len(iterations) - 1:
            return None
        iterations = [""] + [it[len(STATE):] for it in iterations[1:]]
    return Pieces(parts[0], parts[1], iterations[1:], parts[3], offset, states if plan.carried else None,
                  scan_records(found))


__all__ = ["ITERATION", "SECTION", "STATE", "Pieces", "ReusePlan", "render_pieces", "reuse_plan"]
