"""Seeded generator of valid conversations per template family (used by the render tests).

Each family respects its template's constraints: Mistral v0.3 alternates user/assistant (tool-call turns
and tool results excepted) with 9-character alphanumeric tool-call ids; SmolLM2 has no tool support;
Qwen-style and ChatML templates take everything (several calls per turn, several results in a row,
reasoning). Contents mix empty strings, unicode, long text, leading/trailing whitespace and JSON.
"""

from __future__ import annotations

import json
import random
import string

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file and return its contents.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "File path."}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command; returns stdout.",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["cmd"],
            },
        },
    },
]

_WORDS = (
    "the agent reads files runs tests and fixes bugs carefully before answering with a short summary of "
    "what changed why it matters and which tests now pass"
).split()

_SPECIAL_TEXT = [
    "héllo wörld — naïve café",
    "你好，世界！这是一个测试。",
    "emoji 🎉🚀 and ∑ math ≤ ≥",
    "  leading and trailing spaces  ",
    "\n\nstarts with newlines\nand ends with one\n",
    "tabs\tinside\tthe\ttext",
    '{"json": [1, 2, 3], "nested": {"k": "v"}}',
    "def f(x):\n    return x * 2  # code\n",
    "",
    "Ünïcödé ŞţŗĭŉĝŠ ﬁ ligature",
    "a",
]


def _text(rng: random.Random, long_ok: bool = True) -> str:
    r = rng.random()
    if r < 0.3:
        return rng.choice(_SPECIAL_TEXT)
    if long_ok and r < 0.4:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(200, 500)))
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 25))).capitalize() + rng.choice([".", "?", "!", ""])


def _call_id(rng: random.Random, nine: bool) -> str:
    if nine:
        return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(9))
    return "call_" + "".join(rng.choice(string.hexdigits.lower()) for _ in range(rng.randint(4, 12)))


def _args(rng: random.Random, name: str, as_string: bool):
    if name == "read_file":
        obj = {"path": rng.choice(["src/main.py", "README.md", "données/été.csv", "a b/c.txt"])}
    else:
        obj = {"cmd": rng.choice(["pytest -q", "ls -la", "grep -rn 'TODO' .", 'echo "hi"']), "timeout": rng.randint(1, 60)}
    return json.dumps(obj) if as_string else obj


def _tool_turn(rng: random.Random, nine_ids: bool, string_args: bool, reasoning: bool) -> list[dict]:
    n = rng.choice([1, 1, 2, 3])
    calls = []
    for _ in range(n):
        name = rng.choice(["read_file", "run_shell"])
        calls.append(
            {"id": _call_id(rng, nine_ids), "type": "function",
             "function": {"name": name, "arguments": _args(rng, name, string_args and rng.random() < 0.5)}}
        )
    content = rng.choice(["", "", "Let me check.", _text(rng, long_ok=False)])
    msg = {"role": "assistant", "content": content, "tool_calls": calls}
    if reasoning and rng.random() < 0.5:
        msg["reasoning_content"] = _text(rng, long_ok=False) or "thinking"
    out = [msg]
    for c in calls:
        out.append({"role": "tool", "tool_call_id": c["id"], "content": _text(rng)})
    return out


def conversation(rng: random.Random, family: str) -> tuple[list[dict], list[dict] | None]:
    """One valid conversation for `family` in {"qwen", "qwen3", "mistral", "smollm", "chatml"},
    ending with a user or tool message (so it can take a generation prompt) or an assistant turn."""
    tools_ok = family != "smollm"
    tools = TOOLS if tools_ok and rng.random() < 0.6 else None
    reasoning = family in ("qwen3", "chatml")
    msgs: list[dict] = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": _text(rng, long_ok=False) if family != "mistral" else
                     (_text(rng, long_ok=False) or "Be brief.")})
    for turn in range(rng.randint(1, 4)):
        user = _text(rng)
        if family == "chatml" and rng.random() < 0.2:
            user = [{"type": "text", "text": user}, {"type": "text", "text": " (second part)"}]
        msgs.append({"role": "user", "content": user})
        if tools and rng.random() < 0.6:
            for _ in range(rng.randint(1, 2)):
                msgs += _tool_turn(rng, family == "mistral", family != "mistral", reasoning)
        final = {"role": "assistant", "content": _text(rng)}
        if family == "mistral" and not final["content"].strip():
            final["content"] = "Done."
        if reasoning and rng.random() < 0.5:
            final["reasoning_content"] = _text(rng, long_ok=False) or "ok"
        msgs.append(final)
    end = rng.random()
    if end < 0.4:
        msgs.append({"role": "user", "content": _text(rng)})
    elif end < 0.6 and tools and family != "mistral":
        msgs += _tool_turn(rng, False, True, reasoning)
    return msgs, tools


def role_batch(role: str, i: int, content: str | None = None) -> list[dict]:
    """The messages a role sequence's `i`-th entry adds: one message of `role` (text `content`, default
    `"<role> <i>"`), or for `tool` an assistant call and its result, a result answering a call made before it."""
    if role != "tool":
        return [{"role": role, "content": f"{role} {i}" if content is None else content}]
    call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [{"role": "assistant", "content": f"call {i}", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"tool {i}"}]
