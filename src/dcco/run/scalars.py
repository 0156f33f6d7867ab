"""TensorBoard scalars of a run, beside its metrics.jsonl (optional: ``dcco[tensorboard]``).

With ``train.tensorboard = true`` every metrics record a run writes (loss, lr, rounds/s,
clients, samples, exchanges, k-NN, and Flower's reply counters) and every evaluation
(accuracy in %) also goes to TensorBoard event files in ``RUN_DIR/tensorboard``, each scalar
at its round. ``tensorboard --logdir RUN_DIR`` shows one run; ``dcco compare --tensorboard``
prints the command for several.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dcco.config import TENSORBOARD_HINT as INSTALL_HINT
from dcco.config import tensorboard_available
from dcco.errors import UserError


def flat_scalars(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics record by tag, nested dicts joined with "/" (``replies/update/
    accepted``); the round, strings and booleans are left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        tag = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= flat_scalars(value, f"{tag}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key != "round":
            out[tag] = float(value)
    return out


class ScalarLog:
    """TensorBoard event files in ``logdir``; every write is flushed, so a killed run loses
    nothing that reached metrics.jsonl."""

    def __init__(self, logdir: Path) -> None:
        if not tensorboard_available():
            raise UserError(f"train.tensorboard = true needs TensorBoard: {INSTALL_HINT}")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(logdir))

    def record(self, record: dict[str, Any]) -> None:
        """One metrics record, at its round; k-NN in %."""
        step = int(record.get("round", 0))
        for tag, value in flat_scalars(record).items():
            self.writer.add_scalar("knn_percent" if tag == "knn" else tag,
                                   100 * value if tag == "knn" else value, step)
        self.writer.flush()

    def evaluation(self, key: str, accuracy: float, step: int) -> None:
        """An evaluation's test accuracy, in %, as ``eval/<protocol>@<labels>``."""
        self.writer.add_scalar(f"eval/{key}", 100 * accuracy, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def tensorboard_command(run_dirs: list[Path]) -> str:
    """The command that shows several runs side by side in TensorBoard."""
    spec = ",".join(f"{p.name}:{p / 'tensorboard'}" for p in run_dirs)
    return f"tensorboard --logdir_spec {spec}"
