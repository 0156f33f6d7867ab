"""A pytest plugin that records what each test costs the machine: its wall time, the CPU of the
pytest process and of the children it reaped, and the CPU the whole machine spent meanwhile
(``/proc/stat``: user, nice and system). Run the tests one at a time on an otherwise idle
machine, and the last is the test's own cost, detached processes included (a SuperLink, Ray,
the node workers), which ``/usr/bin/time`` of the suite does not see.

    CPU_LOG=out.jsonl PYTHONPATH=benchmarks python -m pytest -p cpu_per_test -o addopts="" TESTS

One JSON line a test: ``{"test", "wall", "self", "children", "machine_busy"}``, in seconds.
The record of 2026-11-28 (the 25 slowest tests of a full run, one at a time) is
``benchmarks/results/suite_cpu_2026-11-28.jsonl`` (docs/performance.md, "The test suite").
"""

from __future__ import annotations

import json
import os
import resource
import time

import pytest


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime


def _machine() -> float:
    """Seconds of CPU the machine has spent since boot (user, nice, system)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:4]]
    return sum(ticks) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    (own0, reaped0), wall0, machine0 = _cpu(), time.perf_counter(), _machine()
    yield
    (own1, reaped1), wall1, machine1 = _cpu(), time.perf_counter(), _machine()
    with open(os.environ["CPU_LOG"], "a") as f:
        f.write(json.dumps({"test": item.nodeid, "wall": round(wall1 - wall0, 1),
                            "self": round(own1 - own0, 1),
                            "children": round(reaped1 - reaped0, 1),
                            "machine_busy": round(machine1 - machine0, 1)}) + "\n")
