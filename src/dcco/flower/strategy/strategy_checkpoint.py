"""The public strategy's checkpoint (``DCCOStrategy(checkpoint=...)``): everything a stopped
``start`` needs to go on to the same model as an uninterrupted run, written atomically after
every round: the weights, the server optimiser's state, the rounds done, the node sampling's
random state, FedSC's cache of absent nodes, the collapse watch and the metrics so far."""

from __future__ import annotations

import io
from pathlib import Path

import torch
from flwr.app import MetricRecord
from flwr.serverapp.strategy import Result

from dcco.core.collapse import CollapseWatch
from dcco.core.statistics_cache import StatisticsCache
from dcco.flower.server_model import ServerModel
from dcco.flower.strategy.node_sampling import NodeSampler
from dcco.run.checkpoint import atomic_write_bytes

METRIC_HISTORIES = ("train_metrics_clientapp", "evaluate_metrics_clientapp",
                    "evaluate_metrics_serverapp")
"""The ``Result`` histories a strategy checkpoint keeps."""


def save_strategy(path: Path, r: int, num_rounds: int, result: Result, skipped: list[str],
                  model: ServerModel, sampler: NodeSampler, cache: StatisticsCache | None,
                  watch: CollapseWatch) -> None:
    """The run after round ``r`` into ``path``, atomically (``torch.save`` of tensors and
    plain values, read back with ``weights_only``)."""
    state = {"round": r, "num_rounds": num_rounds, **model.state(), **sampler.state(),
             "cache": cache.state() if cache is not None else None,
             "skipped": skipped, "watch": watch.message,
             "metrics": {name: {k: dict(v) for k, v in getattr(result, name).items()}
                         for name in METRIC_HISTORIES}}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())


def resume_strategy(path: Path, result: Result, num_rounds: int, model: ServerModel,
                    sampler: NodeSampler, watch: CollapseWatch
                    ) -> tuple[int, list[str], StatisticsCache | None]:
    """Restore the run saved in ``path`` into ``model``, ``sampler``, ``watch`` (after the
    run's ``begin``) and ``result``; returns the first round to run, the rounds skipped so
    far and FedSC's cache (None if the run keeps none).

    Raises:
        ValueError: ``path`` is no checkpoint of this version's, or holds more rounds than
            ``num_rounds``.
    """
    try:
        state = torch.load(path, weights_only=True)
        done = int(state["round"])
        if not isinstance(state["weights"], dict):
            raise TypeError("its weights are no dict of arrays")
    except Exception as e:  # noqa: BLE001 (any unreadable file is named)
        raise ValueError(f"{path} is not a DCCO strategy checkpoint that this version reads "
                         f"({type(e).__name__}: {e}); move it away to start afresh") from None
    if done > num_rounds:
        raise ValueError(f"{path} holds {done} rounds, more than num_rounds = {num_rounds}")
    model.load(state)
    sampler.load(state)
    watch.message = state["watch"]
    for name in METRIC_HISTORIES:
        for r, values in state["metrics"][name].items():
            getattr(result, name)[int(r)] = MetricRecord(values)
    result.arrays = model.arrays()
    cache = (StatisticsCache.from_state(state["cache"]) if state["cache"] is not None
             else None)
    return done + 1, list(state["skipped"]), cache


__all__ = ["METRIC_HISTORIES", "resume_strategy", "save_strategy"]
