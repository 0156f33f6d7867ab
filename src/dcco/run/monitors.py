"""The run loop's jobs beside training, one small object each (``Monitor``): the collapse
figures and their watch, privacy accounting, the k-NN and probe monitors, and checkpoints.
``pretraining_loop`` (``dcco.run.loop``) calls each one's hooks in list order; the summary
(``run_summary``) takes the run's own fields and each monitor's part."""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dcco.callers import caller_stacklevel
from dcco.config import EvalConfig
from dcco.core.client_state import kept_by_clients
from dcco.core.collapse import FIGURES, CollapseWarning, CollapseWatch, watch_start
from dcco.data.paired import Dataset
from dcco.evaluate import knn_accuracy, knn_description, labelled_subset, linear_probe
from dcco.models.layers import Projector
from dcco.run.checkpoint import save_checkpoint
from dcco.run.pretraining import Pretraining, RoundMetrics
from dcco.run.rundir import COLLAPSE_EVENT, RunDir

History = list[dict[str, Any]]


class Monitor:
    """One of the loop's jobs. Each hook does nothing unless a monitor overrides it.

    ``record`` adds a monitor's fields to a metrics record before it is written. ``logged``
    runs after the record is written. ``round_done`` runs after every round, logged or not.
    ``summary`` gives the monitor's part of summary.json from the run's metrics history. A
    monitor that writes checks ``writes`` itself: with several ranks only rank 0 writes."""

    def record(self, m: RoundMetrics, record: dict[str, Any], last: bool) -> None:
        """Add fields to the metrics record of a logged round (``last``: the run's last)."""

    def logged(self, m: RoundMetrics, record: dict[str, Any]) -> None:
        """The record of a logged round was written."""

    def round_done(self, m: RoundMetrics, last: bool, stopping: bool) -> None:
        """Round ``m.round`` ended (``stopping``: the run was told to stop here)."""

    def summary(self, history: History) -> dict[str, Any]:
        """This monitor's entries in summary.json."""
        return {}


def due(every: int, round_done: int) -> bool:
    """Whether a job run every ``every`` rounds (0: never) is due at ``round_done``."""
    return bool(every) and round_done % every == 0


class Collapse(Monitor):
    """The collapse figures in every metrics record and the watch over them.

    For a method that shares statistics the figures are those of the round's S_A. For one
    that shares none, they come from a fixed probe batch, at the k-NN monitor's rounds
    (``train.knn_every``) and the last. The first sign of collapse after the warm-up
    (``CollapseWatch``) is noted in the metrics (``{"round", "warning": "collapse",
    "message"}``) and in the summary (``collapse_warning``). It is said once: to ``say``, or
    as a ``CollapseWarning`` at the caller's line. What the run then does
    (``train.on_collapse``) is ``dcco.run.collapse_response``'s: its events are in the
    summary too (``collapse_events``, and ``stopped_at_collapse`` for a run it ended)."""

    def __init__(self, pt: Pretraining, run: RunDir, writes: bool,
                 say: Callable[[str], None] | None = None) -> None:
        self.pt, self.run, self.writes, self.say = pt, run, writes, say
        self.watch = self._watch()
        self._warned: tuple[int, str] | None = None

    def _watch(self) -> CollapseWatch:
        pt = self.pt
        own_cco = pt.method.uses_eps and pt.method.federated and pt.method.stats is None
        return CollapseWatch(
            watch_start(pt.cfg.optim.warmup_rounds), eps=pt.method.variance_eps(),
            client_samples=int(pt.partition.sizes.max()) if own_cco else None,
            server=(pt.cfg.optim.optimizer, pt.cfg.optim.lr),
            has_projector=isinstance(pt.model.projector, Projector),
            offer_rewind=pt.cfg.train.on_collapse != "rewind")

    def warned_at(self, round_done: int) -> str | None:
        """The warning given at this round's reading, or None."""
        if self._warned is not None and self._warned[0] == round_done:
            return self._warned[1]
        return None

    def rearm(self) -> None:
        """A fresh watch, which warns again (after a rewind)."""
        self.watch, self._warned = self._watch(), None

    def record(self, m: RoundMetrics, record: dict[str, Any], last: bool) -> None:
        if self.writes:
            record |= self.pt.collapse(probe=last or due(self.pt.cfg.train.knn_every, m.round))

    def logged(self, m: RoundMetrics, record: dict[str, Any]) -> None:
        figures = {k: record[k] for k in FIGURES if k in record}
        warning = self.watch.check(m.round, figures, self.pt.model.projection_dim)
        if warning is None:
            return
        self._warned = (m.round, warning)
        if not self.writes:
            return
        self.run.append_metrics({"round": m.round, "warning": "collapse", "message": warning})
        if self.say is not None:
            self.say(warning)
        else:
            warnings.warn(warning, CollapseWarning, stacklevel=caller_stacklevel())

    def summary(self, history: History) -> dict[str, Any]:
        figures = next((r for r in reversed(history) if "eff_rank" in r), {})
        events = [r for r in history if COLLAPSE_EVENT in r]
        # a rewind or a stop drops the warning's own record with the rounds after its
        # checkpoint; its event keeps the message
        warned = [r["message"] for r in history
                  if r.get("warning") == "collapse" or COLLAPSE_EVENT in r]
        ended = [r for r in events if r[COLLAPSE_EVENT] == "stop"]
        return ({"collapse": {k: figures[k] for k in ("round", *FIGURES) if k in figures}}
                if figures else {}) \
            | ({"collapse_warning": warned[0]} if warned else {}) \
            | ({"collapse_events": [r["line"] for r in events]} if events else {}) \
            | ({"stopped_at_collapse": {"round": ended[-1]["round"],
                                        "kept_round": ended[-1]["to_round"]}}
               if ended else {})


class PrivacyBudget(Monitor):
    """The privacy spent so far (ε) in every metrics record and the accounting in the
    summary; ``latest`` gets ε for the progress line."""

    def __init__(self, pt: Pretraining, latest: dict[str, Any]) -> None:
        self.pt, self.latest = pt, latest

    def record(self, m: RoundMetrics, record: dict[str, Any], last: bool) -> None:
        record["epsilon"] = self.latest["epsilon"] = self.pt.privacy.epsilon(m.round)

    def summary(self, history: History) -> dict[str, Any]:
        return {"privacy": self.pt.privacy.summary(self.pt.rounds_done)}


class OnTestSet(Monitor):
    """A monitor that measures the encoder on the run's splits (``train_set`` as the bank or
    the labelled pool, ``test_set`` as the queries) and writes its values to ``latest``."""

    def __init__(self, pt: Pretraining, run: RunDir, train_set: Dataset, test_set: Dataset,
                 latest: dict[str, Any]) -> None:
        self.pt, self.run, self.train_set, self.test_set = pt, run, train_set, test_set
        self.latest = latest


class KnnMonitor(OnTestSet):
    """The k-NN monitor every ``train.knn_every`` rounds and at the last (``monitor_knn``):
    a ``{"round", "knn", "knn_features"}`` record, ``latest["knn"]``, and the last value in
    the summary with the monitor's description."""

    def round_done(self, m: RoundMetrics, last: bool, stopping: bool) -> None:
        if last or due(self.pt.cfg.train.knn_every, m.round):
            self.latest["knn"] = monitor_knn(self.pt, self.train_set, self.test_set)
            self.run.append_metrics({"round": m.round, "knn": self.latest["knn"],
                                     "knn_features": self.pt.cfg.eval.knn_features})

    def summary(self, history: History) -> dict[str, Any]:
        knn = [r["knn"] for r in history if "knn" in r]
        e = self.pt.cfg.eval
        sizes = _knn_sizes(e, self.train_set, self.test_set)
        return {"knn": knn[-1], "knn_features": e.knn_features,
                "knn_monitor": knn_description(e, *sizes)} if knn else {}


class ProbeMonitor(OnTestSet):
    """The run's linear probe every ``train.probe_every`` rounds (``monitor_probe``): a
    ``{"round", "probe", "probe_labels"}`` record and ``latest["probe"]``."""

    def round_done(self, m: RoundMetrics, last: bool, stopping: bool) -> None:
        if due(self.pt.cfg.train.probe_every, m.round):
            self.latest["probe"] = monitor_probe(self.pt, self.train_set, self.test_set)
            self.run.append_metrics({"round": m.round, "probe": self.latest["probe"],
                                     "probe_labels": self.pt.cfg.eval.labels})


class Checkpoints(Monitor):
    """An atomic checkpoint every ``train.checkpoint_every`` rounds, at the last and where
    the run stops, after a check that the model is finite; ``meta`` is stored with it.
    Under ``train.on_collapse`` = "stop" or "rewind" the checkpoint before it is kept as
    ``RunDir.earlier_checkpoint_path``."""

    def __init__(self, pt: Pretraining, run: RunDir, writes: bool, meta: dict[str, Any]) -> None:
        self.pt, self.run, self.writes, self.meta = pt, run, writes, meta
        self.keeps_earlier = pt.cfg.train.on_collapse != "warn"

    def round_done(self, m: RoundMetrics, last: bool, stopping: bool) -> None:
        if last or stopping or due(self.pt.cfg.train.checkpoint_every, m.round):
            self.pt.check_finite()
            if self.writes and self.keeps_earlier and self.run.checkpoint_path.is_file():
                keep_as(self.run.checkpoint_path, self.run.earlier_checkpoint_path)
            if self.writes:
                save_checkpoint(self.run.checkpoint_path, self.pt.model, self.pt.optimizer,
                                m.round, meta=self.meta, state=self.pt.round_state())


def keep_as(path: Path, kept: Path) -> None:
    """Make ``kept`` a copy of the file ``path`` atomically (a hard link where the file
    system has them), leaving ``path`` in place: an interruption leaves both files whole."""
    temporary = kept.with_name(kept.name + ".tmp")
    temporary.unlink(missing_ok=True)
    try:
        os.link(path, temporary)
    except OSError:
        shutil.copyfile(path, temporary)
    os.replace(temporary, kept)


def standard_monitors(pt: Pretraining, run: RunDir, train_set: Dataset,
                      test_set: Dataset | None, latest: dict[str, Any],
                      meta: dict[str, Any] | None = None,
                      say: Callable[[str], None] | None = None) -> list[Monitor]:
    """The loop's monitors for ``pt``, in the order they run: the collapse watch, privacy
    (when on), k-NN and probe (with a test set, on the writing rank), checkpoints."""
    writes = pt.rank == 0
    monitors: list[Monitor] = [Collapse(pt, run, writes, say)]
    if pt.privacy is not None:
        monitors.append(PrivacyBudget(pt, latest))
    if writes and test_set is not None:
        monitors += [KnnMonitor(pt, run, train_set, test_set, latest),
                     ProbeMonitor(pt, run, train_set, test_set, latest)]
    meta = {"method": pt.cfg.train.method} | pt.inputs_record | (meta or {})
    return [*monitors, Checkpoints(pt, run, writes, meta)]


def message_bytes(pt: Pretraining) -> int:
    """The bytes a client receives and sends in a round. A stateful method's clients keep
    (FedU, FedEMA) or restart (MoCo) their own target network, so none is sent; dcco's
    Flower app reports the bytes it measures as well."""
    model_bytes = sum(p.numel() * p.element_size() for _, p in pt.params)
    kept = kept_by_clients(pt.model, pt.method)
    state_bytes = sum(v.numel() * v.element_size() for n, v in pt.model.state_dict().items()
                      if n not in kept)
    d = pt.model.projection_dim
    return pt.algorithm.message_bytes(d, d, model_bytes, state_bytes=state_bytes - model_bytes)


def run_summary(pt: Pretraining, run: RunDir, monitors: list[Monitor], seconds: float
                ) -> dict[str, Any]:
    """Write and return summary.json of a finished run: its settings, final loss, exchanges
    and bytes, the time this session spent, skipped rounds, and each monitor's part."""
    cfg, history = pt.cfg, run.metrics()
    losses = [r["loss"] for r in history if "loss" in r]
    skipped = sum(1 for r in history if isinstance(r.get("skipped"), str))
    entries = dict(
        method=cfg.train.method, dataset=cfg.data.dataset, rounds=pt.rounds_done,
        alpha=cfg.data.alpha, samples_per_client=cfg.data.samples_per_client,
        clients_per_round=cfg.train.clients_per_round,
        final_loss=losses[-1] if losses else None, knn=None, **pt.inputs_record,
        exchanges_per_round=pt.algorithm.exchanges(has_previous=True),
        bytes_per_client_round=message_bytes(pt), pretrain_seconds_this_session=seconds,
        **({"skipped_rounds": skipped} if skipped else {}))
    for monitor in monitors:
        entries |= monitor.summary(history)
    return run.update_summary(**entries)


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


__all__ = ["Checkpoints", "Collapse", "KnnMonitor", "Monitor", "OnTestSet", "PrivacyBudget", "ProbeMonitor",
           "message_bytes", "monitor_knn", "monitor_probe", "run_summary", "standard_monitors"]
