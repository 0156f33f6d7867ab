"""The public strategy's checkpoint (``dcco.flower.DCCO(checkpoint=...)``): everything a
stopped ``start`` needs to go on to the same model as an uninterrupted run, written
atomically after every round: the weights, the server optimiser's state, the rounds done,
the node sampling's random state, FedSC's cache of absent nodes, the collapse watch and the
metrics so far."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import Result

from dcco.core.statistics_cache import StatisticsCache
from dcco.run.checkpoint import atomic_write_bytes

if TYPE_CHECKING:
    from dcco.flower.strategy import DCCO

METRIC_HISTORIES = ("train_metrics_clientapp", "evaluate_metrics_clientapp",
                    "evaluate_metrics_serverapp")
"""The ``Result`` histories a strategy checkpoint keeps."""


def save_strategy(strategy: DCCO, path: Path, r: int, num_rounds: int, result: Result,
                  skipped: list[str]) -> None:
    """The run after round ``r`` into ``path``, atomically (``torch.save`` of tensors and
    plain values, read back with ``weights_only``)."""
    state = {"round": r, "num_rounds": num_rounds, "weights": strategy._weights,
             "trained": list(strategy.trained or []),
             "optimizer": (strategy._optimizer.state_dict() if strategy._optimizer
                           else None),
             "rng": _rng_state(strategy._rng), "eval_rng": _rng_state(strategy._eval_rng),
             "cache": strategy.cache.state() if strategy.cache is not None else None,
             "skipped": skipped, "watch": strategy.watch.message,
             "metrics": {name: {k: dict(v) for k, v in getattr(result, name).items()}
                         for name in METRIC_HISTORIES}}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())


def resume_strategy(strategy: DCCO, path: Path, result: Result, num_rounds: int
                    ) -> tuple[int, list[str]]:
    """Restore the run saved in ``path`` into ``strategy`` (after its ``begin``) and
    ``result``; returns the first round to run and the rounds skipped so far.

    Raises:
        ValueError: ``path`` is no checkpoint of this version's, or holds more rounds than
            ``num_rounds``.
    """
    try:
        state = torch.load(path, weights_only=True)
        done, weights = int(state["round"]), state["weights"]
    except Exception as e:  # noqa: BLE001 (any unreadable file is named)
        raise ValueError(f"{path} is not a DCCO strategy checkpoint that this version reads "
                         f"({type(e).__name__}: {e}); move it away to start afresh") from None
    if done > num_rounds:
        raise ValueError(f"{path} holds {done} rounds, more than num_rounds = {num_rounds}")
    strategy._weights = {k: v.clone() for k, v in weights.items()}
    strategy.trained = list(state["trained"]) or strategy.trained
    if state["optimizer"] is not None:
        strategy._params_of(strategy._weights)
        strategy._optimizer.load_state_dict(state["optimizer"])
    strategy._rng.setstate(_rng_tuple(state["rng"]))
    strategy._eval_rng.setstate(_rng_tuple(state["eval_rng"]))
    if state["cache"] is not None:
        strategy.cache = StatisticsCache.from_state(state["cache"])
    strategy.watch.message = state["watch"]
    for name in METRIC_HISTORIES:
        for r, values in state["metrics"][name].items():
            getattr(result, name)[int(r)] = MetricRecord(values)
    result.arrays = ArrayRecord(dict(strategy._weights))
    return done + 1, list(state["skipped"])


def _rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_tuple(state: list) -> tuple:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


__all__ = ["METRIC_HISTORIES", "resume_strategy", "save_strategy"]
