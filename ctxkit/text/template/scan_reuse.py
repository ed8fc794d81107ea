"""Scans before the main loop that find the last message matching a test, resumed from an earlier render.

Templates that rewrite history find, before their main loop, the last message of some kind: Qwen3 walks
`messages[::-1]` until the first user query (`ns.multi_step_tool` clears when found, `ns.last_query_index`
takes its index); Nemotron 3 walks `loop_messages` forward and keeps the last user index. Every render runs the
whole scan, one iteration per message, which in an agent episode (one user query, then hundreds of tool turns)
costs more than the render's own text. `last_match_scans` reads the syntax tree and accepts a top-level loop
over `messages` (or an alias, `iteration_reuse`) of one of two shapes:

- *forward*: `{% for m in L %}` whose writes sit in one block under tests of `m`; the last match wins.
- *reverse with a flag*: `{% for m in L[::-1] %}` whose body is one `{% if ns.F and ... %}` (tests of `m`
  inside it) and whose writes sit in one block that also sets `ns.F` to a false constant; the first match
  in that order, the last in the list's, wins. `ns` is made once at the top level with `F` true.

In both, the test reads only the message (its attributes, filters, tests, string methods, literals, the
renderer's constants, and macros that, called with the scan's constant arguments, read only those, render
variables the template never sets, and namespaces nothing writes before the scan ends: Qwen 3.5 counts images
in its content macro only when an argument the scan passes as `false` says so), the block writes only attributes of namespaces,
from the message, the loop's `index0` / `index` and `L|length` (integer arithmetic: it cannot fail), and
nothing in the loop prints. So an iteration whose message fails the test does nothing, and the loop's whole
effect is the block run at the largest matching index `j`. A marked render (`iteration_reuse`) records `j`
(`ScanRecord`); the next one, after messages were appended to the `known` first ones (unchanged: the premise
of every kept iteration), iterates only the new messages and `j`, in the loop's order, each with its own
`loop.index0`: by the shapes above its effect is the same, and every test the full loop would evaluate on a
message below `known` gave the same answer without error when an earlier render evaluated it (by induction
from a full scan). A `j` that is not below `known` (a cut since) means a full scan.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from ctxkit.text.template.sandbox import LoopView

SCAN, HIT, SCAN_LOOP = "__ctxkit_scan", "__ctxkit_hit", "__ctxkit_scan_loop"
_PURE_LOOP = frozenset({"index0", "index"})


@dataclass(frozen=True)
class LastMatchScan:
    """A scan `last_match_scans` accepts: its position in the template's top-level statements and shape."""

    at: int
    """Index of the loop in the parsed template's top-level body."""
    reverse: bool
    """Iterates `L[::-1]` and stops at its first match (a flag the match clears); else forward, the last wins."""
    flag: tuple[str, str] | None
    """`(namespace, attribute)` the reverse scan tests first; None when forward."""


@dataclass(frozen=True)
class ScanRecord:
    """What a marked render learned from one scan: valid for messages `first` to `known`."""

    first: int
    """Index of the first message of the list the scan iterated (`L` may skip leading messages)."""
    known: int
    """Messages the scan covered (the render's message count)."""
    hit: int | None
    """Largest index below `known` whose message matched, or None when none did."""


def last_match_scans(tree, main, nodes, lists: tuple[str, ...], fixed: frozenset[str]) -> tuple[LastMatchScan, ...]:
    """The top-level loops before `main` (the main loop) of one of the module docstring's shapes over a list of
    `lists` (`messages` and its aliases); `fixed`: names every render is given alike."""
    macros = {m.name: m for m in tree.body if isinstance(m, nodes.Macro)}
    made = _namespaces_made_once(tree, nodes)
    out = []
    for at, stmt in enumerate(tree.body):
        if stmt is main:
            break
        if isinstance(stmt, nodes.For) and (shape := _shape(stmt, nodes, lists, fixed, macros,
                                                            _Context(tree, at, made))) is not None:
            out.append(LastMatchScan(at, *shape))
    return tuple(out)


def _namespaces_made_once(tree, nodes) -> dict[str, Any]:
    """Name -> the `namespace(...)` call of names assigned exactly once in the whole template, at the top level."""
    counts: dict[str, int] = {}
    for a in tree.find_all((nodes.Assign, nodes.AssignBlock, nodes.For, nodes.Macro)):
        targets = [a.target] if not isinstance(a, nodes.Macro) else []
        for t in targets:
            for n in [t, *t.find_all(nodes.Name)]:
                if isinstance(n, nodes.Name):
                    counts[n.name] = counts.get(n.name, 0) + 1
    return {a.target.name: a.node for a in tree.body
            if isinstance(a, nodes.Assign) and isinstance(a.target, nodes.Name) and counts.get(a.target.name) == 1
            and isinstance(a.node, nodes.Call) and isinstance(a.node.node, nodes.Name) and a.node.node.name == "namespace"}


def _shape(loop, nodes, lists, fixed, macros, where) -> tuple[bool, tuple[str, str] | None] | None:
    """`(reverse, flag)` when `loop` is a scan of the module docstring's shapes, else None."""
    if loop.recursive or loop.test is not None or loop.else_ or not isinstance(loop.target, nodes.Name):
        return None
    reverse = _reversed_list(loop.iter, nodes, lists)
    if not reverse and not (isinstance(loop.iter, nodes.Name) and loop.iter.name in lists):
        return None
    check = _Check(nodes, loop.target.name, fixed, macros, lists, where)
    if not check.block(loop.body, top=reverse) or len(check.commits) != 1:
        return None
    if not reverse:
        return False, None
    flag = check.guard
    if flag is None or flag[0] not in where.made or sum(isinstance(s, nodes.If) for s in loop.body) != 1:
        return None  # the guarded `if` must be the body's only one: nothing runs once the flag is clear
    start = next((kw.value for kw in where.made[flag[0]].kwargs if kw.key == flag[1]), None)
    clears = any((a.target.name, a.target.attr) == flag and isinstance(a.node, nodes.Const)
                 and (a.node.value is False or a.node.value is None) for a in check.commits[0])
    if not (isinstance(start, nodes.Const) and start.value is True and clears):
        return None
    return True, flag


def _reversed_list(n, nodes, lists) -> bool:
    return (isinstance(n, nodes.Getitem) and isinstance(n.node, nodes.Name) and n.node.name in lists
            and isinstance(n.arg, nodes.Slice) and n.arg.start is None and n.arg.stop is None
            and _minus_one(n.arg.step, nodes))


def _minus_one(n, nodes) -> bool:
    if isinstance(n, nodes.Neg):
        return isinstance(n.node, nodes.Const) and type(n.node.value) is int and n.node.value == 1
    return isinstance(n, nodes.Const) and type(n.value) is int and n.value == -1


@dataclass(frozen=True)
class _Context:
    """Where a scan sits: the parsed template, the scan's index in its top-level body, the namespaces made once."""

    tree: Any
    at: int
    made: dict


def _decided(test, nodes, bound: dict[str, bool]) -> bool | None:
    """The truth of an `if` test that is a macro argument bound to a constant (or its `not`), else None."""
    if isinstance(test, nodes.Not):
        inner = _decided(test.node, nodes, bound)
        return None if inner is None else not inner
    if isinstance(test, nodes.Name) and test.ctx == "load":
        return bound.get(test.name)
    return None


def _live(node, nodes, bound: dict[str, bool]):
    """`node` and every node under it that can run when the macro arguments in `bound` have those truth values
    (an `if` decided by one keeps only the branch taken)."""
    if isinstance(node, nodes.If) and (taken := _decided(node.test, nodes, bound)) is not None:
        branch = node.body if taken else ([nodes.If(node.elif_[0].test, node.elif_[0].body, node.elif_[1:], node.else_)]
                                          if node.elif_ else node.else_)
        for child in branch:
            yield from _live(child, nodes, bound)
        return
    yield node
    for child in node.iter_child_nodes():
        yield from _live(child, nodes, bound)


def _binding(macro, call, nodes) -> dict[str, bool]:
    """The truth values of `macro`'s arguments that `call` (or the macro's defaults) gives as constants."""
    names = [a.name for a in macro.args]
    values = dict(zip(names[len(names) - len(macro.defaults):], macro.defaults))
    values.update(zip(names, call.args))
    values.update((kw.key, kw.value) for kw in call.kwargs if kw.key in names)
    if call.dyn_args is not None or call.dyn_kwargs is not None:
        return {}
    stored = {n.name for n in macro.find_all(nodes.Name) if n.ctx == "store"}  # an argument set again is not bound
    return {k: bool(v.value) for k, v in values.items() if isinstance(v, nodes.Const) and k not in stored}


class _Check:
    """Walks a scan's body: its statements, the one block that writes namespaces, and what each expression reads."""

    def __init__(self, nodes, target: str, fixed: frozenset[str], macros: dict, lists: tuple[str, ...],
                 where: _Context):
        self.nodes, self.target, self.fixed, self.macros, self.lists = nodes, target, fixed, macros, lists
        self.where = where
        self.message_locals: set[str] = set()
        """Locals computed from the message only (a test may read them)."""
        self.index_locals: set[str] = set()
        """Locals computed from the loop's position (only the writing block may read them)."""
        self.commits: list[list] = []
        self.guard: tuple[str, str] | None = None

    def block(self, body: list, top: bool = False) -> bool:
        nodes = self.nodes
        writes = [s for s in body if isinstance(s, nodes.Assign) and isinstance(s.target, nodes.NSRef)]
        if writes:
            if not all(self.value(s.node) for s in writes):
                return False
            self.commits.append(writes)
        for s in body:
            if s in writes:
                continue
            if isinstance(s, nodes.Assign) and isinstance(s.target, nodes.Name):
                name = s.target.name
                if self.about_message(s.node):
                    self.message_locals.add(name)
                elif self.integer(s.node):
                    self.index_locals.add(name)
                else:
                    return False
            elif isinstance(s, nodes.If) and not s.elif_ and not s.else_:
                test = s.test
                if top:  # the reverse scan's one `if`: its leftmost operand is the flag
                    if self.guard is not None or (flag := self._flag(test)) is None:
                        return False
                    self.guard, test = flag, self._rest(test)
                if test is not None and not self.about_message(test):
                    return False
                if not self.block(s.body):
                    return False
            else:
                return False
        return True

    def _flag(self, test) -> tuple[str, str] | None:
        """`(ns, F)` when `test` is `ns.F and ...` (the leftmost operand of a chain of `and`)."""
        nodes = self.nodes
        while isinstance(test, nodes.And):
            test = test.left
        if isinstance(test, nodes.Getattr) and isinstance(test.node, nodes.Name) and test.node.name != self.target:
            return test.node.name, test.attr
        return None

    def _rest(self, test):
        """`test` without its leftmost operand (None when it was only that)."""
        nodes = self.nodes
        if not isinstance(test, nodes.And):
            return None
        left = self._rest(test.left)
        return test.right if left is None else nodes.And(left, test.right)

    def value(self, n) -> bool:
        """A written value: from the message, locals and the loop's position."""
        return self.about_message(n, allow_index=True) or self.integer(n)

    def integer(self, n) -> bool:
        """Integer arithmetic on constants, `loop.index0` / `loop.index`, `L|length` and position locals."""
        nodes = self.nodes
        if isinstance(n, nodes.Const):
            return type(n.value) is int
        if isinstance(n, nodes.Name):
            return n.name in self.index_locals
        if isinstance(n, nodes.Getattr):
            return isinstance(n.node, nodes.Name) and n.node.name == "loop" and n.attr in _PURE_LOOP
        if isinstance(n, nodes.Filter):
            return (n.name == "length" and not n.args and not n.kwargs and n.dyn_args is None and n.dyn_kwargs is None
                    and isinstance(n.node, nodes.Name) and n.node.name in self.lists)
        if isinstance(n, (nodes.Add, nodes.Sub)):
            return self.integer(n.left) and self.integer(n.right)
        return isinstance(n, nodes.Neg) and self.integer(n.node)

    def about_message(self, n, allow_index: bool = False) -> bool:
        """An expression that reads only the message, message locals (and position locals with `allow_index`),
        literals, the renderer's constants and macros that, called so, read only their arguments."""
        nodes = self.nodes
        calls = [c for c in n.find_all(nodes.Call) if isinstance(c.node, nodes.Name)]
        called = {id(c.node) for c in calls}
        for name in n.find_all(nodes.Name):
            ok = (name.name == self.target or name.name in self.message_locals or name.name in self.fixed
                  or allow_index and name.name in self.index_locals
                  or name.name in self.macros and (id(name) in called or self._pure(name.name)))
            if name.ctx != "load" or not ok:
                return False
        # a name called must be a macro (a global may read the clock); the names read above exclude the list
        return all(c.node.name in self.macros and self._pure(c.node.name, _binding(self.macros[c.node.name], c, nodes))
                   for c in calls)

    def _pure(self, name: str, bound: dict[str, bool] | None = None, seen: frozenset[str] = frozenset()) -> bool:
        """A macro that, with its arguments' constant truth values `bound`, reads only its arguments, literals,
        constants, render variables the template never sets, namespaces nothing writes before the scan ends
        (`_frozen`) and other such macros, writes nothing, and calls only those and `raise_exception`."""
        nodes = self.nodes
        macro = self.macros[name]
        live = list(itertools.chain.from_iterable(_live(s, nodes, bound or {}) for s in macro.body))
        own = {a.name for a in macro.args} | {n.name for n in live if isinstance(n, nodes.Name) and n.ctx in ("store", "param")}
        if any(isinstance(n, (nodes.NSRef, nodes.CallBlock)) for n in live):
            return False
        for n in live:
            if not isinstance(n, nodes.Name) or n.ctx != "load" or n.name in own or n.name in self.fixed or n.name in (
                    "loop", "caller", "varargs", "kwargs", "raise_exception"):
                continue
            if n.name in self.macros:
                if n.name in seen or not self._pure(n.name, None, seen | {name}):
                    return False
            elif not (self._unset(n.name) or self._frozen(n.name)):
                return False
        return not any(isinstance(c, nodes.Call) and isinstance(c.node, nodes.Name) and c.node.name not in own
                       and c.node.name != "raise_exception" and c.node.name not in self.macros for c in live)

    def _unset(self, name: str) -> bool:
        """A render variable every render gets alike: never assigned in the template, not the messages, not the
        generation-prompt flag (undefined, or given by the template's variables)."""
        if name in self.lists or name in ("messages", "add_generation_prompt"):
            return False
        nodes = self.nodes
        return not any(n.name == name and n.ctx != "load" for n in self.where.tree.find_all(nodes.Name))

    def _frozen(self, name: str) -> bool:
        """A namespace made once at the top level whose every write is inside a macro, in a branch that no call
        which can run before the scan ends takes (Qwen 3.5 counts images only when `do_vision_count`, which the
        scan and the system message's render pass as false): it holds what it was made with during the scan."""
        where, nodes = self.where, self.nodes
        if name not in where.made:
            return False
        writers = {m.name for m in where.tree.find_all(nodes.Macro)
                   if any(r.name == name for r in m.find_all(nodes.NSRef))}
        if any(r.name == name for stmt in where.tree.body[: where.at + 1] if not isinstance(stmt, nodes.Macro)
               for r in stmt.find_all(nodes.NSRef)):
            return False  # written outside a macro before the scan or by it
        later = {id(c) for stmt in where.tree.body[where.at + 1:] if not isinstance(stmt, nodes.Macro)
                 for c in stmt.find_all(nodes.Call)}
        for call in where.tree.find_all(nodes.Call):
            if id(call) in later or not (isinstance(call.node, nodes.Name) and call.node.name in writers):
                continue
            macro = self.macros.get(call.node.name)
            if macro is None:
                return False
            bound = _binding(macro, call, nodes)
            live = itertools.chain.from_iterable(_live(s, nodes, bound) for s in macro.body)
            if any(isinstance(n, nodes.NSRef) and n.name == name for n in live):
                return False
        return True


def mark_scans(tree, nodes, scans: tuple[LastMatchScan, ...]) -> None:
    """Rewrite each scan of `scans` in `tree` (a parsed copy) to iterate through `SCAN` and report its writing
    block through `HIT` (a scan's body reads `loop` only in integer arithmetic: `ScanLoop` serves it)."""
    for k, scan in enumerate(scans):
        loop = tree.body[scan.at]
        for name in loop.find_all(nodes.Name):
            if name.name == "loop":
                name.name = SCAN_LOOP
        flag = scan.flag or (None, None)
        space = nodes.Name(flag[0], "load") if flag[0] else nodes.Const(None)
        loop.iter = nodes.Call(nodes.Name(SCAN, "load"), [nodes.Const(k), loop.iter, nodes.Const(scan.reverse), space,
                                                          nodes.Const(flag[1])], [], None, None)
        loop.target = nodes.Tuple([nodes.Name(SCAN_LOOP, "store"), loop.target], "store")
        block = _writing_block(loop.body, nodes)
        block.append(nodes.Output([nodes.Call(nodes.Name(HIT, "load"), [nodes.Const(k), nodes.Name(SCAN_LOOP, "load")],
                                              [], None, None)]))


def _writing_block(body: list, nodes) -> list:
    """The statement list holding the namespace writes (`_Check.commits`: there is exactly one)."""
    if any(isinstance(s, nodes.Assign) and isinstance(s.target, nodes.NSRef) for s in body):
        return body
    for s in body:
        if isinstance(s, nodes.If):
            try:
                return _writing_block(s.body, nodes)
            except LookupError:
                continue
    raise LookupError("no namespace write")


class ScanLoop(LoopView):
    """`loop` of one iteration a resumed scan runs: its position in the list iterated, and the message's index."""

    __slots__ = ("index0", "index", "at")

    def __init__(self, index0: int, at: int):
        self.index0, self.index, self.at = index0, index0 + 1, at


def scan(records: dict, resume: dict, given: list, k: int, items: Any, reverse: bool, space: Any, flag: Any):
    """Iterate scan `k` over `items` (`L` or `L[::-1]`, `L` a suffix of `given`): the new messages and the last
    match of `resume[k]` (a `ScanRecord`) when it applies, else all; `records[k]` gets what this render learns."""
    from jinja2.utils import Namespace  # lazy: jinja2 loads on first use

    items = list(items)
    n, size = len(given), len(items)
    off = n - size
    ends = (items[0], items[-1]) if reverse else (items[-1], items[0])
    suffix = off >= 0 and (not items or ends[0] is given[-1] and ends[1] is given[off])
    armed = flag is None or isinstance(space, Namespace) and getattr(space, flag, None) is True
    records[k] = [off, n if suffix and armed else -1, None]
    got = resume.get(k) if suffix and armed else None
    known = 0 if got is None else min(got.known, n)
    if got is not None and got.first <= off < known and (got.hit is None or off <= got.hit < known):
        new = range(known, n)
        old = () if got.hit is None else (got.hit,)
        order = itertools.chain(reversed(new), old) if reverse else itertools.chain(old, new)
    else:
        order = range(n - 1, off - 1, -1) if reverse else range(off, n)
    for at in order:
        p = n - 1 - at if reverse else at - off
        yield ScanLoop(p, at), items[p]
        if flag is not None and not getattr(space, flag, None):  # cleared: the iterations left do nothing
            return


def hit(records: dict, k: int, loop: ScanLoop) -> str:
    """Record that scan `k`'s writing block ran at message `loop.at` (the last call wins)."""
    records[k][2] = loop.at
    return ""


def scan_records(records: dict) -> dict[int, ScanRecord]:
    """The `ScanRecord` of each scan a render completed over the messages given."""
    return {k: ScanRecord(first, known, got) for k, (first, known, got) in records.items() if known >= 0}


__all__ = ["HIT", "SCAN", "LastMatchScan", "ScanLoop", "ScanRecord", "hit", "last_match_scans", "mark_scans",
           "scan", "scan_records"]
