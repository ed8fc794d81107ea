"""Per-task scripted policies: pure functions from the decoded context text to the next action.

Each policy sees only the text of its rendered context (what a compressor left visible) and derives
everything from it: how far the chain got (the highest `FILE <path>` it sees), which facts are visible, and
which constraints are visible. When a value it needs is not visible it re-queries a tool (re-reads the file,
searches, recalls a stored product), so an arm's extra tool calls measure what its compression lost. A
policy never keeps state between calls; like a model writing its reasoning, it copies the lines its next
action rests on (the question, the step, the facts found so far) into the content of its tool-call turn, so
a compressor that keeps assistant turns but drops tool output (observation masking) keeps those notes.
Constraints are never copied: a rule is visible only where the compressor (or a pin) keeps it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

__all__ = ["Decision", "POLICIES", "chain_position"]


@dataclass(frozen=True)
class Decision:
    """What a scripted policy does next: one tool call, or a final answer."""

    answer: str | None = None
    """Final answer text (the episode ends), or None for a tool call."""
    tool: str | None = None
    """Tool name to call."""
    arguments: Mapping[str, Any] = field(default_factory=dict)
    """Tool arguments."""
    note: str = ""
    """Content of the tool-call turn: the visible lines the action rests on."""


def call(tool: str, note: str = "", **arguments: Any) -> Decision:
    """A tool-call decision with an optional note."""
    return Decision(tool=tool, arguments=arguments, note=note)


def answer(text: str) -> Decision:
    """A final-answer decision."""
    return Decision(answer=text)


def _last(pattern: str, text: str) -> re.Match[str] | None:
    match = None
    for match in re.finditer(pattern, text):
        pass
    return match


def chain_position(text: str, prefix: str) -> tuple[int, str | None, str | None]:
    """`(index, path, next)` of the highest chained file `<prefix>/<NN>.<ext>` visible in `text`
    (`(-1, None, None)` when none is); `next` is None when its `next:` line is not visible."""
    best: tuple[int, str | None, str | None] = (-1, None, None)
    for m in re.finditer(rf"FILE ({re.escape(prefix)}/(\d+)\.\w+)\n(?:next: (\S+))?", text):
        k = int(m.group(2))
        if k > best[0] or (k == best[0] and best[2] is None):
            best = (k, m.group(1), m.group(3))
    return best


def _follow_chain(text: str, prefix: str, start: str) -> Decision:
    """Read the next file of the chain after the highest visible one (or `start`)."""
    k, path, nxt = chain_position(text, prefix)
    if k < 0:
        return call("read_file", path=start)
    if nxt is None or nxt == "none":  # the pointer or the final question is not visible: read it again
        return call("read_file", path=path)
    return call("read_file", path=nxt)


def needle_recall(text: str) -> Decision:
    """Follow `logs/`; at the question, answer from a visible code or re-read the file it names."""
    q = _last(r"QUESTION: What is the access code for (vault-\d+)\? It was logged in (\S+?)\. Answer with the code only\.", text)
    if q is None:
        return _follow_chain(text, "logs", "logs/00.log")
    code = _last(rf"ACCESS CODE for {re.escape(q.group(1))} is (\S+)", text)
    if code is not None:
        return answer(code.group(1))
    note = q.group(0).strip()
    if f"FILE {q.group(2)}\n" in text[q.end():]:  # re-read, and still not visible (cut): search for it
        return call("search", note=note, query=f"ACCESS CODE for {q.group(1)} is")
    return call("read_file", note=note, path=q.group(2))


def multi_hop(text: str) -> Decision:
    """Follow `records/`; at the question, hop person -> department -> manager -> city, searching each
    fact that is not visible."""
    q = _last(r"QUESTION: In which city is the manager of (\w+)'s department based\?", text)
    if q is None:
        return _follow_chain(text, "records", "records/00.txt")
    person = q.group(1)
    notes = [q.group(0)]
    dept = _last(rf"FACT: {person} works in the (\w+) department\.", text)
    if dept is None:
        return call("search", note="\n".join(notes), query=f"{person} works in")
    notes.append(dept.group(0))
    manager = _last(rf"FACT: The {dept.group(1)} department is managed by (\w+)\.", text)
    if manager is None:
        return call("search", note="\n".join(notes), query=f"The {dept.group(1)} department is managed by")
    notes.append(manager.group(0))
    city = _last(rf"FACT: {manager.group(1)} is based in (\w+)\.", text)
    if city is None:
        return call("search", note="\n".join(notes), query=f"{manager.group(1)} is based in")
    return answer(city.group(1))


def calculator_chain(text: str) -> Decision:
    """Work the worksheet: multiply the highest visible step not yet computed (recalling operands that are
    not visible), else read the next sheet; at the question, answer or recall the asked result."""
    results = {m.group(1): int(m.group(2)) for m in re.finditer(r"RESULT (r\d+) = (?:\d+ \* \d+ = )?(\d+)", text)}
    q = _last(r"QUESTION: Answer with the value of (r\d+)\.", text)
    if q is not None:
        name = q.group(1)
        return answer(str(results[name])) if name in results else call("recall", note=q.group(0), name=name)
    lines = {int(m.group(1)): m.group(0) for m in re.finditer(r"STEP (\d+) of \d+: (r\d+) = (\S+) \* (\S+)", text)}
    steps = {int(m.group(1)): (m.group(2), m.group(3), m.group(4))
             for m in re.finditer(r"STEP (\d+) of \d+: (r\d+) = (\S+) \* (\S+)", text)}
    k = max([*steps, *(int(name[1:]) for name in results), 0])
    if k in steps and steps[k][0] not in results:
        name, a, b = steps[k]
        values = []
        for operand in (a, b):
            if operand.startswith("r"):
                if operand not in results:
                    return call("recall", note=lines[k], name=operand)
                values.append(results[operand])
            else:
                values.append(int(operand))
        return call("multiply", note=lines[k], a=values[0], b=values[1], name=name)
    return call("read_file", path=f"sheet/{k + 1:02d}.txt")


def constraint_edit(text: str) -> Decision:
    """Follow `notes/`; at the TODO, edit the file it names, or the copy a visible rule names instead
    (copy, read, replace), then answer `Done.`. A rule that is not visible is not followed."""
    if _last(r"REPLACED \d+ occurrence\(s\) in (\S+)", text) is not None:
        return answer("Done.")
    todo = _last(r"TODO: set (\w+) to (\S+) in (\S+?)\.(?:\s|$)", text)
    if todo is None:
        return _follow_chain(text, "notes", "notes/00.txt")
    key, new, original = todo.groups()
    rule = _last(r"Never modify the file (\S+); make every change in a copy named (\S+) instead", text)
    target = rule.group(2) if rule is not None and rule.group(1) == original else original
    current = _last(rf"FILE {re.escape(target)}\n(?:[^\n]*\n)*?{re.escape(key)} = (\S+)", text)
    note = todo.group(0).strip()
    if current is not None:
        return call("replace_in_file", note=note, path=target, old=f"{key} = {current.group(1)}", new=f"{key} = {new}")
    if target != original and _last(rf"COPIED {re.escape(original)} -> {re.escape(target)}\b", text) is None:
        return call("copy_file", note=note, src=original, dst=target)
    return call("read_file", note=note, path=target)


POLICIES: dict[str, Callable[[str], Decision]] = {
    "needle-recall": needle_recall,
    "multi-hop": multi_hop,
    "calculator-chain": calculator_chain,
    "constraint-edit": constraint_edit,
}
"""Registry: task name -> scripted policy."""
