"""The machine's load while something is timed: timings on a shared machine mean little without it.

`with LoadMeter() as load: ...` measures the block's wall time (`load.wall`) and samples the 1-minute load
average (`os.getloadavg`) every second; `str(load)` is `load average 1.2-2.4 on 2 cores`, the form the README
gives beside each timing.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

__all__ = ["LoadMeter"]


class LoadMeter:
    """Wall time of a `with` block and the machine's load while it ran: the 1-minute load average, sampled
    every `every_s` seconds (`os.getloadavg`), beside the core count. Timings on a shared machine mean little
    without it."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        """Seconds between two samples."""
        self.samples: list[float] = []
        """The 1-minute load averages sampled, the first at entry."""
        self.wall = 0.0
        """Wall time of the block in seconds (set at exit)."""
        self.t0_epoch = 0.0
        """`time.time()` at entry, to compare with file times."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> "LoadMeter":
        self._t0, self.t0_epoch = time.perf_counter(), time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall = time.perf_counter() - self._t0
        self._stop.set()
        self._thread.join()

    def __str__(self) -> str:
        lo, hi = min(self.samples), max(self.samples)
        span = f"{lo:.1f}" if round(lo, 1) == round(hi, 1) else f"{lo:.1f}-{hi:.1f}"
        return f"load average {span} on {os.cpu_count()} cores"
