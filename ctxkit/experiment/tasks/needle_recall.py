"""needle-recall: an access code appears once in an early long log file and is asked for at the very end.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ctxkit.experiment.tasks.base import Score, TaskEpisode, check_common
from ctxkit.experiment.tasks.documents import make_chain, write_files
from ctxkit.experiment.tasks.tools import ToolBox, file_tools

SYSTEM = (
    "You are a log-review agent working in a directory through tools. Start by reading logs/00.log, then "
    "follow each file's `next:` line. The last file asks a question: answer it with the value only, and "
    "re-read a file if the value you need is no longer in front of you."
)
USER = "Please go through the logs and answer the question in the last file."
VAULT_POOL = 99
"""Vault numbers 1..99: every file but the last logs one, so `n_files` is at most `VAULT_POOL + 1`."""


def _code(rng: random.Random) -> str:
    alphabet = string.ascii_uppercase + string.digits
    return "".join(rng.choice(alphabet) for _ in range(4)) + "-" + "".join(rng.choice(alphabet) for _ in range(4))


@dataclass(frozen=True)
class NeedleRecall:
    """Logs linked by `next:`; file `needle_file` holds the code for the asked vault among distractor codes."""

    name: ClassVar[str] = "needle-recall"
    version: ClassVar[str] = "needle-recall-v1"
    n_files: int = 8
    """Files in the chain (the last one holds the question)."""
    lines_per_file: int = 14
    """Filler log lines per file."""
    needle_file: int = 1
    """Index of the file holding the asked code."""
    fault_at_call: int = -1
    """Index of the tool call that fails (-1: none)."""
    fault: str = "raise"
    """How the injected fault fails: `raise`, `error` or `timeout`."""

    def __post_init__(self) -> None:
        check_common(self)
        if not 3 <= self.n_files <= VAULT_POOL + 1:
            raise ValueError(f"n_files must be in [3, {VAULT_POOL + 1}] (each file but the last logs a distinct vault "
                             f"number, drawn from a pool of {VAULT_POOL}), got {self.n_files}")
        if not 0 <= self.needle_file < self.n_files - 1:
            raise ValueError(f"needle_file must be in [0, {self.n_files - 2}], got {self.needle_file}")
        if self.lines_per_file < 1:
            raise ValueError(f"lines_per_file must be >= 1, got {self.lines_per_file}")

    def episode(self, seed: int, workdir: Path) -> TaskEpisode:
        """Write the logs for `seed` under `workdir` and return the episode."""
        rng = random.Random(f"{self.version}:{seed}")
        vaults = rng.sample(range(1, VAULT_POOL + 1), self.n_files - 1)
        codes = [_code(rng) for _ in vaults]
        target = self.needle_file
        paths = [f"logs/{i:02d}.log" for i in range(self.n_files)]
        payloads = {i: [f"ACCESS CODE for vault-{v} is {c}"] for i, (v, c) in enumerate(zip(vaults, codes))}
        question = (
            f"QUESTION: What is the access code for vault-{vaults[target]}? "
            f"It was logged in {paths[target]}. Answer with the code only."
        )
        files = make_chain(rng, paths, self.lines_per_file, payloads, head_lines={self.n_files - 1: [question]})
        write_files(workdir, files)
        expected = codes[target]

        def score(answer: str) -> Score:
            ok = expected in answer
            return Score(1.0 if ok else 0.0, "scored", "answered", 1.0 if ok else 0.0, 0, {"expected": expected, "answer": answer})

        return TaskEpisode(
            messages=({"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}),
            toolbox=ToolBox(file_tools(workdir), fault_at_call=self.fault_at_call, fault=self.fault),
            scorer=score,
            workdir=workdir,
            facts={"expected": expected, "vault": vaults[target], "needle_file": paths[target]},
        )
