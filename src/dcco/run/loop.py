"""The run loop of every backend (``pretraining_loop``): rounds until the run is finished,
with metrics records, the collapse figures and their watch, the k-NN monitor, atomic
checkpoints and the summary; ``run_pretraining`` and ``run_with_progress`` run it in this
process. ``Pretraining`` holds the state (``dcco.run.pretraining``); data comes in, metrics go
out, the CLI shows and stores them."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

from torch import Tensor

from dcco.callers import caller_stacklevel
from dcco.config import EvalConfig, RunConfig
from dcco.core.client_state import kept_by_clients
from dcco.core.collapse import (
    FIGURES,
    CollapseWarning,
    CollapseWatch,
    watch_start,
)
from dcco.data.paired import Dataset
from dcco.evaluate import knn_accuracy, knn_description, labelled_subset, linear_probe
from dcco.models import DualEncoder
from dcco.run.checkpoint import checkpoint_state, load_checkpoint, save_checkpoint
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
        pt.rounds_done = load_checkpoint(run.checkpoint_path, pt.model, pt.optimizer)
        pt.load_round_state(checkpoint_state(run.checkpoint_path))
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
    """The run loop of every backend: rounds until ``pt`` is finished, with metrics records,
    the collapse figures and their watch, the k-NN monitor, atomic checkpoints and the
    summary.

    Every metrics record carries the collapse figures (``dcco.core.collapse``): of the round's
    S_A for a method that shares statistics; for one that shares none, of a fixed probe
    batch at the k-NN monitor's rounds (``train.knn_every``) and the last. The first sign of
    collapse after the warm-up (``CollapseWatch``, from ``collapse_watch_start``) is noted in
    the metrics (``{"round": r, "warning": "collapse", "message": ...}``) and in the summary
    (``collapse_warning``), and said once: to ``on_warning``, or as a ``CollapseWarning``.

    A run told to stop (``stop`` returns a reason) goes on to the end of its logging window,
    so that its records are those an uninterrupted run writes, then checkpoints there, notes
    ``{"round": r, "stopped": reason}`` in the metrics and returns without a summary: the run
    is unfinished, and resuming it continues from that round as if it had never stopped.

    Args:
        pt: the training state (resumed or fresh).
        run: its run directory.
        step: runs the next round and applies it (``Pretraining.step``, or the Flower
            federation's), returning its metrics.
        train_set, test_set: the k-NN monitor's bank and queries; no test set, no monitor.
        on_round: called after every round with its metrics and the latest logged values
            (``loss``: the mean over the last logging window, as ``final_loss`` is;
            ``rounds_per_sec``; ``knn`` once measured), e.g. to drive a progress bar.
        window: makes a fresh ``MetricsWindow`` (a backend's subclass).
        meta: stored with each checkpoint (the method is always stored).
        on_log: called with every metrics record written.
        stop: asked after each logged round whether to stop (a reason, e.g. "time budget"),
            or None to go on.
        on_warning: shows the collapse warning (a progress bar's note); None: Python's
            ``warnings.warn``.

    Returns:
        The summary written to ``summary.json``; for a stopped run ``{"rounds": r,
        "stopped": reason}``, and no summary is written.
    """
    cfg = pt.cfg
    t_cfg = cfg.train
    meta = {"method": t_cfg.method} | pt.inputs_record | (meta or {})
    w, latest, started = window(), {}, time.perf_counter()
    model_bytes = sum(p.numel() * p.element_size() for _, p in pt.params)
    # a stateful method's clients keep (FedU, FedEMA) or restart (MoCo) their own target
    # network: none is sent (nor by dcco's Flower app, whose run reports the bytes it
    # measures)
    kept = kept_by_clients(pt.model, pt.method)
    state_bytes = sum(v.numel() * v.element_size() for n, v in pt.model.state_dict().items()
                      if n not in kept)
    d = pt.model.projection_dim
    message_bytes = pt.algorithm.message_bytes(d, d, model_bytes,
                                               state_bytes=state_bytes - model_bytes)
    writes = pt.rank == 0  # with several ranks, rank 0 alone writes (all hold one model)
    own_cco = pt.method.uses_eps and pt.method.federated and pt.method.stats is None
    watch = CollapseWatch(watch_start(cfg.optim.warmup_rounds), eps=pt.method.variance_eps(),
                          client_samples=(int(pt.partition.sizes.max()) if own_cco else None))
    stopped: str | None = None
    while not pt.finished and stopped is None:
        m = step()
        w.add(m)
        last = pt.finished
        if m.skipped is not None and writes:
            run.append_metrics({"round": m.round, "skipped": m.skipped})
        if m.round % t_cfg.log_every == 0 or last:
            pt.check_finite()
            record = w.record(m.round, m.lr) | {"bytes_per_client": message_bytes}
            if writes:
                record |= pt.collapse(probe=last or bool(
                    t_cfg.knn_every and m.round % t_cfg.knn_every == 0))
            if pt.privacy is not None:
                record["epsilon"] = latest["epsilon"] = pt.privacy.epsilon(m.round)
            if writes:
                run.append_metrics(record)
            latest |= {k: record[k] for k in ("loss", "rounds_per_sec", *FIGURES)
                       if k in record}
            warning = watch.check(m.round, {k: record[k] for k in FIGURES if k in record}, d)
            if warning is not None and writes:
                run.append_metrics({"round": m.round, "warning": "collapse",
                                    "message": warning})
                if on_warning is not None:
                    on_warning(warning)
                else:
                    warnings.warn(warning, CollapseWarning, stacklevel=caller_stacklevel())
            if on_log is not None:
                on_log(record)
            w = window()
            if stop is not None and not last:
                stopped = stop()
        if writes and test_set is not None and (
                (t_cfg.knn_every and m.round % t_cfg.knn_every == 0) or last):
            latest["knn"] = monitor_knn(pt, train_set, test_set)
            run.append_metrics({"round": m.round, "knn": latest["knn"],
                                "knn_features": cfg.eval.knn_features})
        if writes and test_set is not None and t_cfg.probe_every and \
                m.round % t_cfg.probe_every == 0:
            latest["probe"] = monitor_probe(pt, train_set, test_set)
            run.append_metrics({"round": m.round, "probe": latest["probe"],
                                "probe_labels": cfg.eval.labels})
        if m.round % t_cfg.checkpoint_every == 0 or last or stopped is not None:
            pt.check_finite()
            if writes:
                save_checkpoint(run.checkpoint_path, pt.model, pt.optimizer, m.round,
                                meta=meta, state=pt.round_state())
        if on_round is not None:
            on_round(m, latest)
    if stopped is not None:
        if writes:
            run.append_metrics({"round": pt.rounds_done, "stopped": stopped})
        return {"rounds": pt.rounds_done, "stopped": stopped}
    if not writes:
        return {"rounds": pt.rounds_done, "rank": pt.rank}
    history = run.metrics()
    losses = [r["loss"] for r in history if "loss" in r]
    knn = [r["knn"] for r in history if "knn" in r]
    skipped = sum(1 for r in history if isinstance(r.get("skipped"), str))
    warned = [r["message"] for r in history if r.get("warning") == "collapse"]
    figures = next((r for r in reversed(history) if "eff_rank" in r), {})
    return run.update_summary(
        method=t_cfg.method, dataset=cfg.data.dataset, rounds=pt.rounds_done,
        alpha=cfg.data.alpha, samples_per_client=cfg.data.samples_per_client,
        clients_per_round=t_cfg.clients_per_round,
        final_loss=losses[-1] if losses else None, knn=knn[-1] if knn else None,
        **({"knn_features": cfg.eval.knn_features,
            "knn_monitor": knn_description(cfg.eval, *_knn_sizes(cfg.eval, train_set, test_set))}
           if knn else {}),
        **pt.inputs_record,
        exchanges_per_round=pt.algorithm.exchanges(has_previous=True),
        bytes_per_client_round=message_bytes,
        pretrain_seconds_this_session=time.perf_counter() - started,
        **({"skipped_rounds": skipped} if skipped else {}),
        **({"privacy": pt.privacy.summary(pt.rounds_done)} if pt.privacy is not None else {}),
        **({"collapse": {k: figures[k] for k in ("round", *FIGURES)}} if figures else {}),
        **({"collapse_warning": warned[0]} if warned else {}),
    )


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


def monitor_knn(pt: Pretraining, train_set: Dataset, test_set: Dataset) -> float:
    """Weighted k-NN top-1 accuracy of the current encoder's first tower (the fast
    pretraining monitor)."""
    e = pt.cfg.eval
    return knn_accuracy(pt.model, train_set, test_set, k=e.knn_k, temperature=e.knn_temperature,
                        bank_size=e.knn_bank, num_queries=e.knn_queries, seed=pt.cfg.train.seed,
                        device=pt.device, features=e.knn_features)


def monitor_probe(pt: Pretraining, train_set: Dataset, test_set: Dataset) -> float:
    """The run's linear probe on the model as it is (``train.probe_every``): its
    ``eval.labels`` labelled samples of the seed, its probe settings; the model is left as it
    was and no training randomness is drawn."""
    e, seed = pt.cfg.eval, pt.cfg.train.seed
    ids = labelled_subset(train_set.labels, e.labels, train_set.num_classes, seed)
    return linear_probe(pt.model, train_set, test_set, ids, e, seed, pt.device).accuracy


def _knn_sizes(e: EvalConfig, train_set: Dataset, test_set: Dataset | None
               ) -> tuple[int, int]:
    """The bank and query counts the monitor used (its sizes, capped by the splits)."""
    n_test = len(test_set) if test_set is not None else 0
    return (min(e.knn_bank or len(train_set), len(train_set)),
            min(e.knn_queries or n_test, n_test))
