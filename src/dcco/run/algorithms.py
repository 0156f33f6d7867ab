"""The round's ``Algorithm`` from a run's config: the method and its round settings, and those
that change from round to round."""

from __future__ import annotations

from dcco.config import RunConfig
from dcco.core.algorithm import Algorithm
from dcco.core.client import LocalSGD
from dcco.core.optim import scheduled_lr
from dcco.methods.registry import build_method


def algorithm_of(cfg: RunConfig, round_index: int | None = None) -> Algorithm:
    """The run's method with its round settings (``train.local_*``, ``train.staleness``, and
    the update clipping of ``privacy``); with ``round_index``, the settings that change from
    round to round too (``train.own_weight = "fedsc"``: ``fedsc_alpha``;
    ``train.local_lr_schedule = "cosine"``: the server's schedule, ``scheduled_lr``, without
    warm-up, as FedSC's CosineAnnealingLR with T_max = the rounds)."""
    t = cfg.train
    clip = cfg.privacy.update_clip if cfg.privacy.enabled else None
    alpha = (fedsc_alpha(round_index, t.rounds)
             if t.own_weight == "fedsc" and round_index is not None else None)
    local_lr = (t.local_lr if round_index is None else
                scheduled_lr(round_index, t.rounds, t.local_lr, schedule=t.local_lr_schedule))
    return Algorithm(build_method(t.method, cfg.loss), local_lr, t.local_steps,
                     t.local_batch, t.staleness, t.stale_after, clip, t.pseudo_gradient,
                     t.local_statistics, t.stale_statistics, t.aggregate_decay,
                     own_alpha=alpha, local_optimizer=t.local_optimizer,
                     client_weighting=t.client_weighting,
                     local_sgd=LocalSGD(t.local_momentum, t.local_weight_decay, t.local_grad_clip),
                     aggregation=t.aggregation)


def fedsc_alpha(round_index: int, rounds: int, first: float = 1.0, last: float = 0.2) -> float:
    """FedSC's α at a round (0-based): linear from ``first`` to ``last`` over the run."""
    if rounds <= 1:
        return first
    return first + (last - first) * round_index / (rounds - 1)


__all__ = ["algorithm_of", "fedsc_alpha"]
