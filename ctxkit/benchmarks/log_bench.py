"""`ctxkit bench log`: `EventLog` append rates against bare loops, side by side in one run (Layer L4).

Arms, each on its own fresh log in one folder, over the same ~450-byte events (a `ToolResult` whose line,
with its `prev` and `hash`, is about 450 bytes):
- `append none`, `append batch`, `append always`: `EventLog.append` one event at a time (then `close`).
- `extend batch`: `EventLog.extend` in batches of 1000 (one fsync each).
- `bare chained`: orjson (sorted keys) + sha256 chained over the previous hash, written through a buffered
  file: the floor a hash-chained JSONL log can reach in Python.
- `bare write+fsync`: `os.write` + `os.fsync` per pre-encoded line: the floor of `always`.
`always` and `bare write+fsync` run `fsync_events` events (fsync is slow; both get the same count). Rates
are events per second; ratios are `append none` and `append batch` over `bare chained`, and the time per
event of `append always` over `bare write+fsync`. Speed is measured here, never in tests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import orjson

from ctxkit.events import ToolResult
from ctxkit.log import EventLog

__all__ = ["LogBenchArm", "LogBenchResult", "bench_events", "run"]

CONTENT_CHARS = 150
"""Characters of tool output per event: with the ids, hashes and fields the log line is ~450 bytes."""


@dataclass(frozen=True)
class LogBenchArm:
    """One measured loop."""

    name: str
    """What was timed (`append none`, `bare chained`, ...)."""
    events: int
    """Events written."""
    seconds: float
    """Wall time of the loop, closing the log included."""
    bytes_per_event: float
    """Mean size of a written event line (a log's header left out)."""

    @property
    def rate(self) -> float:
        """Events per second."""
        return self.events / self.seconds if self.seconds > 0 else float("inf")


@dataclass(frozen=True)
class LogBenchResult:
    """Every arm of one run, with the ratios the targets are stated in."""

    arms: tuple[LogBenchArm, ...]
    """In the order run."""
    folder: str
    """Where the logs were written (the file system decides what fsync costs)."""

    def arm(self, name: str) -> LogBenchArm:
        """The arm called `name`."""
        return next(a for a in self.arms if a.name == name)

    @property
    def ratios(self) -> dict[str, float]:
        """`append none` and `append batch` rates over `bare chained`; `append always` time per event over
        `bare write+fsync` (lower is better; the target is <= 1.5)."""
        bare = self.arm("bare chained").rate
        per = lambda a: a.seconds / a.events  # noqa: E731
        return {"none / bare chained": self.arm("append none").rate / bare,
                "batch / bare chained": self.arm("append batch").rate / bare,
                "extend / bare chained": self.arm("extend batch").rate / bare,
                "always time / bare write+fsync time": per(self.arm("append always")) / per(self.arm("bare write+fsync"))}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (`--json`)."""
        return {"folder": self.folder,
                "arms": [{**dataclasses.asdict(a), "rate": a.rate} for a in self.arms],
                "ratios": self.ratios}


def bench_events(n: int) -> list[ToolResult]:
    """`n` distinct ~450-byte-line events (deterministic)."""
    filler = "".join(f"{i:x}" for i in range(CONTENT_CHARS))[:CONTENT_CHARS - 12]
    return [ToolResult(tool_call_id=f"call_{i:06d}", name="shell", content=f"{filler} row {i:07d}", duration_s=0.25)
            for i in range(n)]


def _timed(name: str, n: int, path: Path, loop: Callable[[], None]) -> LogBenchArm:
    before = path.stat().st_size if path.exists() else 0  # a log's header is not an event
    start = time.perf_counter()
    loop()
    seconds = time.perf_counter() - start
    size = path.stat().st_size - before
    return LogBenchArm(name=name, events=n, seconds=seconds, bytes_per_event=size / n if n else 0.0)


def run(n_events: int = 20000, *, fsync_events: int | None = None, folder: str | None = None,
        progress: Callable[[str], None] | None = None) -> LogBenchResult:
    """Run every arm once on `n_events` events (`fsync_events`, default min(n_events, 2000), for the two
    fsync-per-event arms) in a fresh temporary folder under `folder` (default: the system's), removed after."""
    n_sync = fsync_events if fsync_events is not None else min(n_events, 2000)
    events = bench_events(n_events)
    where = Path(tempfile.mkdtemp(prefix="ctxkit-bench-log-", dir=folder))
    say = progress or (lambda msg: None)
    arms = []
    try:
        for mode, n in (("none", n_events), ("batch", n_events), ("always", n_sync)):
            say(f"append {mode}: {n} events")
            path = where / f"append-{mode}.jsonl"
            log = EventLog.create(path, durability=mode)

            def loop(log=log, n=n):
                append = log.append
                for event in events[:n]:
                    append(event)
                log.close()

            arms.append(_timed(f"append {mode}", n, path, loop))
        say(f"extend batch: {n_events} events in batches of 1000")
        path = where / "extend-batch.jsonl"
        log = EventLog.create(path, durability="batch")

        def extend_loop():
            for i in range(0, n_events, 1000):
                log.extend(events[i:i + 1000])
            log.close()

        arms.append(_timed("extend batch", n_events, path, extend_loop))
        say(f"bare chained: {n_events} events")
        dicts = [{**dataclasses.asdict(e), "seq": i, "id": f"e{i}-00000000", "ts": 1.0} for i, e in enumerate(events)]
        path = where / "bare-chained.jsonl"

        def bare_loop():
            prev = "0" * 64
            with open(path, "wb") as fh:
                for d in dicts:
                    body = orjson.dumps(d, option=orjson.OPT_SORT_KEYS)
                    digest = hashlib.sha256(prev.encode() + body).hexdigest()
                    fh.write(body[:-1] + b',"prev":"' + prev.encode() + b'","hash":"' + digest.encode() + b'"}\n')
                    prev = digest

        arms.append(_timed("bare chained", n_events, path, bare_loop))
        say(f"bare write+fsync: {n_sync} events")
        lines = (where / "append-always.jsonl").read_bytes().split(b"\n")[1:n_sync + 1]
        path = where / "bare-fsync.jsonl"

        def fsync_loop():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                for line in lines:
                    os.write(fd, line + b"\n")
                    os.fsync(fd)
            finally:
                os.close(fd)

        arms.append(_timed("bare write+fsync", len(lines), path, fsync_loop))
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return LogBenchResult(arms=tuple(arms), folder=str(where.parent))


def table(result: LogBenchResult) -> str:
    """The figures as a plain-text table, then the ratios."""
    rows = [f"{'arm':<18} {'events':>7} {'seconds':>9} {'events/s':>10} {'bytes/event':>12}"]
    for a in result.arms:
        rows.append(f"{a.name:<18} {a.events:>7} {a.seconds:>9.4f} {a.rate:>10,.0f} {a.bytes_per_event:>12.0f}")
    rows.append("")
    rows.extend(f"{name}: {value:.2f}" for name, value in result.ratios.items())
    rows.append(f"folder: {result.folder}")
    return "\n".join(rows)


def main(args) -> int:
    """`ctxkit bench log`: run once and print the table (or `--json`)."""
    import sys

    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr))
    result = run(args.events, fsync_events=args.fsync_events, folder=args.dir, progress=progress)
    if args.json:
        sys.stdout.write(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(table(result))
    return 0
