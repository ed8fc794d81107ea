"""`ctxkit bench log`: `EventLog` append rates against bare loops, side by side in one run.

Arms, each on its own fresh log in one folder, over the same ~450-byte events (a `ToolResult` whose line,
with its `prev` and `hash`, is about 450 bytes), the log arms once per lock mode (`EventLog(lock=...)`:
`append`, writers taking turns with a lock per write, named as below; `writer`, one handle holding the log
from open to close, named with a ` [writer]` suffix), run one after the other so they meet the same load:
- `append none`, `append batch`, `append always`: `EventLog.append` one event at a time (then `close`).
- `extend batch`: `EventLog.extend` in batches of 1000 (one fsync each).
- `bare chained`: orjson (sorted keys) + sha256 chained over the previous hash, written through a buffered
  file: the floor a hash-chained JSONL log can reach in Python.
- `bare chained write`: the same loop with one `os.write` per line on an O_APPEND descriptor: the floor of
  `batch`, which promises each append reaches the OS before it returns (one system call per event at least).
- `bare write+fsync`: `os.write` + `os.fsync` per pre-encoded line: the floor of `always`.
`always` and `bare write+fsync` run `fsync_events` events (fsync is slow; both get the same count). Rates
are events per second; ratios (per lock mode) are `append none`, `append batch` and `extend batch` over
`bare chained`, `append batch` over `bare chained write`, and the time per event of `append always` over `bare write+fsync`. Each arm is timed on the wall clock and on this process's
CPU clock (user + system: what the loop itself cost, less sensitive to other work on a shared machine);
`rounds` > 1 runs every arm that many times, interleaved, and keeps each arm's best wall and best CPU time.
Speed is measured here, never in tests.
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
import sys

import orjson

from ctxkit.events import ToolResult
from ctxkit.log.event_log import EventLog

__all__ = ["LOCK_SUFFIX", "LogBenchArm", "LogBenchResult", "bench_events", "run"]

CONTENT_CHARS = 150
"""Characters of tool output per event: with the ids, hashes and fields the log line is ~450 bytes."""

LOCK_SUFFIX = {"append": "", "writer": " [writer]"}
"""What a log arm's name ends with, per lock mode."""


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
    cpu_seconds: float = 0.0
    """CPU time (user + system) of this process during the loop."""
    lock: str = ""
    """The log's lock mode (`append` or `writer`); empty for the bare loops."""

    @property
    def rate(self) -> float:
        """Events per second (wall clock)."""
        return self.events / self.seconds if self.seconds > 0 else float("inf")

    @property
    def cpu_rate(self) -> float:
        """Events per CPU second."""
        return self.events / self.cpu_seconds if self.cpu_seconds > 0 else float("inf")


@dataclass(frozen=True)
class LogBenchResult:
    """Every arm of one run, with the ratios the targets are stated in."""

    arms: tuple[LogBenchArm, ...]
    """In the order run."""
    folder: str
    """Where the logs were written (the file system decides what fsync costs)."""
    rounds: int = 1
    """How many times every arm ran (each arm's best wall and best CPU time are kept)."""

    def arm(self, name: str) -> LogBenchArm:
        """The arm called `name`."""
        return next(a for a in self.arms if a.name == name)

    @property
    def ratios(self) -> dict[str, float]:
        """Per lock mode (the key ends with its `LOCK_SUFFIX`): `append none`, `append batch` and `extend batch`
        rates over `bare chained`; `append batch` over `bare chained write`; `append always` time per event over `bare write+fsync` (lower is better;
        the target is <= 1.5). Wall clock."""
        return self._ratios(lambda a: a.seconds)

    @property
    def cpu_ratios(self) -> dict[str, float]:
        """`ratios` on the CPU clock."""
        return self._ratios(lambda a: a.cpu_seconds)

    def _ratios(self, seconds: Callable[[LogBenchArm], float]) -> dict[str, float]:
        per = lambda name: seconds(self.arm(name)) / self.arm(name).events  # noqa: E731
        bare, out = per("bare chained"), {}
        for suffix in LOCK_SUFFIX.values():
            out.update({f"none / bare chained{suffix}": bare / per(f"append none{suffix}"),
                        f"batch / bare chained{suffix}": bare / per(f"append batch{suffix}"),
                        f"batch / bare chained write{suffix}": per("bare chained write") / per(f"append batch{suffix}"),
                        f"extend / bare chained{suffix}": bare / per(f"extend batch{suffix}"),
                        f"always time / bare write+fsync time{suffix}": per(f"append always{suffix}")
                        / per("bare write+fsync")})
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (`--json`)."""
        return {"folder": self.folder, "rounds": self.rounds,
                "arms": [{**dataclasses.asdict(a), "rate": a.rate, "cpu_rate": a.cpu_rate} for a in self.arms],
                "ratios": self.ratios, "cpu_ratios": self.cpu_ratios}


def bench_events(n: int) -> list[ToolResult]:
    """`n` distinct ~450-byte-line events (deterministic)."""
    filler = "".join(f"{i:x}" for i in range(CONTENT_CHARS))[:CONTENT_CHARS - 12]
    return [ToolResult(tool_call_id=f"call_{i:06d}", name="shell", content=f"{filler} row {i:07d}", duration_s=0.25)
            for i in range(n)]


def _timed(name: str, n: int, path: Path, loop: Callable[[], None], lock: str = "") -> LogBenchArm:
    before = path.stat().st_size if path.exists() else 0  # a log's header is not an event
    start, cpu = time.perf_counter(), time.process_time()
    loop()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    size = path.stat().st_size - before
    return LogBenchArm(name=name, events=n, seconds=seconds, bytes_per_event=size / n if n else 0.0, cpu_seconds=cpu,
                       lock=lock)


def run(n_events: int = 20000, *, fsync_events: int | None = None, folder: str | None = None,
        progress: Callable[[str], None] | None = None, rounds: int = 1) -> LogBenchResult:
    """Run every arm `rounds` times (interleaved, keeping each arm's best wall and best CPU time) on `n_events`
    events (`fsync_events`, default min(n_events, 2000), for the two fsync-per-event arms), each round in a
    fresh temporary folder under `folder` (default: the system's), removed after."""
    n_sync = fsync_events if fsync_events is not None else min(n_events, 2000)
    events = bench_events(n_events)
    say = progress or (lambda msg: None)
    best: dict[str, LogBenchArm] = {}
    for round_no in range(rounds):
        where = Path(tempfile.mkdtemp(prefix="ctxkit-bench-log-", dir=folder))
        if rounds > 1:
            say(f"round {round_no + 1} of {rounds}")
        for arm in _round(events, n_sync, where, say):
            kept = best.setdefault(arm.name, arm)
            best[arm.name] = dataclasses.replace(kept, seconds=min(kept.seconds, arm.seconds),
                                                 cpu_seconds=min(kept.cpu_seconds, arm.cpu_seconds))
    return LogBenchResult(arms=tuple(best.values()), folder=str(where.parent), rounds=rounds)


def _round(events: list[ToolResult], n_sync: int, where: Path, say: Callable[[str], None]) -> list[LogBenchArm]:
    """Every arm once, in `where` (removed after)."""
    n_events = len(events)
    arms = []
    try:
        for mode, n in (("none", n_events), ("batch", n_events), ("always", n_sync)):
            for lock, suffix in LOCK_SUFFIX.items():
                say(f"append {mode}{suffix}: {n} events")
                path = where / f"append-{mode}-{lock}.jsonl"
                log = EventLog.create(path, durability=mode, lock=lock)

                def loop(log=log, n=n):
                    append = log.append
                    for event in events[:n]:
                        append(event)
                    log.close()

                arms.append(_timed(f"append {mode}{suffix}", n, path, loop, lock))
        for lock, suffix in LOCK_SUFFIX.items():
            say(f"extend batch{suffix}: {n_events} events in batches of 1000")
            path = where / f"extend-batch-{lock}.jsonl"
            log = EventLog.create(path, durability="batch", lock=lock)

            def extend_loop(log=log):
                for i in range(0, n_events, 1000):
                    log.extend(events[i:i + 1000])
                log.close()

            arms.append(_timed(f"extend batch{suffix}", n_events, path, extend_loop, lock))
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
        say(f"bare chained write: {n_events} events")
        path = where / "bare-chained-write.jsonl"

        def bare_write_loop():
            prev = "0" * 64
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                for d in dicts:
                    body = orjson.dumps(d, option=orjson.OPT_SORT_KEYS)
                    digest = hashlib.sha256(prev.encode() + body).hexdigest()
                    os.write(fd, body[:-1] + b',"prev":"' + prev.encode() + b'","hash":"' + digest.encode() + b'"}\n')
                    prev = digest
            finally:
                os.close(fd)

        arms.append(_timed("bare chained write", n_events, path, bare_write_loop))
        say(f"bare write+fsync: {n_sync} events")
        lines = (where / "append-always-append.jsonl").read_bytes().split(b"\n")[1:n_sync + 1]
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
    return arms


def table(result: LogBenchResult) -> str:
    """The figures as a plain-text table, then the ratios of both lock modes side by side."""
    rows = [f"{'arm':<27} {'events':>7} {'seconds':>9} {'events/s':>10} {'CPU s':>9} {'events/CPU s':>13} "
            f"{'bytes/event':>12}"]
    for a in result.arms:
        rows.append(f"{a.name:<27} {a.events:>7} {a.seconds:>9.4f} {a.rate:>10,.0f} {a.cpu_seconds:>9.4f} "
                    f"{a.cpu_rate:>13,.0f} {a.bytes_per_event:>12.0f}")
    ratios, cpu = result.ratios, result.cpu_ratios
    rows += ["", f"{'ratio (wall, CPU)':<37} {'lock=append':>16} {'lock=writer':>16}"]
    for name in (k for k in ratios if not k.endswith(LOCK_SUFFIX["writer"])):
        cells = [f"{ratios[name + s]:.2f} ({cpu[name + s]:.2f})" for s in LOCK_SUFFIX.values()]
        rows.append(f"{name:<37} {cells[0]:>16} {cells[1]:>16}")
    rows.append(f"folder: {result.folder}; best of {result.rounds} round(s) per arm")
    return "\n".join(rows)


def main(args) -> int:
    """`ctxkit bench log`: run once and print the table (or `--json`)."""
    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr))
    result = run(args.events, fsync_events=args.fsync_events, folder=args.dir, progress=progress,
                 rounds=getattr(args, "rounds", 1))
    if args.json:
        sys.stdout.write(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(table(result))
    return 0
