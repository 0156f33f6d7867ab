"""A run's differential privacy made concrete: the noise multiplier (given or solved for ε), the
sensitivities and the accountant (``dcco.core.privacy``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from dcco.config import ConfigError, RunConfig
from dcco.core.privacy import Ledger, solve_noise_multiplier, stats_sensitivity
from dcco.data.partition import (
    Partition,
)


@dataclass(frozen=True)
class Privacy:
    """A run's differential privacy, made concrete (``dcco.core.privacy``).

    Attributes:
        noise_multiplier: σ (given, or solved for ``privacy.target_epsilon``).
        stats_bound: the statistics' sensitivity to one client (add or remove).
        update_bound: the averaged update's: C_u / K.
        num_clients, clients_per_round: M clients, K sampled per round without replacement
            (``train.clients_per_round``).
        releases: Gaussian releases per round (statistics and update, or the update alone).
        extra: releases once more (stale statistics' first exchange).
        delta: δ of the reported (ε, δ).
    """

    noise_multiplier: float
    stats_bound: float
    update_bound: float
    num_clients: int
    clients_per_round: int
    releases: int
    extra: int
    delta: float

    @classmethod
    def of(cls, cfg: RunConfig, partition: Partition, method) -> Privacy:
        sizes = partition.sizes
        if int(sizes.min()) != int(sizes.max()):
            raise ConfigError(
                f"privacy needs clients of one size (the update's sensitivity is C_u / K), "
                f"but the partition's clients hold {int(sizes.min())} to {int(sizes.max())} "
                f"samples")
        k, m = cfg.train.clients_per_round, partition.num_clients
        spec = method.stats
        releases = 2 if spec is not None else 1
        extra = 1 if spec is not None and cfg.train.staleness else 0
        p = cfg.privacy
        sigma = p.noise_multiplier
        if p.target_epsilon is not None:
            try:
                sigma = solve_noise_multiplier(p.target_epsilon, m, k, cfg.train.rounds,
                                               releases, p.delta, extra)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        stats = stats_sensitivity(spec, int(sizes.max())) if spec is not None else 0.0
        return cls(sigma, stats, p.update_clip / k, m, k, releases, extra, p.delta)

    def epsilon(self, rounds: int) -> float:
        """ε at ``delta`` spent by the first ``rounds`` rounds."""
        return self.ledger.epsilon(rounds)

    @functools.cached_property
    def ledger(self) -> Ledger:
        return Ledger(self.noise_multiplier, self.num_clients, self.clients_per_round, self.releases,
                      self.delta, self.extra)

    def summary(self, rounds: int) -> dict[str, Any]:
        return {"epsilon": self.epsilon(rounds), "delta": self.delta,
                "noise_multiplier": self.noise_multiplier,
                "stats_sensitivity": self.stats_bound, "update_sensitivity": self.update_bound,
                "clients": self.num_clients, "clients_per_round": self.clients_per_round,
                "releases_per_round": self.releases,
                "accounting": "RDP (dp-accounting), K of M clients sampled without "
                              "replacement, replace-one neighbours, central Gaussian noise"}


__all__ = ["Privacy"]
