"""SIGINT and SIGTERM as the long commands see them: the first stops the work at its next
checkpoint, the second at once."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

INTERRUPTED = "interrupted"
"""The reason a run or a grid stopped on a signal (``metrics.jsonl``'s ``stopped``)."""


class Interrupts:
    """SIGINT and SIGTERM, as ``pretrain`` and ``reproduce`` see them: the first asks the work
    to stop at its next checkpoint (a run at the end of its logging window, with a checkpoint
    and a ``stopped`` record, as a time budget stops it; a grid starts no further cell and
    asks its cells to stop); the second stops at once (``KeyboardInterrupt``: what was done
    since the last checkpoint is lost). A signal within ``SAME_SIGNAL_S`` seconds of the
    first counts as the same one (a terminal's Ctrl-C reaches a grid's cells too). A grid
    asks its cells by a file (named by ``STOP_FILE_ENV`` in their environment;
    ``dcco.reproduce.pool``), which a cell's ``stop`` reads: a file cannot be lost as a
    signal can, at a process's start."""

    def __init__(self) -> None:
        from dcco.reproduce.pool import SAME_SIGNAL_S, STOP_FILE_ENV

        self.requested, self._at, self.same_s = False, 0.0, SAME_SIGNAL_S
        self.stop_file = os.environ.get(STOP_FILE_ENV)

    def handle(self, signum: int, frame: object) -> None:
        if self.requested:
            if time.monotonic() - self._at > self.same_s:
                raise KeyboardInterrupt
            return
        self.requested, self._at = True, time.monotonic()
        # os.write, not print: a signal that lands inside a print would make print re-enter
        os.write(2, f"\n{signal.Signals(signum).name}: stopping at the next checkpoint; "
                    f"interrupt again to stop at once (losing what was done since)\n".encode())

    def stop(self) -> str | None:
        """``INTERRUPTED`` once a signal came or the grid asked, else None (a run's
        ``stop``)."""
        if not self.requested and self.stop_file and os.path.exists(self.stop_file):
            self.requested = True
        return INTERRUPTED if self.requested else None


@contextlib.contextmanager
def _interruptible(interrupts: Interrupts | None) -> Iterator[None]:
    """``interrupts`` handles SIGINT and SIGTERM while a command runs (None: SIGINT raises
    ``KeyboardInterrupt``, SIGTERM ends the process, as by default), then the previous
    handlers come back (the CLI may run in a caller's process). A process that a
    non-interactive shell starts in the background (``nohup dcco reproduce ... &``) inherits
    SIGINT ignored, and Python leaves it so: without this, ``kill -INT`` would not reach it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    if interrupts is None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    else:
        for s in old:
            signal.signal(s, interrupts.handle)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
