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

In both, the test reads only the message (its attributes, filters, tests, string methods, macros that read
only their arguments, literals, the renderer's constants), the block writes only attributes of namespaces,
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
        if isinstance(stmt, nodes.For) and (shape := _shape(stmt, nodes, lists, fixed, macros, made)) is not None:
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


def _shape(loop, nodes, lists, fixed, macros, made) -> tuple[bool, tuple[str, str] | None] | None:
    """`(reverse, flag)` when `loop` is a scan of the module docstring's shapes, else None."""
    if loop.recursive or loop.test is not None or loop.else_ or not isinstance(loop.target, nodes.Name):
        return None
    reverse = _reversed_list(loop.iter, nodes, lists)
    if not reverse and not (isinstance(loop.iter, nodes.Name) and loop.iter.name in lists):
        return None
    check = _Check(nodes, loop.target.name, fixed, macros, lists)
    if not check.block(loop.body, top=reverse) or len(check.commits) != 1:
        return None
    if not reverse:
        return False, None
    flag = check.guard
    if flag is None or flag[0] not in made or sum(isinstance(s, nodes.If) for s in loop.body) != 1:
        return None  # the guarded `if` must be the body's only one: nothing runs once the flag is clear
    start = next((kw.value for kw in made[flag[0]].kwargs if kw.key == flag[1]), None)
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


class _Check:
    """Walks a scan's body: its statements, the one block that writes namespaces, and what each expression reads."""

    def __init__(self, nodes, target: str, fixed: frozenset[str], macros: dict, lists: tuple[str, ...]):
        self.nodes, self.target, self.fixed, self.macros, self.lists = nodes, target, fixed, macros, lists
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
        literals, the renderer's constants and macros that read only their arguments."""
        nodes = self.nodes
        for name in n.find_all(nodes.Name):
            ok = (name.name == self.target or name.name in self.message_locals or name.name in self.fixed
                  or allow_index and name.name in self.index_locals or name.name in self.macros and self._pure(name.name))
            if name.ctx != "load" or not ok:
                return False
        # a name called must be a macro (a global may read the clock); the names read above exclude the list
        return all(not isinstance(c.node, nodes.Name) or c.node.name in self.macros for c in n.find_all(nodes.Call))

    def _pure(self, name: str, seen: frozenset[str] = frozenset()) -> bool:
        """A macro that reads only its arguments, literals, constants and other such macros, and writes nothing."""
        nodes = self.nodes
        macro = self.macros[name]
        own = {a.name for a in macro.args} | {n.name for n in macro.find_all(nodes.Name) if n.ctx in ("store", "param")}
        if any(True for _ in macro.find_all((nodes.NSRef, nodes.CallBlock))):
            return False
        for n in macro.find_all(nodes.Name):
            if n.ctx != "load" or n.name in own or n.name in self.fixed or n.name in ("loop", "caller", "varargs", "kwargs"):
                continue
            if n.name not in self.macros or n.name in seen or not self._pure(n.name, seen | {name}):
                return False
        for call in macro.find_all(nodes.Call):
            if isinstance(call.node, nodes.Name) and call.node.name not in self.macros and call.node.name not in own:
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
