"""Running only some iterations of a template's loop, each with the `loop` Jinja would give it.

A marked render (`iteration_reuse`) writes the main loop's first and newest iterations only. Skipping the
others inside the loop (an `if` on `loop.index0`) still walks every message; instead the loop iterates
`select_iterations(...)`, pairs of a `SelectedLoop` and the item, and its body reads that object in place
of `loop` (`rename_loop`), so the iterations it skips cost nothing.
"""

from __future__ import annotations

import itertools
from typing import Any

from ctxkit.text.template.sandbox import LoopView, sandbox_environment


def rename_loop(body: list, nodes, name: str) -> None:
    """Make a loop's `loop` in `body` (not an inner loop's) read `name`: the `SelectedLoop` of its iteration."""
    todo = list(body)
    while todo:
        n = todo.pop()
        if isinstance(n, nodes.Name) and n.name == "loop":
            n.name = name
        elif isinstance(n, nodes.For):  # an inner loop's own `loop` is in its target, body and test
            todo += [n.iter, *n.else_]
        else:
            todo += list(n.iter_child_nodes())


class SelectedLoop(LoopView):
    """The `loop` of one iteration of a loop that runs only some of its iterations (`select_iterations`): the attributes
    a reusable main loop may read (`iteration_reuse`), as Jinja's own loop object gives them."""

    __slots__ = ("index0", "index", "first", "last", "_items")

    def __init__(self, items: list, index0: int):
        self.index0, self.index = index0, index0 + 1
        self.first, self.last = index0 == 0, index0 == len(items) - 1
        self._items = items

    @property
    def previtem(self) -> Any:
        """The item before this one, or an undefined value on the first (as `loop.previtem`)."""
        if self.first:
            return sandbox_environment().undefined("there is no previous item")
        return self._items[self.index0 - 1]

    @property
    def nextitem(self) -> Any:
        """The item after this one, or an undefined value on the last (as `loop.nextitem`)."""
        if self.last:
            return sandbox_environment().undefined("there is no next item")
        return self._items[self.index0 + 1]


def select_iterations(items: Any, lead: int, start: int):
    """`(SelectedLoop, item)` for iterations `< lead` and `>= start` of `items` only, in order."""
    items = list(items)
    n = len(items)
    for i in itertools.chain(range(min(lead, n)), range(max(start, lead), n)):
        yield SelectedLoop(items, i), items[i]


__all__ = ["SelectedLoop", "rename_loop", "select_iterations"]
