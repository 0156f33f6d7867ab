"""The strategy's metrics file (``DCCOStrategy(metrics_file=...)``): JSON lines, one a round,
round 0 the initial model's evaluation. Each line holds ``round`` and, where the round has
them, ``train`` (its ``train_metrics_clientapp`` record), ``server-lr`` (the server
optimiser's rate that round), ``federated-evaluation`` and ``server-evaluation``. A line is
appended as its round ends; a resumed run first rewrites the file, atomically, from its
checkpoint's rounds, so the file never holds a round twice nor one the model lacks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from flwr.serverapp.strategy import Result

from dcco.files import atomic_write_text


class MetricsFile:
    """The file at ``path`` (its folder made on first write).

    Args:
        path: the file.
        lr_of: the server's rate in a round (from 1).
    """

    def __init__(self, path: Path, lr_of: Callable[[int], float]) -> None:
        self.path, self.lr_of = path, lr_of

    def line(self, r: int, result: Result) -> str:
        """Round ``r`` of ``result`` as one JSON line."""
        record: dict = {"round": r}
        if (train := result.train_metrics_clientapp.get(r)) is not None:
            record |= {"train": dict(train), "server-lr": self.lr_of(r)}
        for name, history in (("federated-evaluation", result.evaluate_metrics_clientapp),
                              ("server-evaluation", result.evaluate_metrics_serverapp)):
            if (metrics := history.get(r)) is not None:
                record[name] = dict(metrics)
        return json.dumps(record) + "\n"

    def restart(self, result: Result, last: int) -> None:
        """The file anew with rounds 0 to ``last`` of ``result`` (0: none but round 0)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, "".join(self.line(r, result) for r in range(last + 1)))

    def append(self, r: int, result: Result) -> None:
        """Round ``r``'s line at the end of the file."""
        with self.path.open("a") as f:
            f.write(self.line(r, result))


__all__ = ["MetricsFile"]
