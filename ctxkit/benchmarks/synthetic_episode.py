"""The synthetic benchmark episode: a coding agent's tool calls with ~300-word outputs.

`build_episode(turns, seed)` is deterministic for a seed; `bench render` and `bench build` replay it when no
`--episode` is given (about 70k Qwen2.5 tokens at 200 turns).
"""

from __future__ import annotations

import random

_WORDS = (
    "build test error warning file module function class return value passed failed assert config path "
    "directory import package version cache token context budget summary result output input stream "
    "request response latency memory thread process signal handler timeout retry backoff queue worker"
).split()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command in the repository and return its output.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
]


def build_episode(turns: int = 200, seed: int = 0) -> tuple[list[dict], list[list[dict]], list[dict]]:
    """`(head, steps, tools)`: the opening messages, then per turn the messages it appends (an assistant
    turn with a tool call and its ~300-word tool result)."""
    rng = random.Random(seed)
    head = [
        {"role": "system", "content": "You are a coding agent. Use the tools to investigate, then answer."},
        {"role": "user", "content": "The test suite fails intermittently. Find the cause and fix it. "
         "Do not modify the original config file."},
    ]
    steps = []
    for t in range(turns):
        name = rng.choice(["run_shell", "read_file"])
        args = {"cmd": f"pytest -q tests/test_{t % 17}.py -k case{t}"} if name == "run_shell" else {"path": f"src/mod_{t % 23}.py"}
        call_id = f"call{t:05d}"
        thought = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 20))).capitalize() + "."
        output = "\n".join(
            " ".join(rng.choice(_WORDS) for _ in range(rng.randint(10, 16))) for _ in range(rng.randint(20, 23))
        )
        steps.append(
            [
                {"role": "assistant", "content": thought,
                 "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]},
                {"role": "tool", "tool_call_id": call_id, "content": output},
            ]
        )
    return head, steps, TOOLS
