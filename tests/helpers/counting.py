"""Counting what code does instead of timing it: the tests must pass on a busy machine and on
any CPU, so "no Python loop over the samples" is checked by the lines of Python that run, which
do not depend on either."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

LINES_WITHOUT_A_SAMPLE_LOOP = 30_000
"""More lines of Python than a vectorised pass over 60,000 samples runs (measured: the
Fashion-MNIST loader 3,832, most of them gzip's reads; the Dirichlet partition 177 to 7,364
by α), and fewer than a loop of at least one line a sample runs (60,002 for the barest)."""


def python_lines(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """``fn(*args, **kwargs)`` and the number of lines of Python it ran, in every frame it
    entered (``sys.settrace``'s line events, in this thread)."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.settrace(previous)
    return result, count


def count_the_runs_work(monkeypatch) -> dict[str, int]:
    """Counters of what checking a run costs, wherever in dcco it happens: passes over the
    data's values (``refuse_non_finite``), partitions drawn (``build_partition``), the
    config's models built (``build_dual_encoder``) and differential privacy's accounting
    (``Privacy.of``). Each function is wrapped in every dcco module that holds it under its
    name, so that a second scan through another module counts as well."""
    from dcco.data.samples import refuse_non_finite
    from dcco.models import build_dual_encoder
    from dcco.run.planning import build_partition
    from dcco.run.privacy_plan import Privacy

    counts = {"scans": 0, "partitions": 0, "models": 0, "privacy": 0}

    def counting(real, key):
        def wrapper(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)
        return wrapper

    for real, key in ((refuse_non_finite, "scans"), (build_partition, "partitions"),
                      (build_dual_encoder, "models")):
        wrapper = counting(real, key)
        for name, module in list(sys.modules.items()):
            if (name == "dcco" or name.startswith("dcco.")) and getattr(
                    module, real.__name__, None) is real:
                monkeypatch.setattr(module, real.__name__, wrapper)
    monkeypatch.setattr(Privacy, "of", classmethod(counting(Privacy.of.__func__, "privacy")))
    return counts
