"""The federated algorithm: a method plus its round settings, and the one sequence of a round.

An ``Algorithm`` says, for one method:

- which statistics a client shares (``method.stats``, a spec of named sums) and how the server
  merges them: fresh each round (two exchanges: statistics, then updates) or, with
  ``staleness = 1``, the previous round's aggregate (one exchange: each client sends its
  update and its fresh statistics together, and those become the next round's aggregate);
- how a client updates: E local SGD steps on minibatches of b samples, the shared statistics
  held fixed within the round (``client.client_update``);
- how the server combines the updates: their sample-weighted average, negated into a
  pseudo-gradient for Adam or LARS (``server.aggregate_updates``);
- and whether the exact batched form of a round exists: for one local step on all of a
  client's samples, ``method.round_loss`` over the concatenated batch. Without it, the
  batched executor runs clients one by one; it is never silently wrong.

``Algorithm.round`` is the round, written once. The executors (``simulator.BatchedExecutor``
and ``ReferenceExecutor``, and the Flower app's plain and SecAgg+ exchanges) only carry out its
two steps, ``statistics`` and ``updates``.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from torch import Tensor
from torch.nn import Module

from dcco.core.aggregation import AGGREGATIONS, combine_updates
from dcco.core.client import (
    PLAIN_SGD,
    ClientUpdate,
    LocalSGD,
    client_update,
    stateful_update,
)
from dcco.core.client_state import Layout
from dcco.core.method import Method
from dcco.core.privacy import RoundNoise
from dcco.core.stats import EncodingStats, Moments, StatsSpec, moving_average

Absent = Callable[[list[EncodingStats]], EncodingStats]
"""The server's merge of a round's per-client statistics with its cache of the clients absent
from the round (``dcco.core.statistics_cache.StatisticsCache.merge_round``)."""

STATS_BYTES = 8
"""Bytes per shared statistic: sums travel in float64."""


class RoundSkipped(Exception):
    """An exchange ended with too few valid replies; the round leaves the model unchanged.

    Attributes:
        reason: why, for the log and metrics.
        shared: S_A if the statistics exchange had finished, else None.
    """

    def __init__(self, reason: str, shared: Moments | None = None) -> None:
        super().__init__(reason)
        self.reason, self.shared = reason, shared


@dataclass(frozen=True)
class Updates:
    """What the update exchange returns to the server.

    Attributes:
        pseudo_gradient: by parameter name, −Σ_k (N_k/N)·Δ_k.
        loss: Σ_k (N_k/N)·loss_k, the clients' losses before their first step: a number, or
            a scalar tensor still on the device (the batched executor's, read only when
            logged).
        num_clients: K that took part. num_samples: their N.
        stats: the merged fresh statistics sent with the updates (stale mode), else None.
    """

    pseudo_gradient: dict[str, Tensor]
    loss: float | Tensor
    num_clients: int
    num_samples: int
    stats: EncodingStats | None = None


class Executor(Protocol):
    """How the clients of one round run: in one batch, one by one, or over Flower."""

    def statistics(self, spec: StatsSpec) -> EncodingStats:
        """Exchange 1: every client's statistics, merged (raises ``RoundSkipped``)."""
        ...

    def each_statistics(self, spec: StatsSpec) -> list[EncodingStats]:
        """Exchange 1, unmerged: each client's statistics, in the round's client order (the
        simulator's executors; over Flower a node merges its clients)."""
        ...

    def updates(self, algorithm: Algorithm, shared: Moments | None,
                with_stats: StatsSpec | None) -> Updates:
        """The update exchange: the clients' local steps against ``shared``, combined; with
        ``with_stats``, each client also sends its fresh statistics (raises
        ``RoundSkipped``)."""
        ...


@dataclass(frozen=True)
class RoundResult:
    """The outcome of one round before the server optimiser.

    Attributes:
        pseudo_gradient: by parameter name, −Σ_k (N_k/N)·Δ_k (the gradient, in centralized mode).
        loss: Σ_k (N_k/N)·loss_k, the clients' losses before their step (a number, or a
            device scalar: see ``Updates``).
        num_clients: K.
        num_samples: N.
        shared: S_A, the statistics the clients' losses used (None without statistics).
        aggregate: the aggregate the next round uses (stale mode), else None.
        exchanges: server–client exchanges this round took (1 or 2).
    """

    pseudo_gradient: dict[str, Tensor]
    loss: float | Tensor
    num_clients: int
    num_samples: int
    shared: Moments | None = None
    aggregate: Moments | None = None
    exchanges: int = 1


@dataclass(frozen=True)
class Algorithm:
    """A method and how its rounds run.

    Attributes:
        method: the losses and statistics (``dcco.methods``).
        local_lr: client SGD learning rate η (paper: 1.0).
        local_steps: E, client SGD steps per round (paper: 1).
        local_batch: b, samples per local step; None: all of the client's.
        update_clip: see the attribute (``dcco.core.privacy``).
        staleness: 0: the statistics of this round's clients (two exchanges); 1: the aggregate
            of the previous round's clients (one exchange per round; round 0, having no
            previous aggregate, takes the extra statistics exchange once).
    """

    method: Method
    local_lr: float = 1.0
    local_steps: int = 1
    local_batch: int | None = None
    staleness: int = 0
    stale_after: int = 0
    """With ``staleness = 1``: the rounds before this one take fresh statistics (two exchanges,
    as with ``staleness = 0``), a warm-up; the clients still send their statistics with their
    updates, so the first stale round has its aggregate. 0: stale from the second round on
    (the first has no aggregate before it). ``stale_after`` ≥ the run's rounds is the fresh
    run exactly."""
    update_clip: float | None = None
    """C_u: each client's update clipped to this L2 norm (differential privacy), or None."""
    pseudo_gradient: str = "delta"
    """"delta" (FedOpt's −average update) or "mean_gradient" (that / (local_lr × E));
    ``dcco.config.TrainConfig.pseudo_gradient``."""
    local_statistics: str = "fixed"
    """With several local steps: "fixed", every step on the anchored loss (its value stays
    L(S_A)); "own", each step on L(S_A + (N_k/N)(S_k − S_k⁰)), the client's own statistics
    followed (``dcco.core.client.client_update``)."""
    stale_statistics: str = "anchored"
    """In a stale round: "anchored", each client's loss at the previous aggregate A,
    L(S_k + sg(A − S_k)); "own", at the mix (N_k/N)·S_k + (1 − N_k/N)·A (``stats.refreshed``
    with S_k⁰ = A), the client's own fresh statistics in their share and only the other
    clients' stale. Fresh rounds are unchanged. Exact in its limit: a round of one client
    (N_k = N) is the fresh round."""
    aggregate_decay: float = 0.0
    """β: in stale mode the next round's statistics are β·A_prev + (1 − β)·A_new, an
    exponential moving average of the aggregates (0: the last round's, as before)."""
    stale_round: bool = False
    """Set by ``round`` (and a Flower node) for the update exchange of a stale round, so
    the clients take ``stale_statistics``; not a setting."""
    own_alpha: float | None = None
    """With ``local_statistics = "own"``: FedSC's weight α of a client's own statistics in its
    local objective (``dcco.core.client.client_update``'s ``alpha``; set per round by
    ``train.own_weight = "fedsc"``); None: N_k/N, exact."""
    local_optimizer: str = "sgd"
    """With several local steps: "sgd", raw steps of local_lr × the gradient; "layerwise",
    each parameter tensor's step scaled by ‖θ₀‖/‖g‖ (θ₀ at the round's start), so local_lr
    is the relative step of every tensor (``dcco.core.client.client_update``). One local step is
    the same either way."""
    client_weighting: str = "samples"
    """How the server averages the clients' updates: "samples", by N_k/N (the exact round);
    "uniform", 1/K each (FedSC's code). The same where all of a round's clients hold as many
    samples (every Dirichlet partition), else not the centralized step."""
    local_sgd: LocalSGD = PLAIN_SGD
    """Momentum, weight decay and gradient clipping of the local steps (FedSC's clients';
    ``dcco.core.client.LocalSGD``). Decay or clipping makes even one step inexact."""
    aggregation: str = "fedavg"
    """How the server combines the updates: "fedavg", their weighted average; "ldawa",
    L-DAWA's, each client's layers first scaled by their cosine with the global model's
    (``dcco.core.aggregation``; ``train.aggregation``). L-DAWA is never the exact round."""

    def __post_init__(self) -> None:
        if self.staleness not in (0, 1):
            raise ValueError(f"train.staleness must be 0 or 1, got {self.staleness}")
        if self.staleness and self.method.stats is None:
            raise ValueError(f"train.staleness = 1 needs a method that shares statistics; "
                             f"{self.method.name} has none")
        if self.stale_after < 0:
            raise ValueError(f"train.stale_after must be >= 0, got {self.stale_after}")
        if self.stale_after and not self.staleness:
            raise ValueError(f"train.stale_after = {self.stale_after} sets when stale "
                             f"statistics start; it needs train.staleness = 1")
        if self.local_steps < 1:
            raise ValueError(f"train.local_steps must be >= 1, got {self.local_steps}")
        if self.local_batch is not None and self.local_batch < self.method.min_client_samples:
            raise ValueError(f"train.local_batch must be >= {self.method.min_client_samples} "
                             f"for {self.method.name}, got {self.local_batch}")
        if self.local_statistics not in ("fixed", "own"):
            raise ValueError(f"train.local_statistics must be 'fixed' or 'own', got "
                             f"{self.local_statistics!r}")
        if self.local_statistics == "own" and self.method.stats is None:
            raise ValueError(f"train.local_statistics = 'own' follows a client's shared "
                             f"statistics; {self.method.name} shares none")
        if self.stale_statistics not in ("anchored", "own"):
            raise ValueError(f"train.stale_statistics must be 'anchored' or 'own', got "
                             f"{self.stale_statistics!r}")
        if not 0.0 <= self.aggregate_decay < 1.0:
            raise ValueError(f"train.aggregate_decay must be in [0, 1), got "
                             f"{self.aggregate_decay}")
        if (self.stale_statistics != "anchored" or self.aggregate_decay) and not self.staleness:
            raise ValueError("train.stale_statistics and train.aggregate_decay shape stale "
                             "rounds; they need train.staleness = 1")
        if self.own_alpha is not None and not (0 < self.own_alpha <= 1
                                               and self.local_statistics == "own"):
            raise ValueError(f"a client's own weight α = {self.own_alpha} needs "
                             f"train.local_statistics = 'own' and 0 < α <= 1")
        if self.client_weighting not in ("samples", "uniform"):
            raise ValueError(f"train.client_weighting must be 'samples' or 'uniform', got "
                             f"{self.client_weighting!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"train.aggregation must be one of {', '.join(AGGREGATIONS)}, "
                             f"got {self.aggregation!r}")
        if self.aggregation != "fedavg" and self.update_clip is not None:
            raise ValueError(f"train.aggregation = {self.aggregation!r} rescales each "
                             f"client's update after differential privacy has clipped it, "
                             f"which would void the clip's bound; run it without [privacy]")
        if self.aggregation != "fedavg" and not self.method.federated:
            raise ValueError(f"{self.method.name} is centralized: the server has no client "
                             f"updates to combine by train.aggregation = "
                             f"{self.aggregation!r}")
        if self.local_optimizer not in ("sgd", "layerwise"):
            raise ValueError(f"train.local_optimizer must be 'sgd' or 'layerwise', got "
                             f"{self.local_optimizer!r}")
        if self.pseudo_gradient not in ("delta", "mean_gradient"):
            raise ValueError(f"train.pseudo_gradient must be 'delta' or 'mean_gradient', got "
                             f"{self.pseudo_gradient!r}")
        if self.stateful and (self.local_optimizer != "sgd"
                              or self.pseudo_gradient != "delta"):
            raise ValueError(f"{self.method.name}'s clients start from their own model: the "
                             f"server averages W_k − W_g, which holds the start's drift as "
                             f"well as the local steps, so it takes train.local_optimizer = "
                             f"'sgd' and train.pseudo_gradient = 'delta'")
        if not self.method.federated and (self.local_steps != 1 or self.local_batch
                                          or self.local_sgd != PLAIN_SGD):
            raise ValueError(f"{self.method.name} is centralized: it takes no local steps "
                             f"(train.local_steps = 1, train.local_batch = none, no "
                             f"train.local_momentum, local_weight_decay or local_grad_clip)")

    def client_update(self, model: Module, x1: Tensor, x2: Tensor,
                      shared: Moments | None,
                      after_step: Callable[[dict[str, Tensor]], None] | None = None
                      ) -> ClientUpdate:
        """One client's local steps with this algorithm's settings (``dcco.core.client``)."""
        return client_update(model, self.method, x1, x2, shared, self.local_lr,
                             self.local_steps, self.local_batch, self.update_clip,
                             self.local_statistics == "own",
                             self.local_optimizer == "layerwise", self.mixes, self.own_alpha,
                             self.local_sgd, after_step)

    @property
    def stateful(self) -> bool:
        """Whether the method's clients keep state between rounds (FedU's and FedEMA's own
        model, MoCo's queue)."""
        return self.method.stateful

    def stateful_update(self, model: Module, work: Module, layout: Layout, x1: Tensor,
                        x2: Tensor, state: dict[str, Tensor] | None, decay: float,
                        round_index: int) -> tuple[ClientUpdate, dict[str, Tensor]]:
        """A stateful client's round ``round_index`` with this algorithm's local steps
        (``dcco.core.client.stateful_update``): its update and its new state."""
        return stateful_update(
            model, work, layout, self.method, x1, x2, state, decay,
            lambda m, hook, method: replace(self, method=method).client_update(
                m, x1, x2, None, hook), round_index)

    def stateful_updates(self, model: Module, clients: Iterable[tuple[int, Tensor, Tensor]],
                         load: Callable[[int], dict[str, Tensor] | None],
                         save: Callable[[int, dict[str, Tensor]], None],
                         decay: float, round_index: int) -> list[ClientUpdate]:
        """A round's stateful clients one by one, wherever their states live (the
        simulator's store, a Flower node's ``context.state``): each ``(client, x1, x2)``'s
        state loaded (``load``: None for a client never seen), its round run from it
        (``stateful_update``, round ``round_index``, on one working copy of ``model`` for
        them all), and its new state saved (``save``); their updates, in order."""
        layout, work = Layout.of(model), copy.deepcopy(model)
        updates = []
        for client, x1, x2 in clients:
            update, new = self.stateful_update(model, work, layout, x1, x2, load(client),
                                               decay, round_index)
            save(client, new)
            updates.append(update)
        return updates

    def batched_exact(self, smallest_client: int, largest_client: int | None = None) -> bool:
        """Whether ``method.round_loss`` over the concatenated batch is the round: one local
        step on all of each client's samples from the global model, the updates weighted by
        sample count (or uniformly, over clients of one size); never for clients that start
        from their own model (``stateful``)."""
        equal = largest_client is None or largest_client == smallest_client
        return not self.stateful and self.update_clip is None and self.local_steps == 1 and (
            not self.mixes) and (self.local_batch is None or self.local_batch >= smallest_client) and (
            self.local_sgd.one_step_is_sgd) and (self.client_weighting == "samples" or equal) and (
            self.aggregation == "fedavg")

    def combine(self, updates: list[ClientUpdate], params: dict[str, Tensor]) -> ClientUpdate:
        """Clients' updates as one, by this algorithm's ``aggregation`` and
        ``client_weighting`` (``dcco.core.aggregation.combine_updates``): a round's, or the
        clients a Flower node hosts (``params``: the global model the clients were sent)."""
        return combine_updates(updates, params, self.aggregation, self.client_weighting)

    @property
    def mixes(self) -> bool:
        """Whether this round's clients take the own-statistics mix (a stale round)."""
        return self.stale_round and self.stale_statistics == "own"

    def for_update(self, stale: bool) -> Algorithm:
        """The algorithm for a round's update exchange: ``stale`` marks a stale round."""
        return replace(self, stale_round=stale) if stale != self.stale_round else self

    def previous_for(self, round_index: int, aggregate: Moments | None) -> Moments | None:
        """What round ``round_index`` (from 0) takes as ``round``'s ``previous``: the last
        round's aggregate once stale rounds have started, else None (fresh statistics)."""
        if not self.staleness or round_index < self.stale_after:
            return None
        return aggregate

    def exchanges(self, has_previous: bool) -> int:
        """Server–client exchanges of a round: 2 with a fresh statistics exchange, else 1."""
        fresh = self.method.stats is not None and (self.staleness == 0 or not has_previous)
        return 2 if fresh else 1

    def run_round(self, executor: Executor, previous: Moments | None = None,
                  noise: RoundNoise | None = None, absent: Absent | None = None) -> RoundResult:
        """``round``'s old name (``dcco.core.simulator.run_round`` is the one ``run_round``:
        a round on a model and its views), kept with a ``DeprecationWarning``."""
        warnings.warn("Algorithm.run_round is now Algorithm.round (dcco.core.simulator."
                      "run_round runs a round on a model and its views)", DeprecationWarning,
                      stacklevel=2)
        return self.round(executor, previous, noise, absent)

    def round(self, executor: Executor, previous: Moments | None = None,
              noise: RoundNoise | None = None, absent: Absent | None = None) -> RoundResult:
        """One round on ``executor``: statistics (fresh, or the previous round's aggregate),
        then the clients' updates against them, combined by the server. ``previous``: the last round's
        aggregate in stale mode. ``noise``: differential privacy's Gaussian noise, added by
        the server to each released sum (statistics, averaged update). ``absent``: the
        server's merge of the round's clients' statistics with its cache of the absent ones
        (FedSC's partial participation), instead of the round's clients alone."""
        spec = self.method.stats
        shared = previous if self.staleness else None
        exchanges = self.exchanges(previous is not None)
        if spec is not None and shared is None:
            stats = (executor.statistics(spec) if absent is None
                     else absent(executor.each_statistics(spec)))
            if noise is not None:  # stale mode's first round: its one extra exchange
                stats = noise.statistics(stats, spec, "first" if self.staleness else "stats")
            shared = stats.moments()
        out = executor.updates(self.for_update(exchanges == 1 and self.staleness == 1),
                               shared, spec if self.staleness else None)
        pseudo = noise.update(out.pseudo_gradient) if noise else out.pseudo_gradient
        if self.pseudo_gradient == "mean_gradient":
            scale = 1.0 / (self.local_lr * self.local_steps)
            pseudo = {name: v * scale for name, v in pseudo.items()}
        aggregate = None
        if out.stats is not None:
            aggregate = (noise.statistics(out.stats, spec) if noise else out.stats).moments()
            if self.aggregate_decay and previous is not None:
                aggregate = moving_average(previous, aggregate, self.aggregate_decay)
        return RoundResult(pseudo, out.loss, out.num_clients, out.num_samples,
                           shared, aggregate, exchanges)

    def message_bytes(self, d_f: int, d_g: int, model_bytes: int,
                      has_previous: bool = True, state_bytes: int = 0) -> dict[str, int]:
        """Bytes one client sends (``up``) and receives (``down``) in a round, payloads only:
        the model (``model_bytes``, its trained parameters) and ``state_bytes`` (what else
        the model holds: BYOL's target network, batch-norm statistics) down and the update
        (as large as the parameters) up; the statistics up (count and sums, float64) and S_A
        down when the method shares statistics."""
        spec = self.method.stats
        stats = spec.num_values(d_f, d_g) * STATS_BYTES if spec is not None else 0
        shared = stats - STATS_BYTES if spec is not None else 0  # S_A: the means, no count
        return {"up": model_bytes + stats, "down": model_bytes + state_bytes + shared}


__all__ = ["Absent", "Algorithm", "Executor", "RoundResult", "RoundSkipped", "Updates"]
