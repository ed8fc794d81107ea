"""Small conversations of every shape an agent produces, for the template-family conformance suite.

`family_conversations(spec)` gives named, deterministic conversations: a plain chat with a system prompt,
one without, tool turns (several calls per turn, a tool error, reasoning beside the calls), two assistant
turns in a row, and a reasoning chat; each is rendered with and without the generation prompt. A family
whose template renders no tools (`FamilySpec.tools` False) gets the shapes without tools; one without a
system role gets none with a system message. Contents stay short so a family checks in well under a second.
"""

from __future__ import annotations

from ctxkit.benchmarks.template_families import FamilySpec

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "File path."}},
                       "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "run_shell", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}},
]
"""The tool schemas of the tool conversations."""


def _call(i: int, name: str, args: dict) -> dict:
    return {"id": f"call{i:05d}", "type": "function", "function": {"name": name, "arguments": args}}


def _result(i: int, name: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": f"call{i:05d}", "name": name, "content": content}


def family_conversations(spec: FamilySpec) -> dict[str, tuple[list[dict], list[dict] | None]]:
    """Conversation name -> `(messages, tools or None)` for a family (see the module docstring)."""
    system = [{"role": "system", "content": "You are a careful agent."}] if spec.system else []
    out: dict[str, tuple[list[dict], list[dict] | None]] = {
        "chat": (system + [
            {"role": "user", "content": "Hello, what is 2 + 2?"},
            {"role": "assistant", "content": "It is 4."},
            {"role": "user", "content": "And naïve 3 × 3? 你好"},
            {"role": "assistant", "content": "9 🎉"},
        ], None),
        "no-system": ([
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke."},
        ], None),
        "reasoning": (system + [
            {"role": "user", "content": "Is 17 prime?"},
            {"role": "assistant", "content": "Yes.", "reasoning_content": "17 has no divisor but 1 and 17."},
            {"role": "user", "content": "And 21?"},
            {"role": "assistant", "content": "No, 21 = 3 × 7.", "reasoning_content": "3 divides 21."},
        ], None),
    }
    if spec.tools:
        out["tools"] = (system + [
            {"role": "user", "content": "Summarize a.txt and b.txt."},
            {"role": "assistant", "content": "", "reasoning_content": "I should read both files.",
             "tool_calls": [_call(1, "read_file", {"path": "a.txt"}), _call(2, "read_file", {"path": "b.txt"})]},
            _result(1, "read_file", "alpha"),
            _result(2, "read_file", "Error: b.txt: no such file"),
            {"role": "assistant", "content": "a.txt says alpha; b.txt is missing.", "reasoning_content": "One failed."},
            {"role": "user", "content": "Run the tests."},
        ], TOOLS)
        out["tool-chain"] = (system + [
            {"role": "user", "content": "Fix the build."},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [_call(3, "run_shell", {"cmd": "make"})]},
            _result(3, "run_shell", "error: missing ;"),
            {"role": "assistant", "content": "", "reasoning_content": "Read the file.",
             "tool_calls": [_call(4, "read_file", {"path": "main.c"})]},
            _result(4, "read_file", "int main() { return 0 }"),
        ], TOOLS)
    return out


__all__ = ["TOOLS", "family_conversations"]
