"""Which clients a round samples (a pure function of the seed and the round), how many distinct
clients a run sees, and a centralized step's batch."""

from __future__ import annotations

import torch
from torch import Tensor

from dcco.config import ConfigError
from dcco.core.seeding import generator


def sample_clients(seed: int, round_index: int, num_clients: int, k: int) -> Tensor:
    """The K distinct clients of a round, uniformly without replacement: a function of (seed, r)."""
    if k > num_clients:
        raise ConfigError(
            f"train.clients_per_round = {k} but the partition has only {num_clients} clients"
        )
    return torch.randperm(num_clients, generator=generator(seed, "sample", round_index))[:k]


def clients_seen(seed: int, rounds: int, num_clients: int, k: int,
                 limit: int = 20_000) -> int:
    """How many distinct clients ``rounds`` rounds of ``k`` sample (``sample_clients``, a
    function of (seed, r)): counted round by round, exactly, up to ``limit`` rounds or until
    every client is seen; past ``limit`` rounds, bounded by one new client a draw."""
    seen: set[int] = set()
    for r in range(min(rounds, limit)):
        seen.update(sample_clients(seed, r, num_clients, k).tolist())
        if len(seen) == num_clients:
            return num_clients
    return min(num_clients, len(seen) + max(0, rounds - limit) * k)


def centralized_batch(seed: int, step: int, pool: Tensor, batch_size: int) -> Tensor:
    """Sample ids of centralized step ``step``: epochs of shuffled pool, last partial batch dropped."""
    per_epoch = pool.shape[0] // batch_size
    if per_epoch == 0:
        raise ConfigError(
            f"the centralized batch size {batch_size} exceeds the {pool.shape[0]} samples available"
        )
    epoch, offset = divmod(step, per_epoch)
    perm = torch.randperm(pool.shape[0], generator=generator(seed, "epoch", epoch))
    return pool[perm[offset * batch_size:(offset + 1) * batch_size]]


__all__ = ["centralized_batch", "clients_seen", "sample_clients"]
