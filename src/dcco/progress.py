"""A live progress bar for long loops: round, loss, rounds per second and ETA.

On a terminal it redraws one line in place; when the stream is not a terminal (CI logs, pipes,
files) it stays silent except for the final line, so logs are not flooded with carriage returns.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO

from typing_extensions import Self


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Progress:
    """Progress of ``total`` steps starting at ``initial``; use as a context manager."""

    def __init__(self, total: int, initial: int = 0, label: str = "round",
                 stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.total, self.done, self.label = total, initial, label
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.enabled = isatty if enabled is None else enabled
        self._start = time.perf_counter()
        self._initial = initial
        self._last_draw = 0.0
        self._postfix = ""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def rate(self) -> float:
        """Steps per second since this bar started."""
        elapsed = time.perf_counter() - self._start
        return (self.done - self._initial) / elapsed if elapsed > 0 else 0.0

    def update(self, done: int, **postfix: float | str) -> None:
        self.done = done
        self._postfix = "  ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in postfix.items()
        )
        now = time.perf_counter()
        if self.enabled and (now - self._last_draw > 0.1 or done >= self.total):
            self._last_draw = now
            self.stream.write("\r" + self.line() + "\033[K")
            self.stream.flush()

    def line(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        width = 24
        filled = int(frac * width)
        bar = "█" * filled + "·" * (width - filled)
        rate = self.rate
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        eta_text = _duration(eta) if math.isfinite(eta) else "--:--"
        return (f"{self.label} {self.done}/{self.total} |{bar}| {frac:4.0%}  {self._postfix}  "
                f"{rate:.2f} {self.label}s/s  ETA {eta_text}")

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line() + "\033[K\n")
            self.stream.flush()
