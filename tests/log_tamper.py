"""Tampering with a recorded log as a forger would: rewrite its events and re-chain every hash (`rechain`), or
change one character (`flip`), for the tests that must catch it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson


def rechain(path: Path, edit) -> None:
    """Rewrite a log through `edit(list_of_event_dicts) -> list_of_event_dicts`, renumbering seqs and
    recomputing every line hash, so the tampered file is a valid log (a forger's, not a crash's, edit)."""
    lines = path.read_bytes().splitlines()
    header, body = lines[0], [orjson.loads(x) for x in lines[1:]]
    for obj in body:
        obj.pop("prev"), obj.pop("hash")
    body = edit(body)
    prev = orjson.loads(header)["hash"]
    out = [header]
    for seq, obj in enumerate(body):
        obj["seq"] = seq
        digest = hashlib.sha256(prev.encode() + orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()
        out.append(orjson.dumps({**obj, "prev": prev, "hash": digest}))
        prev = digest
    path.write_bytes(b"\n".join(out) + b"\n")


def flip(text: str, at: int) -> str:
    """Change one ASCII character (one byte) of `text` at `at`."""
    c = text[at]
    return text[:at] + ("x" if c != "x" else "y") + text[at + 1:]
