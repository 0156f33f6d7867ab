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
