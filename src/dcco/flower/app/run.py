"""A Flower run of dcco's ServerApp: its run directory, the simulator's training loop over
the federation's rounds, and the metrics window with Flower's counters."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from flwr.serverapp import Grid

from dcco.config import RunConfig
from dcco.core.server import ReplyTally
from dcco.data.datasets import ImageDataset
from dcco.flower.app.federation import Federation, RoundAggregate
from dcco.flower.appconfig import FlowerConfig
from dcco.flower.node_states import new_states_key
from dcco.run.loop import MetricsWindow, pretraining_loop, resume_from_checkpoint
from dcco.run.pretraining import Pretraining, RoundMetrics
from dcco.run.rundir import RunDir, RunDirError, config_differences

LOG = logging.getLogger("flwr.dcco")


def open_run(cfg: RunConfig, fcfg: FlowerConfig) -> RunDir:
    """The run directory of a Flower run: created, or reopened to resume."""
    path = Path(fcfg.run_dir or
                f"runs/flower-{cfg.train.method}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    if not fcfg.resume:
        try:
            run = RunDir.create(path, cfg)
        except RunDirError:  # its message speaks of the CLI's flags, not the app's keys
            raise RunDirError(
                f"flower.run_dir {path} already holds a run; continue it with "
                f"--run-config \"flower.resume=true flower.run_dir='{path}'\", or choose "
                f"another flower.run_dir") from None
    else:
        if not (path / "config.toml").is_file():
            raise RunDirError(f"flower.resume = true, but flower.run_dir {path} holds no dcco "
                              f"run (no config.toml); set flower.run_dir to the run to continue")
        run = RunDir.open(path)
        if differ := config_differences(run.config(), cfg):
            raise RunDirError(f"flower.resume: {path} holds a run with another config "
                              f"({differ}); cannot resume it with this one")
        run.stop_path.unlink(missing_ok=True)  # a request to stop the run that ended
    # the key of its clients' states on the nodes' disks: a resumed run keeps its own
    key = run.summary().get(STATES_KEY) or new_states_key()
    run.update_summary(backend="flower", flower=asdict(fcfg), **{STATES_KEY: key})
    return run


STATES_KEY = "flower_states_key"
"""summary.json's key of the run's key for its clients' states on the nodes' disks
(``dcco.flower.node_states``)."""


def run_federated(grid: Grid, cfg: RunConfig, fcfg: FlowerConfig, train_set: ImageDataset,
                  test_set: ImageDataset | None = None) -> dict[str, Any]:
    """Pretrain over Flower into a run directory in the simulator's format.

    Writes ``config.toml``, ``version.json``, ``metrics.jsonl`` (the simulator's round records,
    plus ``replies``, ``skipped`` and ``unreachable`` counters; a skipped round also gets a
    record ``{"round", "skipped": reason}``), ``checkpoint.safetensors`` and ``summary.json``,
    so ``dcco evaluate`` and ``dcco compare`` work on Flower runs.

    Args:
        grid: the ServerApp's grid.
        cfg: the run config. fcfg: the adapter's settings.
        train_set: the server's training split (client partition, k-NN bank, calibration).
        test_set: the k-NN monitor's queries; None disables the monitor.

    A file ``STOP`` created in the run directory stops the run at its next logged round, with
    a checkpoint and a ``{"round", "stopped"}`` record, as an unfinished run that
    ``flower.resume = true`` continues; ``flwr stop`` instead ends the ServerApp wherever it
    is, and resuming goes back to the last checkpoint.

    Returns:
        The summary written to ``summary.json``; for a stopped run ``{"rounds", "stopped"}``.
    """
    # its refusals before the run directory is written; the nodes keep their clients' states
    pt = Pretraining.of(cfg, train_set, holds_client_states=False)
    run = open_run(cfg, fcfg)
    LOG.info("dcco: run directory %s", run.path.resolve())
    if fcfg.resume:
        resume_from_checkpoint(pt, run)
    else:
        run.truncate_metrics(0)
    fed = Federation(grid, pt, fcfg, run.summary()[STATES_KEY])
    fed.wait_for_nodes()
    LOG.info("dcco: %d nodes for %d partitions, %d clients", len(fed.nodes),
             fed.num_partitions, pt.partition.num_clients)

    def step() -> RoundMetrics:
        start = time.perf_counter()
        agg = fed.step()
        return RoundMetrics(pt.rounds_done, agg.loss, pt.lr(agg.round), agg.clients,
                            agg.samples, time.perf_counter() - start,
                            agg.result.exchanges if agg.result else 0, agg.skipped, agg)

    def log(record: dict[str, Any]) -> None:
        loss = f"{record['loss']:.4g}" if "loss" in record else "n/a (skipped)"
        LOG.info("dcco: round %d/%d loss %s", record["round"], cfg.train.rounds, loss)

    summary = pretraining_loop(pt, run, step, train_set, test_set, window=FlowerWindow,
                               meta={"backend": "flower"}, on_log=log, stop=run.stop_requested)
    if "stopped" in summary:
        LOG.info("dcco: %s after round %d; continue it with flower.resume = true",
                 summary["stopped"], summary["rounds"])
    return summary


class FlowerWindow(MetricsWindow):
    """The simulator's metrics window plus Flower's counters: skipped rounds, unreachable
    clients, the fate of the requests per phase, and the SecAgg+ clipped fraction."""

    def __init__(self) -> None:
        super().__init__()
        self.unreachable = 0
        self.replies: dict[str, ReplyTally] = {}
        self.clipped: dict[str, list[float]] = {}
        self.traffic: Counter[str] = Counter()

    def add(self, m: RoundMetrics) -> None:
        super().add(m)
        agg: RoundAggregate = m.details
        self.unreachable += agg.unreachable
        for phase, tally in agg.replies.items():
            self.replies[phase] = self.replies.get(phase, ReplyTally()) + tally
        for phase, value in agg.clipped.items():
            self.clipped.setdefault(phase, []).append(value)
        self.traffic.update(agg.traffic)

    def record(self, round_done: int, lr: float) -> dict[str, Any]:
        rec = super().record(round_done, lr) | {
            "rounds_skipped": self.skipped, "unreachable": self.unreachable,
            "replies": {p: t.as_dict() for p, t in self.replies.items()}}
        if self.clipped:
            rec["secagg_clipped"] = {p: max(v) for p, v in self.clipped.items()}
        if self.traffic:  # measured from the messages, per round of the window
            rec["message_bytes"] = {k: v // max(self.rounds, 1)
                                    for k, v in self.traffic.items()}
        return rec


__all__ = ["STATES_KEY", "FlowerWindow", "open_run", "run_federated"]
