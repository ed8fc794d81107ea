"""Measure the constraint detectors on the labelled set: precision, recall, F1 of each registered rule set.

    python scripts/constraint_eval.py                 # figures for every detector, all / dev / held-out / per source
    python scripts/constraint_eval.py extract > x.jsonl   # the reference sentences, unlabelled (to label by hand)

The labelled set is `tests/data/constraints_labelled.jsonl` (its README, `tests/data/constraints_README.md`,
holds the labelling guideline). One record per sentence:
`{source, episode, message, role, split, sentence, label}`; `label` is true for a constraint.

Where the sentences come from (`extract`): the system and user turns of the files in `../shared/trajectories/`
and the opening messages of the project's own tasks, read by the small readers below (not the importers):
- tau-bench (`tau-bench__gpt-4o-airline.json`): the system prompt once (it is the same policy in every
  episode) and the user turns of 29 episodes (every 7th index: 0, 7, ..., 196);
- SWE-agent `.traj`: the system message and the instance message of `history` (the older file's
  demonstration turn, a whole recorded trajectory pasted as a user turn, and its observations, which
  that format files as `user`, are left out: they are tool output);
- ADP samples: each episode's system message and first user message (an identical message seen in an
  earlier episode of the same file is kept once);
- tasks: `TaskEpisode.messages` of every registered task at seed 0.
Sentences come from a reference split (`reference_split` below, independent of the detectors) that was
then reviewed by hand; fenced code blocks are left out of the reference (a detection inside one counts as
a false positive), and lines without a letter are skipped.

Matching (how a detection is scored): the detector runs on the full text of each message; a detection
matches a labelled sentence of the same message when their word overlap (lower-cased words, `\\w+`) is at
least half of the larger of the two word sets; each detection takes its best match (among equal
scores, a sentence not matched yet, so a sentence repeated in one message is matched once per detection). Precision = matched
detections whose sentence is labelled constraint / all detections (a detection matching nothing is a false
positive); recall = constraint sentences matched by at least one detection / all constraint sentences.

Held-out split: the SWE-smith file and the tau-bench episodes with index >= 100 were labelled like the rest
but not used to write or adjust `constraint-rules-v2` (its errors there were read after measuring, and
left as they are); their figures are reported separately (`split` = `heldout`).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("CTXKIT_SHARED", ROOT.parent / "shared")) / "trajectories"
LABELLED = ROOT / "tests" / "data" / "constraints_labelled.jsonl"
HELDOUT_SOURCES = {"adp-swe-smith"}
TAU_HELDOUT_FROM = 100


# ------------------------------------------------------------------------------------- readers

def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def read_messages(shared: Path = SHARED) -> Iterator[tuple[str, str, int, str, str, str]]:
    """(source, episode, message index, role, split, text) of every system/user turn in the set."""
    tau = json.loads((shared / "tau-bench__gpt-4o-airline.json").read_text())
    for i in range(0, len(tau), 7):
        split = "heldout" if i >= TAU_HELDOUT_FROM else "dev"
        for j, m in enumerate(tau[i]["traj"]):
            if m["role"] == "system" and i == 0:
                yield "tau-bench", "0", j, "system", "dev", _text(m["content"])
            elif m["role"] == "user":
                yield "tau-bench", str(i), j, "user", split, _text(m["content"])
    for name, source in (("sweagent__marshmallow-1867__function_calling_replace_from_source.traj", "swe-agent-fc"),
                         ("sweagent__pydicom-1458.traj", "swe-agent")):
        hist = json.loads((shared / name).read_text())["history"]
        for j, m in enumerate(hist):
            if m["role"] == "assistant":
                break
            text = _text(m["content"])
            if m["role"] in ("system", "user") and "--- DEMONSTRATION ---" not in text:
                yield source, name.split("__")[1].split(".")[0], j, m["role"], "dev", text
    for name, source in (("adp__swe-gym_openhands_sampled_trajectories__sample_raw.json", "adp-swe-gym"),
                         ("adp__swe-smith__sample_raw.json", "adp-swe-smith")):
        seen: set[str] = set()
        for k, ep in enumerate(json.loads((shared / name).read_text())):
            users = 0
            for j, m in enumerate(ep["messages"]):
                if m["role"] not in ("system", "user"):
                    continue
                if m["role"] == "user":
                    users += 1
                    if users > 1:
                        break
                text = _text(m["content"])
                if text in seen:
                    continue
                seen.add(text)
                yield source, str(ep.get("instance_id") or k), j, m["role"], ("heldout" if source in HELDOUT_SOURCES else "dev"), text
    sys.path.insert(0, str(ROOT))
    import tempfile

    from ctxkit.experiment.tasks.base import TASKS, make_task

    for name in TASKS:
        with tempfile.TemporaryDirectory() as d:
            ep = make_task(name).episode(0, Path(d))
        for j, m in enumerate(ep.messages):
            yield "tasks", name, j, m["role"], "dev", _text(m["content"])


# ------------------------------------------------------------------------------------- reference split

_FENCE = re.compile(r"^\s*```.*?^\s*```[^\n]*$", re.MULTILINE | re.DOTALL)
_ABBR = re.compile(r"\b(?:e\.g|i\.e|etc|vs|Mr|Mrs|Ms|Dr|St|U\.S|a\.m|p\.m|No|approx|cf)\.$", re.IGNORECASE)
_ITEM = re.compile(r"^\s*(?:[-*+•]\s+|\d+[.)]\s+|\(\d+\)\s+)")


def reference_split(text: str) -> list[str]:
    """The reference sentences of a message (reviewed by hand; independent of the detectors)."""
    text = _FENCE.sub("\n", text)
    out: list[str] = []
    for line in text.split("\n"):
        line = _ITEM.sub("", line).strip()
        if not re.search(r"[A-Za-z]", line):
            continue
        start = 0
        for m in re.finditer(r"[.!?]+[\"')\]]*(?=\s+[\"'(\[]?[A-Z0-9])", line):
            piece = line[start:m.end()]
            if _ABBR.search(line[:m.end()]) or re.search(r"\b[A-Z]\.$", line[:m.end()]):
                continue
            out.append(piece.strip())
            start = m.end()
        if line[start:].strip():
            out.append(line[start:].strip())
    return [s for s in out if re.search(r"[A-Za-z]", s)]


def extract() -> list[dict[str, Any]]:
    """Unlabelled reference records of the whole set."""
    rows = []
    for source, episode, j, role, split, text in read_messages():
        for s in reference_split(text):
            rows.append({"source": source, "episode": episode, "message": j, "role": role, "split": split,
                         "sentence": s, "label": None})
    return rows


# ------------------------------------------------------------------------------------- evaluation

def _words(s: str) -> set[str]:
    return set(re.findall(r"\w+", s.lower()))


def load_labelled(path: Path = LABELLED) -> list[dict[str, Any]]:
    """The labelled records."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def evaluate(detector_name: str, records: list[dict[str, Any]] | None = None, shared: Path = SHARED) -> dict[str, dict[str, float]]:
    """{group: {tp, fp, fn, precision, recall, f1, detections, constraints}} for one registered detector.

    Groups: `all`, `dev`, `heldout`, and `source:<name>` for each source."""
    sys.path.insert(0, str(ROOT))
    from ctxkit.context.pins import get_detector

    det = get_detector(detector_name)
    records = load_labelled() if records is None else records
    by_msg: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        by_msg.setdefault((r["source"], r["episode"], r["message"]), []).append(r)
    texts = {(s, e, j): t for s, e, j, _role, _split, t in read_messages(shared)}
    counts: dict[str, dict[str, int]] = {}

    def add(r: dict[str, Any], key: str) -> None:
        for g in ("all", r["split"], "source:" + r["source"]):
            counts.setdefault(g, {"tp": 0, "fp": 0, "fn": 0, "detections": 0, "constraints": 0})[key] += 1

    for key, sents in by_msg.items():
        found = [text for text, _kind in det.find(texts[key])]
        hit: set[int] = set()
        for d in found:
            dw = _words(d)
            best, best_score = None, 0.0
            for i, r in enumerate(sents):
                rw = _words(r["sentence"])
                score = len(dw & rw) / max(len(dw), len(rw), 1)
                if score > best_score or (score == best_score and best in hit and i not in hit):
                    best, best_score = i, score
            rec = sents[0] if best is None or best_score < 0.5 else sents[best]
            add(rec, "detections")
            if best is not None and best_score >= 0.5 and sents[best]["label"]:
                add(rec, "tp")
                hit.add(best)
            else:
                add(rec, "fp")
        for i, r in enumerate(sents):
            if r["label"]:
                add(r, "constraints")
                if i not in hit:
                    add(r, "fn")
    out = {}
    for g, c in counts.items():
        tp_sent = c["constraints"] - c["fn"]
        p = c["tp"] / c["detections"] if c["detections"] else 1.0
        rcl = tp_sent / c["constraints"] if c["constraints"] else 1.0
        f1 = 2 * p * rcl / (p + rcl) if p + rcl else 0.0
        out[g] = {**c, "precision": round(p, 3), "recall": round(rcl, 3), "f1": round(f1, 3)}
    return out


def main(argv: list[str]) -> int:
    """Print the figures (or, with `extract`, the unlabelled reference records)."""
    if argv[:1] == ["extract"]:
        for row in extract():
            print(json.dumps(row, ensure_ascii=False))
        return 0
    sys.path.insert(0, str(ROOT))
    from ctxkit.context.pins import DETECTORS

    records = load_labelled()
    n = len(records)
    print(f"labelled set: {n} sentences, {sum(r['label'] for r in records)} constraints "
          f"({sum(r['split'] == 'heldout' for r in records)} held out)")
    for name in DETECTORS:
        res = evaluate(name, records)
        print(f"\n{name}")
        print(f"  {'group':<24} {'sent.':>6} {'constr.':>7} {'detect.':>7} {'prec.':>6} {'recall':>6} {'F1':>6}")
        order = ["all", "dev", "heldout"] + sorted(g for g in res if g.startswith("source:"))
        sizes: dict[str, int] = {}
        for r in records:
            for g in ("all", r["split"], "source:" + r["source"]):
                sizes[g] = sizes.get(g, 0) + 1
        for g in order:
            if g in res:
                c = res[g]
                print(f"  {g:<24} {sizes[g]:>6} {c['constraints']:>7} {c['detections']:>7} "
                      f"{c['precision']:>6.3f} {c['recall']:>6.3f} {c['f1']:>6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
