"""`ctxkit bench render`: incremental rendering vs re-rendering with `apply_chat_template` every turn.

Builds a long agent episode turn by turn (assistant tool call, ~300-word tool output) and times, in
the same run: ctxkit's `IncrementalRenderer` (append + render with the generation prompt at every
turn), `apply_chat_template(tokenize=True)` on the whole history at every turn, and encoding only the
new text of each turn (a lower bound). Ids are compared at every turn.

Layer L4 (experiment): imports the library layers below it, never the CLI.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

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


@dataclass(frozen=True)
class RenderBenchResult:
    """Figures of one `bench render` run (seconds are medians over the repeats)."""

    tokenizer: str
    """Tokenizer id."""
    template: str
    """Template id."""
    turns: int
    """Turns in the episode (one render per turn)."""
    final_tokens: int
    """Tokens in the last context."""
    repeats: int
    """Repeats each measurement was taken."""
    ctxkit_s: float
    """ctxkit IncrementalRenderer: append + render at every turn, total."""
    apply_chat_template_s: float
    """transformers apply_chat_template(tokenize=True) of the whole history at every turn, total."""
    encode_new_text_s: float
    """Encoding only each turn's new text (lower bound), total."""
    speedup_vs_apply: float
    """apply_chat_template_s / ctxkit_s."""
    overhead_vs_encode: float
    """ctxkit_s / encode_new_text_s."""
    ids_identical: bool
    """ctxkit's ids equal apply_chat_template's at every turn."""

    def to_dict(self) -> dict[str, Any]:
        """Plain dict."""
        return asdict(self)


def run(tokenizer_spec: str, turns: int = 200, repeats: int = 3, template: str | None = None, seed: int = 0,
        progress=None) -> RenderBenchResult:
    """Run the benchmark (see module docstring)."""
    from ctxkit.rendering import IncrementalRenderer
    from ctxkit.templates import load_template
    from ctxkit.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer_spec)
    tpl = load_template(template, tok)
    if tok.hf is None:
        from ctxkit.errors import ConfigError

        raise ConfigError(f"bench render compares against transformers; --tokenizer must be a Hugging Face tokenizer, got {tok.id}")
    head, steps, tools = build_episode(turns, seed)
    hf = tok.hf
    chat_template = tpl.source

    def ctxkit_pass(record: list | None):
        r = IncrementalRenderer(tok, tpl, tools)
        r.extend(head)
        t0 = time.perf_counter()
        for step in steps:
            r.extend(step)
            ctx = r.render(add_generation_prompt=True)
            if record is not None:
                record.append(ctx.token_ids)
        return time.perf_counter() - t0

    def apply_pass(record: list | None):
        msgs = list(head)
        t0 = time.perf_counter()
        for step in steps:
            msgs.extend(step)
            ids = hf.apply_chat_template(msgs, tools=tools, chat_template=chat_template, tokenize=True,
                                         add_generation_prompt=True, return_dict=False)
            if record is not None:
                record.append(tuple(ids))
        return time.perf_counter() - t0

    # new text per turn, computed outside the timing
    texts = []
    msgs = list(head)
    for step in steps:
        msgs.extend(step)
        texts.append(tpl.render_text(msgs, tools=tools, add_generation_prompt=True))
    deltas = [texts[0]] + [b[len(a):] if b.startswith(a) else b for a, b in zip(texts, texts[1:])]

    def encode_pass(record=None):
        backend = hf.backend_tokenizer
        t0 = time.perf_counter()
        for d in deltas:
            backend.encode(d, add_special_tokens=False)
        return time.perf_counter() - t0

    ours: list = []
    theirs: list = []
    times = {"ctxkit": [], "apply": [], "encode": []}
    for rep in range(repeats):
        times["ctxkit"].append(ctxkit_pass(ours if rep == 0 else None))
        if progress:
            progress(f"repeat {rep + 1}/{repeats}: ctxkit {times['ctxkit'][-1]:.2f}s")
        times["apply"].append(apply_pass(theirs if rep == 0 else None))
        if progress:
            progress(f"repeat {rep + 1}/{repeats}: apply_chat_template {times['apply'][-1]:.2f}s")
        times["encode"].append(encode_pass())
    identical = len(ours) == len(theirs) == turns and all(a == b for a, b in zip(ours, theirs))
    med = {k: statistics.median(v) for k, v in times.items()}
    return RenderBenchResult(
        tokenizer=tok.id,
        template=tpl.id,
        turns=turns,
        final_tokens=len(ours[-1]) if ours else 0,
        repeats=repeats,
        ctxkit_s=med["ctxkit"],
        apply_chat_template_s=med["apply"],
        encode_new_text_s=med["encode"],
        speedup_vs_apply=med["apply"] / med["ctxkit"] if med["ctxkit"] else float("inf"),
        overhead_vs_encode=med["ctxkit"] / med["encode"] if med["encode"] else float("inf"),
        ids_identical=identical,
    )
