"""multi-hop: three facts scattered over a chain of long files must be combined (person -> department ->
manager -> city).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ctxkit.experiment.tasks.base import Score, TaskEpisode, check_common
from ctxkit.experiment.tasks.documents import make_chain, write_files
from ctxkit.experiment.tasks.tools import ToolBox, file_tools

SYSTEM = (
    "You are a research agent working in a directory through tools. Start by reading records/00.txt, then "
    "follow each file's `next:` line. The last file asks a question that needs facts from several files: "
    "answer with the name only, and use `search` to find a fact that is no longer in front of you."
)
USER = "Please read the records and answer the question in the last file."

_PEOPLE = ("Alice", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kaito", "Lena")
_DEPTS = ("Orion", "Lyra", "Vega", "Draco", "Cygnus", "Perseus", "Auriga", "Carina")
_MANAGERS = ("Moreau", "Novak", "Okafor", "Petrov", "Quinn", "Rossi", "Sato", "Tanaka")
_CITIES = ("Lisbon", "Oslo", "Quito", "Nairobi", "Hanoi", "Tallinn", "Lima", "Porto")


@dataclass(frozen=True)
class MultiHop:
    """Chain of records; the asked person's department, its manager, and the manager's city sit in different files."""

    name: ClassVar[str] = "multi-hop"
    version: ClassVar[str] = "multi-hop-v1"
    n_files: int = 8
    """Files in the chain (the last one holds the question)."""
    lines_per_file: int = 14
    """Filler lines per file."""
    n_distractors: int = 3
    """Other person -> department -> manager -> city chains mixed in."""
    fault_at_call: int = -1
    """Index of the tool call that fails (-1: none)."""
    fault: str = "raise"
    """How the injected fault fails: `raise`, `error` or `timeout`."""

    def __post_init__(self) -> None:
        check_common(self)
        if self.n_files < 4:
            raise ValueError(f"n_files must be >= 4 (three facts and a question), got {self.n_files}")
        if not 0 <= self.n_distractors <= 5:
            raise ValueError(f"n_distractors must be in [0, 5], got {self.n_distractors}")

    def episode(self, seed: int, workdir: Path) -> TaskEpisode:
        """Write the records for `seed` under `workdir` and return the episode."""
        rng = random.Random(f"{self.version}:{seed}")
        k = self.n_distractors + 1
        people = rng.sample(_PEOPLE, k)
        depts, managers, cities = rng.sample(_DEPTS, k), rng.sample(_MANAGERS, k), rng.sample(_CITIES, k)
        payloads: dict[int, list[str]] = {}
        last = self.n_files - 1
        for i in range(k):
            facts = [
                f"FACT: {people[i]} works in the {depts[i]} department.",
                f"FACT: The {depts[i]} department is managed by {managers[i]}.",
                f"FACT: {managers[i]} is based in {cities[i]}.",
            ]
            where = sorted(rng.sample(range(last), 3))  # the asked chain: increasing files, hop by hop
            for fact, at in zip(facts, where if i == 0 else rng.sample(range(last), 3)):
                payloads.setdefault(at, []).append(fact)
        paths = [f"records/{i:02d}.txt" for i in range(self.n_files)]
        question = f"QUESTION: In which city is the manager of {people[0]}'s department based? Answer with the city only."
        write_files(workdir, make_chain(rng, paths, self.lines_per_file, payloads, head_lines={last: [question]}))
        expected = cities[0]

        def score(answer: str) -> Score:
            ok = expected.lower() in answer.lower() and not any(c.lower() in answer.lower() for c in cities[1:])
            return Score(1.0 if ok else 0.0, "scored", "answered", 1.0 if ok else 0.0, 0, {"expected": expected, "answer": answer})

        return TaskEpisode(
            messages=({"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}),
            toolbox=ToolBox(file_tools(workdir), fault_at_call=self.fault_at_call, fault=self.fault),
            scorer=score,
            workdir=workdir,
            facts={"expected": expected, "person": people[0], "department": depts[0], "manager": managers[0]},
        )
