"""Real tools for the experiment tasks: files in a temporary directory, a grep, a calculator with memory.

A `Tool` is a name, an OpenAI function schema and a Python function. `ToolBox.call` validates the
arguments against the schema (a wrong call is the policy's fault: `InvalidToolCall`), runs the function and
returns a `ToolOutput`. A function that raises is a tool failure (`ToolOutput(status="error")`), kept apart
from invalid calls so the episode can end with the right typed outcome.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = [
    "ToolOutput",
    "Tool",
    "ToolBox",
    "InvalidToolCall",
    "ToolFault",
    "file_tools",
    "calculator_tools",
]


@dataclass(frozen=True)
class ToolOutput:
    """What one tool call returned."""

    content: str
    """Text given back to the policy."""
    status: str = "ok"
    """`ok`, `error` (the tool failed) or `timeout`."""
    duration_s: float = 0.0
    """Wall time of the call."""


class InvalidToolCall(Exception):
    """The policy called an unknown tool or passed arguments that do not match the schema."""


class ToolFault(Exception):
    """Raised by a tool to report a failure (also what fault injection raises)."""


@dataclass(frozen=True)
class Tool:
    """One callable tool with its OpenAI function schema."""

    name: str
    """Function name the policy calls."""
    description: str
    """One-line description shown to the policy."""
    parameters: Mapping[str, Any]
    """JSON-schema object of the arguments (`properties`, `required`)."""
    fn: Callable[..., str] = field(compare=False)
    """The implementation; returns the output text, raises on failure."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI `{"type": "function", "function": {...}}` schema."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }


_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float)}


def _check_args(tool: Tool, args: Any) -> dict[str, Any]:
    if not isinstance(args, dict):
        raise InvalidToolCall(f"{tool.name}: arguments must be a JSON object, got {type(args).__name__}")
    props = tool.parameters.get("properties", {})
    missing = [k for k in tool.parameters.get("required", ()) if k not in args]
    if missing:
        raise InvalidToolCall(f"{tool.name}: missing argument(s) {missing}")
    unknown = sorted(set(args) - set(props))
    if unknown:
        raise InvalidToolCall(f"{tool.name}: unknown argument(s) {unknown}; expected {sorted(props)}")
    for key, value in args.items():
        expected = _JSON_TYPES.get(props[key].get("type", ""), ())
        if expected and (not isinstance(value, expected) or isinstance(value, bool)):
            raise InvalidToolCall(f"{tool.name}: argument {key!r} must be {props[key]['type']}, got {value!r}")
    return args


class ToolBox:
    """The tools of one episode, with fault injection (`fault_at_call`, `fault`) for tests."""

    def __init__(self, tools: list[Tool], *, fault_at_call: int = -1, fault: str = "raise"):
        self.tools = {t.name: t for t in tools}
        self.fault_at_call = fault_at_call
        self.fault = fault
        self.n_calls = 0

    def schemas(self) -> tuple[dict[str, Any], ...]:
        """OpenAI schemas of every tool, in registration order."""
        return tuple(t.schema() for t in self.tools.values())

    def call(self, name: str, arguments: str) -> ToolOutput:
        """Run `name` with the JSON `arguments`; `InvalidToolCall` when the call itself is malformed."""
        tool = self.tools.get(name)
        if tool is None:
            raise InvalidToolCall(f"unknown tool {name!r}; available: {sorted(self.tools)}")
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise InvalidToolCall(f"{name}: arguments are not valid JSON ({exc.msg} at {exc.pos})") from exc
        args = _check_args(tool, args)
        index = self.n_calls
        self.n_calls += 1
        start = time.perf_counter()
        if index == self.fault_at_call:
            if self.fault == "timeout":
                return ToolOutput(f"{name}: timed out (injected fault)", "timeout", time.perf_counter() - start)
            if self.fault == "error":
                return ToolOutput(f"{name}: error (injected fault)", "error", time.perf_counter() - start)
        try:
            if index == self.fault_at_call:
                raise ToolFault(f"{name}: injected fault at call {index}")
            text = tool.fn(**args)
        except Exception as exc:  # a failing tool is an outcome, not a crash of the harness
            return ToolOutput(f"{name} failed: {type(exc).__name__}: {exc}", "error", time.perf_counter() - start)
        return ToolOutput(text, "ok", time.perf_counter() - start)


def _inside(root: Path, rel: str) -> Path:
    path = (root / rel).resolve()
    if path != root and root not in path.parents:
        raise ToolFault(f"path {rel!r} is outside the working directory")
    return path


def file_tools(root: Path, *, writable: bool = False) -> list[Tool]:
    """`read_file`, `list_dir`, `search` over `root`, plus `copy_file` and `replace_in_file` when writable."""
    root = root.resolve()

    def read_file(path: str) -> str:
        target = _inside(root, path)
        if not target.is_file():
            raise ToolFault(f"no such file: {path}")
        return f"FILE {path}\n" + target.read_text(encoding="utf-8")

    def list_dir(path: str = ".") -> str:
        target = _inside(root, path)
        if not target.is_dir():
            raise ToolFault(f"no such directory: {path}")
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir())
        return f"DIR {path}\n" + "\n".join(names)

    def search(query: str) -> str:
        hits = []
        for file in sorted(p for p in root.rglob("*") if p.is_file()):
            for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
                if query.lower() in line.lower():
                    hits.append(f"{file.relative_to(root).as_posix()}:{number}: {line}")
        return f"SEARCH {query!r}: {len(hits)} match(es)\n" + "\n".join(hits[:20])

    def copy_file(src: str, dst: str) -> str:
        source, dest = _inside(root, src), _inside(root, dst)
        if not source.is_file():
            raise ToolFault(f"no such file: {src}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(source.read_bytes())
        return f"COPIED {src} -> {dst}"

    def replace_in_file(path: str, old: str, new: str) -> str:
        target = _inside(root, path)
        if not target.is_file():
            raise ToolFault(f"no such file: {path}")
        text = target.read_text(encoding="utf-8")
        count = text.count(old)
        if count == 0:
            raise ToolFault(f"{old!r} not found in {path}")
        target.write_text(text.replace(old, new), encoding="utf-8")
        return f"REPLACED {count} occurrence(s) in {path}"

    path_arg = {"path": {"type": "string", "description": "path relative to the working directory"}}
    tools = [
        Tool("read_file", "Read a text file.", {"type": "object", "properties": path_arg, "required": ["path"]}, read_file),
        Tool("list_dir", "List a directory.", {"type": "object", "properties": path_arg, "required": []}, list_dir),
        Tool(
            "search",
            "Find lines containing a text in every file (case-insensitive).",
            {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
            search,
        ),
    ]
    if writable:
        tools += [
            Tool(
                "copy_file",
                "Copy a file.",
                {"type": "object", "properties": {"src": {"type": "string"}, "dst": {"type": "string"}}, "required": ["src", "dst"]},
                copy_file,
            ),
            Tool(
                "replace_in_file",
                "Replace every occurrence of a text in a file.",
                {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
                    "required": ["path", "old", "new"],
                },
                replace_in_file,
            ),
        ]
    return tools


def calculator_tools() -> list[Tool]:
    """`multiply(a, b, name)` storing the product under `name`, and `recall(name)` reading it back."""
    memory: dict[str, int] = {}

    def multiply(a: int, b: int, name: str) -> str:
        memory[name] = a * b
        return f"RESULT {name} = {a} * {b} = {a * b}"

    def recall(name: str) -> str:
        if name not in memory:
            raise ToolFault(f"nothing stored under {name!r}")
        return f"RESULT {name} = {memory[name]}"

    return [
        Tool(
            "multiply",
            "Multiply two integers and store the product under a name.",
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "name": {"type": "string"}},
                "required": ["a", "b", "name"],
            },
            multiply,
        ),
        Tool(
            "recall",
            "Read back a stored product by name.",
            {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
            recall,
        ),
    ]
