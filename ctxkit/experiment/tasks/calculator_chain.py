"""calculator-chain: a worksheet of multiplications done through a calculator tool; later steps reuse
results from several steps earlier, and the last file asks for the final result.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ctxkit.experiment.tasks.base import Score, TaskEpisode, check_common
from ctxkit.experiment.tasks.documents import make_chain, write_files
from ctxkit.experiment.tasks.tools import ToolBox, calculator_tools, file_tools

SYSTEM = (
    "You are a careful calculator agent working in a directory through tools. The worksheet is sheet/01.txt, "
    "sheet/02.txt, ... in order; each file defines one step `rK = X * Y`. Do every multiplication with the "
    "`multiply` tool (store the product under the step's name), then read the next file. Operands named rJ "
    "are earlier results: use `recall` if one is no longer in front of you. The last file asks a question; "
    "answer with the number only."
)
USER = "Please work through the worksheet starting at sheet/01.txt."


def plan_steps(rng: random.Random, n_steps: int, lag: int) -> list[tuple[str, str]]:
    """Operands of steps r1..rN: literals, or references to a result at least `lag` steps back."""
    steps = []
    for k in range(1, n_steps + 1):
        if k == n_steps and k > lag:
            a, b = f"r{k - lag}", f"r{rng.randrange(1, k - lag + 1)}"
        elif k > lag and k % 2 == 0:
            a, b = f"r{rng.randrange(1, k - lag + 1)}", str(rng.randrange(2, 20))
        else:
            a, b = str(rng.randrange(11, 100)), str(rng.randrange(11, 100))
        steps.append((a, b))
    return steps


def evaluate(steps: list[tuple[str, str]]) -> list[int]:
    """Values of r1..rN."""
    values: list[int] = []
    for a, b in steps:
        x = values[int(a[1:]) - 1] if a.startswith("r") else int(a)
        y = values[int(b[1:]) - 1] if b.startswith("r") else int(b)
        values.append(x * y)
    return values


@dataclass(frozen=True)
class CalculatorChain:
    """Worksheet files sheet/01..N plus a question file; products go through the real calculator tool."""

    name: ClassVar[str] = "calculator-chain"
    version: ClassVar[str] = "calculator-chain-v1"
    n_steps: int = 6
    """Multiplication steps."""
    lag: int = 3
    """Minimum distance (in steps) between a result and its later use."""
    lines_per_file: int = 10
    """Filler lines per worksheet file (verbose tool output)."""
    fault_at_call: int = -1
    """Index of the tool call that fails (-1: none)."""
    fault: str = "raise"
    """How the injected fault fails: `raise`, `error` or `timeout`."""

    def __post_init__(self) -> None:
        check_common(self)
        if self.n_steps < 2:
            raise ValueError(f"n_steps must be >= 2, got {self.n_steps}")
        if not 1 <= self.lag < self.n_steps:
            raise ValueError(f"lag must be in [1, {self.n_steps - 1}], got {self.lag}")

    def episode(self, seed: int, workdir: Path) -> TaskEpisode:
        """Write the worksheet for `seed` under `workdir` and return the episode."""
        rng = random.Random(f"{self.version}:{seed}")
        steps = plan_steps(rng, self.n_steps, self.lag)
        values = evaluate(steps)
        n = self.n_steps
        paths = [f"sheet/{k:02d}.txt" for k in range(1, n + 2)]
        heads = {k - 1: [f"STEP {k} of {n}: r{k} = {a} * {b}"] for k, (a, b) in enumerate(steps, 1)}
        heads[n] = [f"QUESTION: Answer with the value of r{n}."]
        write_files(workdir, make_chain(rng, paths, self.lines_per_file, head_lines=heads))
        expected = str(values[-1])

        def score(answer: str) -> Score:
            digits = "".join(ch for ch in answer if ch.isdigit() or ch == "-")
            ok = digits == expected
            return Score(1.0 if ok else 0.0, "scored", "answered", 1.0 if ok else 0.0, 0, {"expected": expected, "answer": answer})

        return TaskEpisode(
            messages=({"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}),
            toolbox=ToolBox(
                [t for t in file_tools(workdir) if t.name == "read_file"] + calculator_tools(),
                fault_at_call=self.fault_at_call,
                fault=self.fault,
            ),
            scorer=score,
            workdir=workdir,
            facts={"expected": expected, "steps": [f"r{k} = {a} * {b}" for k, (a, b) in enumerate(steps, 1)]},
        )
