"""What a run does at its collapse warning (``train.on_collapse``), so that a run that
collapses anyway does not burn its remaining rounds.

- ``"warn"``: the warning is said once and the run trains on (the default: a grid cell's
  record then shows the whole run, collapse included).
- ``"stop"``: the run ends at the warning. Its result is a checkpoint from before the
  collapse: the model is restored to it (and written as the run's checkpoint), the
  summary's ``rounds`` are its rounds, and every evaluation reads it.
- ``"rewind"``: the run goes back to that checkpoint, halves the server's rate
  (``Pretraining.lr_scale``) and trains on with a fresh watch, at most ``MAX_REWINDS``
  times; a collapse after that stops the run as ``"stop"`` does.

Which checkpoint: the one before the last (``RunDir.earlier_checkpoint_path``, which these
modes keep), at least one ``train.checkpoint_every`` before the warning. The watch warns a
few readings into a collapse, so the last checkpoint may already hold a model on its way
down. A run under ``"stop"`` or ``"rewind"`` also
writes a checkpoint at its start when it has none, so that an early collapse has a model to
come back to.
Each event is one line: said as the warning is, a ``{"round", "collapse_response", ...}``
record in metrics.jsonl (kept when a rewind or a resume drops the records after a
checkpoint), and the summary's ``collapse_events``. A rewind rewrites its checkpoint with
the halved rate, so an interrupted run resumes at the rate it had.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, Literal

from dcco.callers import caller_stacklevel
from dcco.config import ConfigError
from dcco.core.collapse import CollapseWarning
from dcco.run.checkpoint import save_checkpoint
from dcco.run.monitors import Checkpoints, Collapse, Monitor
from dcco.run.pretraining import Pretraining
from dcco.run.rundir import COLLAPSE_EVENT, RunDir

MAX_REWINDS = 3
"""Rewinds a run under ``train.on_collapse = "rewind"`` takes before it stops instead."""

Turn = Literal["stop", "rewind"]


class CollapseResponse:
    """``train.on_collapse`` over a run's loop (``dcco.run.loop.pretraining_loop``).

    Args:
        pt: the run's state.
        run: its directory (the checkpoint to come back to, the metrics).
        collapse: the loop's collapse monitor, whose watch gives the warning.
        meta: what the loop's checkpoints store beside the model.
        say: says an event's line (None: a ``CollapseWarning`` at the caller's line, as the
            collapse warning itself is given).
    """

    def __init__(self, pt: Pretraining, run: RunDir, collapse: Collapse, meta: dict[str, Any],
                 say: Callable[[str], None] | None) -> None:
        self.pt, self.run, self.collapse, self.meta, self.say = pt, run, collapse, meta, say
        self.mode = pt.cfg.train.on_collapse
        self.writes = pt.rank == 0
        if self.mode == "rewind" and pt.method.stateful and pt.client_states is None:
            raise ConfigError(
                f"train.on_collapse = \"rewind\" restores the server's checkpoint, but "
                f"{pt.cfg.train.method}'s clients keep their own models on the nodes, which "
                f"it cannot rewind; use \"stop\" or \"warn\" here, or rewind in the simulator")

    @classmethod
    def of(cls, pt: Pretraining, run: RunDir, monitors: list[Monitor],
           say: Callable[[str], None] | None) -> CollapseResponse:
        """The response over a loop's standard monitors (``standard_monitors``): their
        collapse watch, and their checkpoints' meta."""
        collapse = next(m for m in monitors if isinstance(m, Collapse))
        checkpoints = next(m for m in monitors if isinstance(m, Checkpoints))
        return cls(pt, run, collapse, checkpoints.meta, say)

    @property
    def rewinds(self) -> int:
        """The rewinds this run has taken (read from its rate: each one halves it)."""
        return round(-math.log2(self.pt.lr_scale))

    def start(self) -> None:
        """Checkpoint the run's start when it has no checkpoint and may have to come back."""
        if self.mode != "warn" and self.writes and not self.run.checkpoint_path.is_file():
            self._save()

    def after_log(self, round_done: int) -> Turn | None:
        """Act on a collapse warning given at this logged round: "stop" (the model is back
        at the last checkpoint and the run ends), "rewind" (back at it, at half the rate,
        going on), or None (no warning, or ``"warn"``)."""
        warning = self.collapse.warned_at(round_done)
        if warning is None or self.mode == "warn":
            return None
        turn: Turn = "rewind" if self.mode == "rewind" and self.rewinds < MAX_REWINDS \
            else "stop"
        halved = self.pt.lr_scale / 2  # before the checkpoint is read, whatever rank 0 wrote
        kept = self._restore()
        if turn == "rewind":
            self.pt.lr_scale = halved
            self.collapse.rearm()
        if self.writes:  # the result (stop), or where a resume goes on from (rewind)
            self._save()
        if turn == "rewind":
            line = (f"collapse at round {round_done}: rewound to round {kept}, the server's "
                    f"rate now {self.pt.lr_scale:g} of its schedule (rewind {self.rewinds} of "
                    f"{MAX_REWINDS})")
        else:
            why = (f"after {MAX_REWINDS} rewinds" if self.mode == "rewind"
                   else "train.on_collapse = \"stop\"")
            line = (f"collapse at round {round_done}: run stopped ({why}); its result is "
                    f"round {kept}'s checkpoint, from before the collapse")
        event = {"round": round_done, COLLAPSE_EVENT: turn, "to_round": kept,
                 "lr_scale": self.pt.lr_scale, "line": line, "message": warning}
        if self.writes:
            self.run.append_metrics(event)
        if self.say is not None:
            self.say(line)
        elif self.writes:
            warnings.warn(line, CollapseWarning, stacklevel=caller_stacklevel())
        return turn

    def _restore(self) -> int:
        """Load the checkpoint from before the collapse (model, optimiser, round state) into
        ``pt``, drop the metrics after it (the collapse events stay), and return its rounds.
        That is the checkpoint before the last one where it is kept: the watch warns a few
        readings into a collapse (three low C_ii in a row for a plateau), so the last
        checkpoint may already hold a model on its way down."""
        earlier = self.run.earlier_checkpoint_path
        path = earlier if earlier.is_file() else self.run.checkpoint_path
        self.pt.restore(path)
        if self.writes:
            self.run.truncate_metrics(self.pt.rounds_done)
        return self.pt.rounds_done

    def _save(self) -> None:
        save_checkpoint(self.run.checkpoint_path, self.pt.model, self.pt.optimizer,
                        self.pt.rounds_done, meta=self.meta, state=self.pt.round_state())


def stopped_at_collapse(summary: dict[str, Any]) -> bool:
    """Whether a run's summary is that of a run stopped at its collapse (finished, short of
    its rounds)."""
    return "stopped_at_collapse" in summary


def pretraining_ended(summary: dict[str, Any], rounds: int) -> bool:
    """Whether a run with this summary needs no more pretraining: it ran its ``rounds``, or
    stopped at its collapse."""
    return summary.get("rounds") == rounds or stopped_at_collapse(summary)


__all__ = ["MAX_REWINDS", "CollapseResponse", "pretraining_ended", "stopped_at_collapse"]
