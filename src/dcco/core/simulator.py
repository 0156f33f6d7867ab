"""Execution backends for one round on one machine: ``reference`` (client by client) or
``batched``.

Both carry out ``Algorithm.round``'s two steps and return the round's pseudo-gradient,
the negated sample-weighted average of the clients' updates: with one local SGD step of
learning rate η, client k's update is −η∇L_k, and the server's optimiser consumes
−Σ_k (N_k/N)·update_k = η Σ_k (N_k/N) ∇L_k (FedOpt).

``batched`` runs all of a round's clients in one forward/backward over the concatenated batch,
with per-client segments in the loss (the statistics come from the same forward). This is exact for one local step on all of a client's
samples because the encoders use group norm and weight standardisation, which have no
cross-sample terms. For several local steps (or minibatches) no batched form exists here, and
the batched executor runs the clients' updates one by one, as ``reference`` does; with batch
norm (``model.norm = "bn"``), which normalises over a forward's samples, a round of several
clients runs entirely as ``reference`` (also under ``dcco.core.distributed``, which builds the
executors itself).

``batched`` with ``chunk`` = M runs the round's clients in groups of whole clients of at most M
samples (a larger client alone), one forward and backward a group, the gradients summed
with the groups' weights N_c/N: the same round (the method's round loss is Σ_k (N_k/N) L_k,
the ``Method`` contract), in less memory, and faster on a CPU, where one forward of thousands
of images runs at half the speed of its groups (``train.max_batch``; docs/performance.md).
With statistics, a group's forward then runs twice (without gradients for the statistics,
with them for the update) instead of once, unless ``keep_graphs``: then each group's forward
runs once, with gradients, and its graph is kept until the round's aggregate is known and the
group's backward runs (the same arithmetic, bit for bit; the memory of the whole round's
forward, as without groups). ``train.max_batch = "auto"`` on a CPU, where the groups are for
speed, keeps them; a ``max_batch`` set to bound memory does not.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from dcco.core.algorithm import Absent, Algorithm, RoundResult, Updates
from dcco.core.client import ClientUpdate, client_statistics, trainable_parameters
from dcco.core.client_state import RoundStates
from dcco.core.method import Method, Segments
from dcco.core.privacy import RoundNoise
from dcco.core.stats import EncodingStats, Moments, StatsSpec, encoding_stats, merge

Backend = Literal["batched", "reference"]

__all__ = ["Backend", "BatchedExecutor", "ReferenceExecutor", "RoundResult", "client_groups",
           "executor_for", "run_round"]


class ReferenceExecutor:
    """Each client on its own, as a device would run it: its statistics, then its local steps.

    Args:
        model: the current global dual encoder.
        x1, x2: both views of every sample of the round, (N, C, H, W), grouped by client in
            the order of ``segments``.
        segments: the client of each sample.
        states: the round's client ids and the store of what each client keeps, for a
            method whose clients keep their model (FedU, FedEMA); None otherwise.
    """

    def __init__(self, model: nn.Module, x1: Tensor, x2: Tensor, segments: Segments,
                 states: RoundStates | None = None) -> None:
        self.model = model
        self.x1, self.x2, self.segments = x1, x2, segments
        self.states = states

    @property
    def views(self) -> list[tuple[Tensor, Tensor]]:
        """Each client's two views (split on use: the batched path never needs them)."""
        sizes = self.segments.counts.tolist()
        return list(zip(torch.split(self.x1, sizes), torch.split(self.x2, sizes), strict=True))

    def statistics(self, spec: StatsSpec) -> EncodingStats:
        return merge(self.each_statistics(spec))

    def each_statistics(self, spec: StatsSpec) -> list[EncodingStats]:
        """Exchange 1, client by client: each client's statistics, unmerged (for the
        server's cache of absent clients, ``dcco.core.statistics_cache``)."""
        return [client_statistics(self.model, a, b, spec) for a, b in self.views]

    def updates(self, algorithm: Algorithm, shared: Moments | None,
                with_stats: StatsSpec | None) -> Updates:
        # client by client, also when the batched executor falls back here
        fresh = (ReferenceExecutor.statistics(self, with_stats) if with_stats is not None
                 else None)
        updates = (self._stateful_updates(algorithm) if algorithm.stateful else
                   [algorithm.client_update(self.model, a, b, shared) for a, b in self.views])
        pooled = algorithm.combine(updates, dict(trainable_parameters(self.model)))
        pseudo = {k: -v for k, v in pooled.delta.items()}
        return Updates(pseudo, pooled.loss, len(updates), self.segments.num_samples, fresh)


    def _stateful_updates(self, algorithm: Algorithm) -> list[ClientUpdate]:
        """Each client's round from its own kept state (``Algorithm.stateful_updates``), its
        new state put back in the store."""
        states = self.states
        if states is None or len(states.clients) != self.segments.num_clients:
            raise ValueError(f"{algorithm.method.name}'s clients keep their model between "
                             f"rounds: the round needs their ids and the store "
                             f"(RoundStates), one id a client")
        probe = next(iter(self.model.parameters()))
        clients = ((c, a, b) for c, (a, b) in zip(states.clients, self.views, strict=True))
        return algorithm.stateful_updates(
            self.model, clients, lambda c: states.store.get(c, probe.device, probe.dtype),
            states.store.put, states.target_decay, states.round_index)


class BatchedExecutor(ReferenceExecutor):
    """All of a round's clients in one forward (statistics) and one forward/backward
    (updates), exact where ``Algorithm.batched_exact``; otherwise the updates run client by
    client (``ReferenceExecutor``)."""

    def __init__(self, model: nn.Module, x1: Tensor, x2: Tensor, segments: Segments,
                 chunk: int | None = None, keep_graphs: bool = False,
                 states: RoundStates | None = None) -> None:
        super().__init__(model, x1, x2, segments, states)
        self._encodings: tuple[Tensor, Tensor] | None = None
        # batch norm couples a forward's samples: several clients run client by client
        self._per_client = getattr(model, "batch_norm", False) and segments.num_clients > 1
        self._groups = client_groups(segments, chunk)
        self._keep = keep_graphs
        self._kept: list[tuple[Tensor, Tensor]] | None = None

    def _group_encodings(self) -> list[tuple[Tensor, Tensor]]:
        """Each group's encodings, detached: from forwards whose graphs are kept for the
        update (``keep_graphs``), else from forwards without gradients."""
        if self._keep:
            self._kept = [self.model(self.x1[s], self.x2[s]) for s, _ in self._groups]
            return [(f.detach(), g.detach()) for f, g in self._kept]
        with torch.no_grad():
            return [self.model(self.x1[s], self.x2[s]) for s, _ in self._groups]

    def statistics(self, spec: StatsSpec) -> EncodingStats:
        if self._per_client:
            return super().statistics(spec)
        if self._groups is not None:
            return merge([encoding_stats(f, g, spec) for f, g in self._group_encodings()])
        # one forward serves both steps: the statistics from its detached encodings, the
        # update (one local step, at the same model) from its graph
        self._encodings = self.model(self.x1, self.x2)
        f, g = self._encodings
        return encoding_stats(f.detach(), g.detach(), spec)

    def each_statistics(self, spec: StatsSpec) -> list[EncodingStats]:
        if self._per_client:
            return super().each_statistics(spec)
        sizes = self.segments.counts.tolist()
        if self._groups is not None:
            encodings = self._group_encodings()
            f, g = (torch.cat([e[i] for e in encodings]) for i in (0, 1))
            return [encoding_stats(a, b, spec)
                    for a, b in zip(f.split(sizes), g.split(sizes), strict=True)]
        self._encodings = self.model(self.x1, self.x2)
        f, g = (t.detach() for t in self._encodings)
        return [encoding_stats(a, b, spec)
                for a, b in zip(f.split(sizes), g.split(sizes), strict=True)]

    def updates(self, algorithm: Algorithm, shared: Moments | None,
                with_stats: StatsSpec | None) -> Updates:
        encodings, self._encodings = self._encodings, None
        kept, self._kept = self._kept, None
        counts = self.segments.counts
        if self._per_client or not algorithm.batched_exact(int(counts.min()), int(counts.max())):
            return super().updates(algorithm, shared, with_stats)
        named = trainable_parameters(self.model)
        if self._groups is not None:
            return self._group_updates(algorithm, shared, with_stats, named, kept)
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

    def _group_updates(self, algorithm: Algorithm, shared: Moments | None,
                       with_stats: StatsSpec | None, named: list,
                       kept: list[tuple[Tensor, Tensor]] | None = None) -> Updates:
        """``updates`` group by group: Σ_c (N_c/N) ∇ round_loss(group c) = ∇ round_loss;
        ``kept``: the groups' encodings from the statistics' forwards, graphs and all (each
        freed by its group's backward)."""
        total = self.segments.num_samples
        pseudo = {name: torch.zeros_like(p) for name, p in named}
        loss, fresh = None, []
        for c, (s, segments) in enumerate(self._groups):
            if kept is not None:
                (f, g), kept[c] = kept[c], None  # the group's graph goes with its backward
            else:
                f, g = self.model(self.x1[s], self.x2[s])
            if with_stats:
                fresh.append(encoding_stats(f.detach(), g.detach(), with_stats))
            part = algorithm.method.round_loss(f, g, segments.to(f.device), shared) * (
                segments.num_samples / total)
            grads = torch.autograd.grad(part, [p for _, p in named], allow_unused=True)
            for (name, _), gr in zip(named, grads, strict=True):
                if gr is not None:
                    pseudo[name] += algorithm.local_lr * gr
            loss = part.detach() if loss is None else loss + part.detach()
        return Updates(pseudo, loss, self.segments.num_clients, self.segments.num_samples,
                       merge(fresh) if with_stats else None)


def client_groups(segments: Segments, chunk: int | None) -> list[tuple[slice, Segments]] | None:
    """Consecutive whole clients in groups of at most ``chunk`` samples (a larger client
    alone): each group's slice of the round's samples and its segments; None when one group
    holds them all (or ``chunk`` is None)."""
    if chunk is None or segments.num_samples <= chunk:
        return None
    groups: list[list[int]] = [[]]
    for n in segments.counts.tolist():
        if groups[-1] and sum(groups[-1]) + n > chunk:
            groups.append([])
        groups[-1].append(n)
    out, start = [], 0
    for counts in groups:
        out.append((slice(start, start + sum(counts)), Segments.from_counts(counts)))
        start += sum(counts)
    return out


EXECUTORS = {"batched": BatchedExecutor, "reference": ReferenceExecutor}


def keeps_graphs_for(algorithm: Algorithm, segments: Segments, keep_graphs: bool) -> bool:
    """Whether a round's groups keep their graphs: asked for, and the round's updates run
    batched (else they run client by client and would never use them)."""
    counts = segments.counts
    return keep_graphs and len(counts) > 0 and algorithm.batched_exact(int(counts.min()),
                                                                       int(counts.max()))


def executor_for(backend: Backend, model: nn.Module, x1: Tensor, x2: Tensor,
                 segments: Segments, chunk: int | None = None,
                 keep_graphs: bool = False,
                 states: RoundStates | None = None) -> ReferenceExecutor:
    """The backend's executor of a round's views (``chunk``, ``keep_graphs``:
    ``BatchedExecutor``'s groups; ``states``: stateful clients')."""
    if backend not in EXECUTORS:
        raise ValueError(f"unknown backend {backend!r}; choose 'batched' or 'reference'")
    if backend == "batched":
        return BatchedExecutor(model, x1, x2, segments, chunk, keep_graphs, states)
    return ReferenceExecutor(model, x1, x2, segments, states)


def run_round(model: nn.Module, method: Method | Algorithm, x1: Tensor, x2: Tensor,
              segments: Segments, backend: Backend = "batched", local_lr: float = 1.0,
              previous: Moments | None = None, noise: RoundNoise | None = None,
              absent: Absent | None = None, chunk: int | None = None,
              keep_graphs: bool = False, states: RoundStates | None = None) -> RoundResult:
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
        noise: differential privacy's noise for this round (``dcco.core.privacy.RoundNoise``).
        chunk: ``batched``: clients in groups of at most this many samples, one forward and
            backward a group (``client_groups``); None: all at once.
        keep_graphs: with ``chunk``, each group forwarded once, its graph kept from the
            statistics to its backward (the whole round's forward in memory), where the
            round's updates run batched; else forwarded again for the update.
        states: the round's client ids and the store of their kept models, for a method
            whose clients keep them (FedU, FedEMA; ``dcco.core.client_state``).
    """
    algorithm = method if isinstance(method, Algorithm) else Algorithm(method, local_lr)
    small = int(segments.counts.min())
    needed = algorithm.method.min_client_samples
    if small < needed:
        raise ValueError(
            f"{algorithm.method.name} needs at least {needed} samples per client, but a "
            f"client of this round has {small}; use a partition with more samples per client"
        )
    keep = keeps_graphs_for(algorithm, segments, keep_graphs)
    return algorithm.round(executor_for(backend, model, x1, x2, segments, chunk, keep,
                                            states), previous, noise, absent)
