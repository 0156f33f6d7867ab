"""What the commands share: run folder names, the one place that prints, the command that
continues an interrupted one, and a progress bar per evaluation phase."""

from __future__ import annotations

import argparse
import shlex
from datetime import datetime
from pathlib import Path

from typing_extensions import Self


def _default_run_dir(stem: str, method: str) -> Path:
    return Path("runs") / f"{stem}-{method}-{_now()}"


def _now() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")


def _say(text: str) -> None:
    print(text, flush=True)


def _resume_with(args: argparse.Namespace, command: list[str]) -> None:
    """Record the command that continues this one, for ``main`` to show if Ctrl-C stops it;
    each command records it once it knows (the run directory, the demo folder)."""
    args.resume_hint = shlex.join(command)


class _PhaseProgress:
    """A progress callback (``evaluate.StepCallback``) that shows one bar per phase of an
    evaluation (feature batches, probe steps, ...), each closed when the next begins."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.phase: str | None = None
        self.bar = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        from dcco.run.progress import Progress

        if (phase != self.phase or self.bar is None or done < self.bar.done
                or total != self.bar.total):
            self.close()
            self.phase = phase
            self.bar = Progress(total, label=phase, enabled=None if self.enabled else False)
        self.bar.update(done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


