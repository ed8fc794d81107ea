"""LoadMeter: the wall time of a block and the load average it ran under, in the README's words."""

from __future__ import annotations

import itertools

import ctxkit.benchmarks.machine_load as machine_load
from ctxkit.benchmarks.machine_load import LoadMeter


def test_load_is_sampled_and_described(monkeypatch):
    loads = itertools.chain([1.24, 2.46], itertools.repeat(2.0))
    monkeypatch.setattr(machine_load.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(machine_load.os, "cpu_count", lambda: 2)
    with LoadMeter(every_s=0.01) as load:
        while len(load.samples) < 3:
            pass
    assert load.samples[:2] == [1.24, 2.46] and load.wall > 0
    assert str(load) == "load average 1.2-2.5 on 2 cores"


def test_a_steady_load_is_one_number(monkeypatch):
    monkeypatch.setattr(machine_load.os, "getloadavg", lambda: (0.52, 0.0, 0.0))
    monkeypatch.setattr(machine_load.os, "cpu_count", lambda: 16)
    with LoadMeter(every_s=10.0) as load:
        pass
    assert load.samples == [0.52] and str(load) == "load average 0.5 on 16 cores"
