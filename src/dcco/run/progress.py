"""Progress of long loops (rounds, probe steps): count, values, rate and ETA.

On a terminal it redraws one line in place. When the stream is not a terminal (nohup, CI
logs, pipes, files) it writes a plain line now and then instead: at every tenth of the work
and at least every ``interval`` seconds (a tenth reached within ``min_gap`` seconds of the
last line is skipped, so a phase that takes a second leaves one line), so a log shows a long
run is alive without being flooded. ``enabled=False`` silences it.
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
    """Progress of ``total`` steps starting at ``initial``; use as a context manager.

    Args:
        total: steps in all.
        initial: steps already done (a resumed run).
        label: what a step is called ("round", "probe step").
        stream: where to write (default: standard error).
        enabled: None: a live bar on a terminal, plain lines elsewhere; False: nothing.
        interval: the longest wait, in seconds, between two plain lines.
        min_gap: the shortest wait, in seconds, between two plain lines before the last.
    """

    def __init__(self, total: int, initial: int = 0, label: str = "round",
                 stream: TextIO | None = None, enabled: bool | None = None,
                 interval: float = 30.0, min_gap: float = 1.0) -> None:
        self.total, self.done, self.label = total, initial, label
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled is not False
        self.interval, self.min_gap = interval, min_gap
        self._start = time.perf_counter()
        self._initial = initial
        self._last_draw = 0.0
        self._last_line = self._start
        self._tenth = self._tenths(initial)
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

    def _tenths(self, done: int) -> int:
        return 10 * done // self.total if self.total else 10

    def update(self, done: int, **postfix: float | str) -> None:
        """``done`` steps so far; ``postfix`` values are shown after the count (floats with
        4 significant digits, strings as given)."""
        self.done = done
        self._postfix = "  ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in postfix.items()
        )
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.live:
            if now - self._last_draw > 0.1 or done >= self.total:
                self._last_draw = now
                self.stream.write("\r" + self.line() + "\033[K")
                self.stream.flush()
            return
        tenth = self._tenths(done)
        since = now - self._last_line
        if (tenth > self._tenth and done < self.total and since >= self.min_gap) \
                or since >= self.interval:
            self._tenth, self._last_line = tenth, now
            self.stream.write(self.line(plain=True) + "\n")
            self.stream.flush()

    def note(self, text: str) -> None:
        """A line of its own (a warning), above the live bar, which is drawn again."""
        if not self.enabled:
            return
        if self.live:
            self.stream.write("\r" + text + "\033[K\n" + self.line())
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def line(self, plain: bool = False) -> str:
        """The progress as one line: with a bar, or ``plain`` for logs."""
        frac = self.done / self.total if self.total else 1.0
        rate = self.rate
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        eta_text = _duration(eta) if math.isfinite(eta) else "--:--"
        if plain:
            head = f"{self.label} {self.done}/{self.total} ({frac:.0%})"
        else:
            width = 24
            filled = int(frac * width)
            bar = "█" * filled + "·" * (width - filled)
            head = f"{self.label} {self.done}/{self.total} |{bar}| {frac:4.0%}"
        postfix = f"  {self._postfix}" if self._postfix else ""
        plural = self.label + ("es" if self.label.endswith(("s", "x", "ch", "sh")) else "s")
        return f"{head}{postfix}  {rate:.2f} {plural}/s  ETA {eta_text}"

    def close(self) -> None:
        """The last line: the bar's final state on a terminal, a plain line elsewhere."""
        if not self.enabled:
            return
        if self.live:
            self.stream.write("\r" + self.line() + "\033[K\n")
        else:
            self.stream.write(self.line(plain=True) + "\n")
        self.stream.flush()
