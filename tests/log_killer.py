"""A writer process to SIGKILL mid-append (tests/log/test_log_faults.py, tests/log/test_log_writer_mode.py).

`writer_script(open_args)` is the source of a `python -c` program that opens the log named by argv[1] with
`EventLog.open(argv[1], <open_args>)`, prints `ready <n>`, then appends large `ToolResult`s forever,
printing each acknowledged seq; `body(seq)` is the content it writes for `seq`.
"""

from __future__ import annotations

import hashlib

_WRITER = r"""
import hashlib, sys
from ctxkit.events import ToolResult
from ctxkit.log.event_log import EventLog

def body(seq):
    unit = f"{seq}:{hashlib.sha256(str(seq).encode()).hexdigest()};"
    return unit * (5000 + (seq * 7919) % 50000)  # 0.35 to 3.8 MB per event

log = EventLog.open(sys.argv[1], OPEN_ARGS)
print("ready", len(log), flush=True)
while True:
    seq = len(log)
    event = log.append(ToolResult(tool_call_id=f"c{seq}", content=body(seq), duration_s=seq / 3))
    print(event.seq, flush=True)
"""


def writer_script(open_args: str) -> str:
    """The writer program, opening the log with `EventLog.open(argv[1], <open_args>)`."""
    return _WRITER.replace("OPEN_ARGS", open_args)


def body(seq: int) -> str:
    """The `ToolResult.content` the writer appends at `seq` (0.35 to 3.8 MB)."""
    unit = f"{seq}:{hashlib.sha256(str(seq).encode()).hexdigest()};"
    return unit * (5000 + (seq * 7919) % 50000)


def kill_mid_append(argv: list[str], path, *, pause_s: float, wait_for_growth: bool) -> list[int]:
    """Start the writer (`argv`), wait for `ready`, sleep `pause_s` (then, with `wait_for_growth`, until the
    log grows: inside a multi-megabyte `write`), SIGKILL it; return the seqs it acknowledged (a line cut
    by the kill is not an acknowledgement)."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"ready")
    time.sleep(pause_s)
    if wait_for_growth:
        size, deadline = path.stat().st_size, time.monotonic() + 10
        while path.stat().st_size == size and time.monotonic() < deadline:
            pass
    proc.send_signal(signal.SIGKILL)
    out = proc.stdout.read()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return [int(x) for x in out[: out.rfind(b"\n") + 1].split(b"\n")[:-1]]
