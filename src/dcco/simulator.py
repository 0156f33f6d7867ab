"""Execution backends for one round on one machine: ``reference`` (client by client) or
``batched``.

Both carry out ``Algorithm.run_round``'s two steps and return the round's pseudo-gradient,
the negated sample-weighted average of the clients' updates: with one local SGD step of
learning rate η, client k's update is −η∇L_k, and the server's optimiser consumes
−Σ_k (N_k/N)·update_k = η Σ_k (N_k/N) ∇L_k (FedOpt).

``batched`` runs all of a round's clients in one forward/backward over the concatenated batch,
with per-client segments in the loss (the statistics come from the same forward). This is exact for one local step on all of a client's
samples because the encoders use group norm and weight standardisation, which have no
cross-sample terms. For several local steps (or minibatches) no batched form exists here, and
the batched executor runs the clients' updates one by one, as ``reference`` does; with batch
norm (``model.norm = "bn"``), which normalises over a forward's samples, a round of several
clients runs entirely as ``reference`` (also under ``dcco.distributed``, which builds the
executors itself).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch
from torch import Tensor, nn

from dcco.algorithm import Absent, Algorithm, RoundResult, Updates
from dcco.client import client_statistics, trainable_parameters
from dcco.methods.base import Method, Segments
from dcco.privacy import RoundNoise
from dcco.server import pooled_update
from dcco.stats import EncodingStats, Moments, StatsSpec, encoding_stats, merge

Backend = Literal["batched", "reference"]

__all__ = ["Backend", "BatchedExecutor", "ReferenceExecutor", "RoundResult", "run_round"]


class ReferenceExecutor:
    """Each client on its own, as a device would run it: its statistics, then its local steps.

    Args:
        model: the current global dual encoder.
        x1, x2: both views of every sample of the round, (N, C, H, W), grouped by client in
            the order of ``segments``.
        segments: the client of each sample.
    """

    def __init__(self, model: nn.Module, x1: Tensor, x2: Tensor, segments: Segments) -> None:
        self.model = model
        self.x1, self.x2, self.segments = x1, x2, segments

    @property
    def views(self) -> list[tuple[Tensor, Tensor]]:
        """Each client's two views (split on use: the batched path never needs them)."""
        sizes = self.segments.counts.tolist()
        return list(zip(torch.split(self.x1, sizes), torch.split(self.x2, sizes), strict=True))

    def statistics(self, spec: StatsSpec) -> EncodingStats:
        return merge(self.each_statistics(spec))

    def each_statistics(self, spec: StatsSpec) -> list[EncodingStats]:
        """Exchange 1, client by client: each client's statistics, unmerged (for the
        server's cache of absent clients, ``dcco.statistics_cache``)."""
        return [client_statistics(self.model, a, b, spec) for a, b in self.views]

    def updates(self, algorithm: Algorithm, shared: Moments | None,
                with_stats: StatsSpec | None) -> Updates:
        # client by client, also when the batched executor falls back here
        fresh = (ReferenceExecutor.statistics(self, with_stats) if with_stats is not None
                 else None)
        updates = [algorithm.client_update(self.model, a, b, shared) for a, b in self.views]
        weighed = (updates if algorithm.client_weighting == "samples"
                   else [replace(u, num_samples=1) for u in updates])  # 1/K each
        pooled = pooled_update(weighed, dict(trainable_parameters(self.model)))
        pseudo = {k: -v for k, v in pooled.delta.items()}
        return Updates(pseudo, pooled.loss, len(updates), self.segments.num_samples, fresh)


class BatchedExecutor(ReferenceExecutor):
    """All of a round's clients in one forward (statistics) and one forward/backward
    (updates), exact where ``Algorithm.batched_exact``; otherwise the updates run client by
    client (``ReferenceExecutor``)."""

    def __init__(self, model: nn.Module, x1: Tensor, x2: Tensor, segments: Segments) -> None:
        super().__init__(model, x1, x2, segments)
        self._encodings: tuple[Tensor, Tensor] | None = None
        # batch norm couples a forward's samples: several clients run client by client
        self._per_client = getattr(model, "batch_norm", False) and segments.num_clients > 1

    def statistics(self, spec: StatsSpec) -> EncodingStats:
        if self._per_client:
            return super().statistics(spec)
        # one forward serves both steps: the statistics from its detached encodings, the
        # update (one local step, at the same model) from its graph
        self._encodings = self.model(self.x1, self.x2)
        f, g = self._encodings
        return encoding_stats(f.detach(), g.detach(), spec)

    def each_statistics(self, spec: StatsSpec) -> list[EncodingStats]:
        if self._per_client:
            return super().each_statistics(spec)
        self._encodings = self.model(self.x1, self.x2)
        sizes = self.segments.counts.tolist()
        f, g = (t.detach() for t in self._encodings)
        return [encoding_stats(a, b, spec)
                for a, b in zip(f.split(sizes), g.split(sizes), strict=True)]

    def updates(self, algorithm: Algorithm, shared: Moments | None,
                with_stats: StatsSpec | None) -> Updates:
        encodings, self._encodings = self._encodings, None
        counts = self.segments.counts
        if self._per_client or not algorithm.batched_exact(int(counts.min()), int(counts.max())):
            return super().updates(algorithm, shared, with_stats)
        named = trainable_parameters(self.model)
        f, g = encodings if encodings is not None else self.model(self.x1, self.x2)
        fresh = encoding_stats(f.detach(), g.detach(), with_stats) if with_stats else None
        loss = algorithm.method.round_loss(f, g, self.segments.to(f.device), shared)
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        pseudo = {
            name: (torch.zeros_like(p) if gr is None else algorithm.local_lr * gr)
            for (name, p), gr in zip(named, grads)
        }
        # the loss stays on the device: reading it here would wait for the GPU every round
        return Updates(pseudo, loss.detach(), self.segments.num_clients,
                       self.segments.num_samples, fresh)


EXECUTORS = {"batched": BatchedExecutor, "reference": ReferenceExecutor}


def run_round(model: nn.Module, method: Method | Algorithm, x1: Tensor, x2: Tensor,
              segments: Segments, backend: Backend = "batched", local_lr: float = 1.0,
              previous: Moments | None = None, noise: RoundNoise | None = None,
              absent: Absent | None = None) -> RoundResult:
    """One round (or, for centralized methods, one step) on a round's views.

    Args:
        model: the current global dual encoder.
        method: what clients optimise: an ``Algorithm``, or a method for the paper's round
            (one local step of ``local_lr``, fresh statistics).
        x1, x2: both views of every sample of the round, (N, C, H, W), grouped by client in the
            order of ``segments`` (client 0's samples first).
        segments: the client of each sample.
        backend: ``"batched"`` or ``"reference"``.
        local_lr: client SGD learning rate η (paper: 1.0) when ``method`` is a method.
        previous: the previous round's aggregate (stale statistics), or None.
        absent: merges the round's per-client statistics with the server's cache of absent
            clients (``train.absent_statistics = "cached"``), or None.
        noise: differential privacy's noise for this round (``dcco.privacy.RoundNoise``).
    """
    algorithm = method if isinstance(method, Algorithm) else Algorithm(method, local_lr)
    small = int(segments.counts.min())
    needed = algorithm.method.min_client_samples
    if small < needed:
        raise ValueError(
            f"{algorithm.method.name} needs at least {needed} samples per client, but a "
            f"client of this round has {small}; use a partition with more samples per client"
        )
    if backend not in EXECUTORS:
        raise ValueError(f"unknown backend {backend!r}; choose 'batched' or 'reference'")
    return algorithm.run_round(EXECUTORS[backend](model, x1, x2, segments), previous, noise,
                               absent)
