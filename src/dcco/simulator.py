"""Execution backends for one round: ``reference`` (client by client) or ``batched``.

Both return the round's pseudo-gradient, the negated sample-weighted average of the clients'
updates: with one local SGD step of learning rate η, client k's update is −η∇L_k, and the
server's optimiser consumes −Σ_k (N_k/N)·update_k = η Σ_k (N_k/N) ∇L_k (FedOpt).

``batched`` runs all of a round's clients in one forward/backward over the concatenated batch,
with per-client segments in the loss. This is exact for one local step because the encoders use
group norm and weight standardisation, which have no cross-sample terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from dcco.client import client_statistics, client_update, trainable_parameters
from dcco.methods.base import Method, Segments
from dcco.server import aggregate_updates
from dcco.stats import encoding_stats, merge

Backend = Literal["batched", "reference"]


@dataclass(frozen=True)
class RoundResult:
    """The outcome of one round before the server optimiser.

    Attributes:
        pseudo_gradient: by parameter name, −Σ_k (N_k/N)·Δ_k (the gradient, in centralized mode).
        loss: Σ_k (N_k/N)·loss_k, the clients' losses before their step.
        num_clients: K.
        num_samples: N.
    """

    pseudo_gradient: dict[str, Tensor]
    loss: float
    num_clients: int
    num_samples: int


def run_round(model: nn.Module, method: Method, x1: Tensor, x2: Tensor, segments: Segments,
              backend: Backend = "batched", local_lr: float = 1.0) -> RoundResult:
    """One round (or, for centralized methods, one step) on a round's views.

    Args:
        model: the current global dual encoder.
        method: what clients optimise.
        x1, x2: both views of every sample of the round, (N, C, H, W), grouped by client in the
            order of ``segments`` (client 0's samples first).
        segments: the client of each sample.
        backend: ``"batched"`` or ``"reference"``.
        local_lr: client SGD learning rate η (paper: 1.0).
    """
    small = int(segments.counts.min())
    if small < method.min_client_samples:
        raise ValueError(
            f"{method.name} needs at least {method.min_client_samples} samples per client, but a "
            f"client of this round has {small}; use a partition with more samples per client"
        )
    if backend == "batched":
        return _batched_round(model, method, x1, x2, segments, local_lr)
    if backend == "reference":
        return _reference_round(model, method, x1, x2, segments, local_lr)
    raise ValueError(f"unknown backend {backend!r}; choose 'batched' or 'reference'")


def _batched_round(model: nn.Module, method: Method, x1: Tensor, x2: Tensor,
                   segments: Segments, local_lr: float) -> RoundResult:
    named = trainable_parameters(model)
    f, g = model(x1, x2)
    shared = encoding_stats(f.detach(), g.detach()).moments() if method.needs_statistics else None
    loss = method.round_loss(f, g, segments.to(f.device), shared)
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    pseudo = {
        name: (torch.zeros_like(p) if gr is None else local_lr * gr)
        for (name, p), gr in zip(named, grads)
    }
    return RoundResult(pseudo, float(loss.detach()), segments.num_clients, segments.num_samples)


def _reference_round(model: nn.Module, method: Method, x1: Tensor, x2: Tensor,
                     segments: Segments, local_lr: float) -> RoundResult:
    sizes = segments.counts.tolist()
    views = list(zip(torch.split(x1, sizes), torch.split(x2, sizes)))
    shared = None
    if method.needs_statistics:  # exchange 1: statistics up, their aggregate back down
        shared = merge([client_statistics(model, a, b) for a, b in views]).moments()
    updates = [client_update(model, method, a, b, shared, local_lr) for a, b in views]
    total = sum(u.num_samples for u in updates)
    # exchange 2: the server's sample-weighted average of the updates
    pseudo = aggregate_updates(updates, dict(trainable_parameters(model)))
    loss = sum(u.num_samples / total * u.loss for u in updates)
    return RoundResult(pseudo, float(loss), len(updates), total)
