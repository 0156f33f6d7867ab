"""The run loop of every backend (``pretraining_loop``): rounds until the run is finished,
with metrics records (``MetricsWindow``) and the monitors of ``dcco.run.monitors`` (the
collapse watch, privacy, k-NN, probe, checkpoints, the summary); ``run_pretraining`` and ``run_with_progress`` run it in this
process. ``Pretraining`` holds the state (``dcco.run.pretraining``); data comes in, metrics go
out, the CLI shows and stores them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torch import Tensor

from dcco.config import RunConfig
from dcco.core.collapse import FIGURES
from dcco.data.paired import Dataset
from dcco.models import DualEncoder
from dcco.run.collapse_response import CollapseResponse, stopped_at_collapse
from dcco.run.monitors import Monitor, message_bytes, run_summary, standard_monitors
from dcco.run.pretraining import Pretraining, RoundMetrics, read_numbers
from dcco.run.rundir import RunDir
from dcco.run.setup import CheckedRun, check_run

RoundCallback = Callable[[RoundMetrics, dict[str, float]], None]


class MetricsWindow:
    """The rounds since the last metrics record (one record every ``train.log_every``
    rounds): their mean loss, rate, clients, samples and exchanges; for FedU and FedEMA, the
    clients a round that came back with a model of their own (``returning_clients``) and
    the means over them of their divergence ‖W_g − W_k‖ (``divergence``) and of FedU's
    choice of the global predictor (``fedu_global_predictor``, the share under
    ``loss.fedu_threshold``) or FedEMA's μ (``fedema_mu``). A backend with more to report
    (Flower's reply counters) extends ``add`` and ``record``."""

    def __init__(self) -> None:
        self.rounds = self.skipped = self.clients = self.samples = self.exchanges = 0
        self.losses: list[float | Tensor] = []
        """Each round's loss: a number, or a tensor still on the device (read at ``record``)."""
        self.returning: dict[str, float] = {}
        """The sums of the rounds' ``RoundMetrics.returning`` (FedU, FedEMA)."""
        self.start = time.perf_counter()

    def add(self, m: RoundMetrics) -> None:
        self.rounds += 1
        if m.skipped is not None:
            self.skipped += 1
            return
        self.losses.append(m.loss)
        self.clients += m.num_clients
        self.samples += m.num_samples
        self.exchanges += m.exchanges
        for key, value in (m.returning or {}).items():
            self.returning[key] = self.returning.get(key, 0.0) + value

    def record(self, round_done: int, lr: float) -> dict[str, Any]:
        """The metrics record of the window: ``loss`` is the mean over its rounds (absent if
        all were skipped); ``clients``, ``samples`` and ``exchanges`` are per round."""
        done = max(self.rounds - self.skipped, 1)
        rec: dict[str, Any] = {"round": round_done}
        if self.losses:
            losses = [float(v) for v in read_numbers(self.losses)]
            rec["loss"] = sum(losses) / len(losses)
        rec |= {"lr": lr, "rounds_per_sec": self.rounds / (time.perf_counter() - self.start),
                "clients": self.clients // done, "samples": self.samples // done,
                "exchanges": self.exchanges / done}
        if self.returning:  # FedU, FedEMA: per round, and the means over returning clients
            came = self.returning["returning"]
            rec["returning_clients"] = came / done
            rec |= {k: v / came for k, v in self.returning.items()
                    if k != "returning" and came}
        return rec


def resume_from_checkpoint(pt: Pretraining, run: RunDir) -> None:
    """Restore model, optimiser, rounds done and round state from ``run``'s checkpoint (none
    yet: round 0), and drop the metrics logged after it."""
    if run.checkpoint_path.is_file():
        pt.restore(run.checkpoint_path)
    if pt.rank == 0:
        run.truncate_metrics(pt.rounds_done)


def pretraining_loop(pt: Pretraining, run: RunDir, step: Callable[[], RoundMetrics],
                     train_set: Dataset, test_set: Dataset | None = None,
                     on_round: RoundCallback | None = None,
                     window: Callable[[], MetricsWindow] = MetricsWindow,
                     meta: dict[str, Any] | None = None,
                     on_log: Callable[[dict[str, Any]], None] | None = None,
                     stop: Callable[[], str | None] | None = None,
                     on_warning: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The run loop of every backend: ``step`` until ``pt`` is finished, a metrics record
    every ``train.log_every`` rounds, and the monitors of ``dcco.run.monitors`` (the collapse
    watch, privacy, k-NN and probe on ``train_set``/``test_set``, checkpoints with ``meta``).

    At a collapse warning the run does what ``train.on_collapse`` says
    (``dcco.run.collapse_response``); a run it stopped is over, and returns its summary.

    A run told to stop (``stop`` returns a reason) goes on to the end of its logging window,
    checkpoints there, notes ``{"round", "stopped"}`` and returns without a summary; resuming
    it continues as if it had never stopped. ``on_round(metrics, latest)`` is called every
    round (``latest``: the last logged loss, rate, collapse figures, k-NN); ``on_log`` with
    each record; ``on_warning`` says the collapse warning (None: a ``CollapseWarning``);
    ``window`` makes a backend's ``MetricsWindow``.

    Returns:
        The summary written to ``summary.json``; for a stopped run ``{"rounds", "stopped"}``.
    """
    if stopped_at_collapse(run.summary()):  # a run train.on_collapse ended: nothing to do
        return run.summary()
    latest: dict[str, Any] = {}
    monitors = standard_monitors(pt, run, train_set, test_set, latest, meta, on_warning)
    response = CollapseResponse.of(pt, run, monitors, on_warning)
    response.start()
    w, started, writes, stopped = window(), time.perf_counter(), pt.rank == 0, None
    bytes_per_client = message_bytes(pt)
    while not pt.finished and stopped is None:
        m = step()
        w.add(m)
        last = pt.finished
        if m.skipped is not None and writes:
            run.append_metrics({"round": m.round, "skipped": m.skipped})
        if m.round % pt.cfg.train.log_every == 0 or last:
            log_window(pt, run, m, w, monitors, latest, last, on_log,
                       {"bytes_per_client": bytes_per_client})
            w, turn = window(), response.after_log(m.round)
            if turn is not None:  # "rewind": back at an earlier round, whose hooks ran
                if turn == "stop":
                    break
                continue
            stopped = stop() if stop is not None and not last else None
        for monitor in monitors:
            monitor.round_done(m, last, stopped is not None)
        if on_round is not None:
            on_round(m, latest)
    if stopped is not None and writes:
        run.append_metrics({"round": pt.rounds_done, "stopped": stopped})
    if stopped is not None:
        return {"rounds": pt.rounds_done, "stopped": stopped}
    if not writes:
        return {"rounds": pt.rounds_done, "rank": pt.rank}
    return run_summary(pt, run, monitors, time.perf_counter() - started)


def log_window(pt: Pretraining, run: RunDir, m: RoundMetrics, w: MetricsWindow,
               monitors: list[Monitor], latest: dict[str, Any], last: bool,
               on_log: Callable[[dict[str, Any]], None] | None, extra: dict[str, Any]) -> None:
    """The metrics record of the window ``w`` that ends at round ``m``: after a check that
    the model is finite, the window's figures, ``extra`` and each monitor's fields, written
    (rank 0), kept in ``latest`` and shown to the monitors and ``on_log``."""
    pt.check_finite()
    record = w.record(m.round, m.lr) | extra
    for monitor in monitors:
        monitor.record(m, record, last)
    if pt.rank == 0:
        run.append_metrics(record)
    latest |= {k: record[k] for k in ("loss", "rounds_per_sec", *FIGURES) if k in record}
    for monitor in monitors:
        monitor.logged(m, record)
    if on_log is not None:
        on_log(record)


def run_pretraining(cfg: RunConfig, run: RunDir, train_set: Dataset,
                    test_set: Dataset | None = None, resume: bool = False,
                    on_round: RoundCallback | None = None,
                    model: DualEncoder | None = None,
                    stop: Callable[[], str | None] | None = None,
                    augment: Callable[[Tensor], Tensor] | None = None,
                    on_warning: Callable[[str], None] | None = None,
                    checked: CheckedRun | None = None) -> dict[str, Any]:
    """Pretrain in this process into a run directory (``pretraining_loop``).

    Args:
        cfg: the run config (for a resumed run, the one stored in ``run``).
        run: the run directory, created with ``RunDir.create`` or opened to resume.
        train_set: the pretraining images.
        test_set: used by the k-NN monitor; None disables it.
        resume: continue from ``run``'s checkpoint (from round 0 if none was written yet).
        on_round: see ``pretraining_loop``.
        model, augment: see ``Pretraining``.
        stop, on_warning: see ``pretraining_loop``.
        checked: ``cfg`` and ``train_set`` (and ``model``) as the caller checked them before
            creating ``run`` (``dcco.run.setup.check_run``), taken as they are; None: checked
            here.

    Returns:
        The summary written to ``summary.json`` (``pretraining_loop``'s partial record for a
        run that was told to stop).
    """
    if checked is None:
        checked = check_run(cfg, train_set, model=model, state_dir=run.client_states_path)
    pt = Pretraining(checked, augment)
    if resume:
        resume_from_checkpoint(pt, run)
    return pretraining_loop(pt, run, pt.step, train_set, test_set, on_round, stop=stop,
                            on_warning=on_warning)


def run_with_progress(cfg: RunConfig, run: RunDir, train_set: Dataset,
                      test_set: Dataset | None, resume: bool, progress: bool,
                      stop: Callable[[], str | None] | None = None,
                      model: DualEncoder | None = None,
                      augment: Callable[[Tensor], Tensor] | None = None,
                      then: RoundCallback | None = None,
                      checked: CheckedRun | None = None) -> dict[str, Any]:
    """``run_pretraining`` with a progress bar (``progress``: None on a terminal, plain lines
    in a log; False: none) and the run's loss and k-NN plots at the end; ``then`` is called
    after the bar's update every round (``pretraining_loop``'s ``on_round``); ``checked``:
    see ``run_pretraining``."""
    from dcco.run.progress import Progress
    from dcco.run.report import plot_run_curves

    bar = Progress(cfg.train.rounds, label="round", enabled=None if progress else False)

    def on_round(m: RoundMetrics, latest: dict[str, Any]) -> None:
        # The loss shown is the mean over the last logging window: the "final loss" of the
        # summary, not one round's value.
        extra = {"loss": latest["loss"]} if "loss" in latest else {}
        if "knn" in latest:
            extra["k-NN"] = f"{100 * latest['knn']:.1f}%"
        if "epsilon" in latest:
            extra["ε"] = f"{latest['epsilon']:.3g}"
        extra |= collapse_postfix(latest)
        bar.update(m.round, **extra)
        if then is not None:
            then(m, latest)

    with bar:
        summary = run_pretraining(cfg, run, train_set, test_set, resume=resume,
                                  on_round=on_round, model=model, stop=stop, augment=augment,
                                  on_warning=(lambda text: bar.note(f"warning: {text}"))
                                  if bar.enabled else None, checked=checked)
    plot_run_curves(run)
    return summary


def collapse_postfix(latest: dict[str, Any]) -> dict[str, str]:
    """The collapse figures as a progress line shows them (``dead``, ``C_ii``, ``rank``)."""
    if "eff_rank" not in latest:
        return {}
    return {"dead": f"{latest['dead_dims']:.0%}", "C_ii": f"{latest['corr_diag']:.2f}",
            "rank": f"{latest['eff_rank']:.1f}"}
