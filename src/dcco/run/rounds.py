"""Planning a round: which clients (a pure function of the seed and the round), their
samples, the algorithm of the round, the partition, the user's views, and every check a run
makes of its data before anything is written (``dcco.run.setup`` checks the config). The Flower backends
and ``dcco.fit`` use these without the training loop (``dcco.run.loop``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dcco.config import ConfigError, RunConfig
from dcco.core.algorithm import Algorithm
from dcco.core.client import LocalSGD
from dcco.core.optim import scheduled_lr
from dcco.core.privacy import Ledger, solve_noise_multiplier, stats_sensitivity
from dcco.core.seeding import derive_seed, generator
from dcco.data.augment import is_image
from dcco.data.paired import Dataset
from dcco.data.partition import (
    Partition,
    clients_of_at_least,
    dirichlet_partition,
    natural_partition,
)
from dcco.methods.base import Segments
from dcco.methods.registry import METHODS, build_method


def input_record(data: Dataset) -> dict[str, Any]:
    """``input_shape`` (one sample of X, or of the images) and ``input_kind`` ("images" or
    "features"), with ``input_shape_y`` and ``input_kind_y`` for pairs."""
    record: dict[str, Any] = {}
    for tower, suffix in enumerate(("", "_y")[: 1 + data.paired]):
        record[f"input_shape{suffix}"] = list(data.input_shapes[tower])
        record[f"input_kind{suffix}"] = "images" if is_image(data.inputs(tower)) else "features"
    return record


def resolve_device(name: str) -> torch.device:
    """``"auto"`` is CUDA when present, else CPU; anything else is checked to exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device = {name!r} but CUDA is not available on this machine")
    return device


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


@dataclass(frozen=True)
class RoundPlan:
    """The samples of one round, grouped by client (``segments``)."""

    sample_ids: Tensor
    segments: Segments
    clients: Tensor | None = None
    """The round's client ids, in the order of ``segments`` (None: a centralized batch)."""


def plan_round(cfg: RunConfig, partition: Partition, round_index: int) -> RoundPlan:
    """Which samples round ``round_index`` uses, and which client each belongs to."""
    seed, k = cfg.train.seed, cfg.train.clients_per_round
    if METHODS[cfg.train.method].federated:
        clients = sample_clients(seed, round_index, partition.num_clients, k)
        ids, segment_ids = partition.gather(clients)
        return RoundPlan(ids, Segments(segment_ids, partition.sizes[clients]), clients)
    batch = k * cfg.data.samples_per_client
    ids = centralized_batch(seed, round_index, partition.indices, batch)
    return RoundPlan(ids, Segments.from_counts([batch]))


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
                     client_weighting=t.client_weighting, local_sgd=LocalSGD(t.local_momentum, t.local_weight_decay,
                                                  t.local_grad_clip))



def fedsc_alpha(round_index: int, rounds: int, first: float = 1.0, last: float = 0.2) -> float:
    """FedSC's α at a round (0-based): linear from ``first`` to ``last`` over the run."""
    if rounds <= 1:
        return first
    return first + (last - first) * round_index / (rounds - 1)


def build_partition(cfg: RunConfig, train_set: Dataset) -> Partition:
    """The run's clients: Hsu et al. Dirichlet partitioning of the training labels, or with
    ``data.partition = "natural"`` one client per client id of the data (a lesion, a
    patient, a writer), of whatever size. A method whose loss lives within a client (the
    FedAvg baselines: ``min_client_samples``) samples only the natural clients large enough
    for it; the others sit its rounds out."""
    if cfg.data.partition == "natural":
        clients = getattr(train_set, "clients", None)
        if clients is None:
            raise ConfigError(f"data.partition = 'natural' needs a client id per image, and "
                              f"{train_set.name!r} has none")
        partition = natural_partition(clients)
        minimum = METHODS[cfg.train.method].min_client_samples
        usable = clients_of_at_least(partition, minimum)
        if usable.num_clients == 0:
            raise ConfigError(f"{cfg.train.method} needs clients of at least {minimum} "
                              f"samples, and no natural client of {train_set.name!r} has as "
                              f"many")
        return usable
    return dirichlet_partition(
        train_set.labels, cfg.data.samples_per_client, cfg.data.alpha, cfg.train.seed,
        num_clients=cfg.data.num_clients,
    )


def user_views(augment: Callable[[Tensor], Tensor], samples: Tensor, seed: int,
               round_index: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Two views of ``samples`` by the user's ``augment``, with torch's random state seeded
    from ``(seed, round_index)`` (``seed``: the run's augmentation seed) and restored after;
    floating views cast to ``dtype``."""
    # every CUDA device: manual_seed reseeds them all, and fork_rng restores those it is given
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(derive_seed(seed, "user", round_index))
        views = augment(samples), augment(samples)
    for v in views:
        if not isinstance(v, Tensor) or v.ndim < 1 or v.shape[0] != samples.shape[0]:
            raise ValueError(f"augment must return one view per sample, a tensor of "
                             f"{samples.shape[0]} rows; got "
                             f"{tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__}")
    return tuple(v.to(dtype) if v.is_floating_point() else v for v in views)


def max_batch_of(max_batch: int | str | None, device: torch.device) -> int | None:
    """``train.max_batch`` on ``device``: "auto" is 256 samples on a CPU (a forward of a few
    thousand images there runs at about half the speed of its groups; docs/performance.md)
    and None (one forward) elsewhere."""
    if max_batch == "auto":
        return 256 if device.type == "cpu" else None
    return max_batch


def keeps_graphs(max_batch: int | str | None, device: torch.device) -> bool:
    """Whether ``train.max_batch``'s groups keep their graphs from the statistics to the
    update (one forward a group, ``dcco.core.simulator``): under "auto", whose groups on a CPU are
    for speed; not under a number, which bounds a forward's memory."""
    return max_batch == "auto" and max_batch_of(max_batch, device) is not None


@dataclass(frozen=True)
class Privacy:
    """A run's differential privacy, made concrete (``dcco.core.privacy``).

    Attributes:
        noise_multiplier: σ (given, or solved for ``privacy.target_epsilon``).
        stats_bound: the statistics' sensitivity to one client (add or remove).
        update_bound: the averaged update's: C_u / K.
        population, sample: M clients, K sampled per round without replacement.
        releases: Gaussian releases per round (statistics and update, or the update alone).
        extra: releases once more (stale statistics' first exchange).
        delta: δ of the reported (ε, δ).
    """

    noise_multiplier: float
    stats_bound: float
    update_bound: float
    population: int
    sample: int
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
        return Ledger(self.noise_multiplier, self.population, self.sample, self.releases,
                      self.delta, self.extra)

    def summary(self, rounds: int) -> dict[str, Any]:
        return {"epsilon": self.epsilon(rounds), "delta": self.delta,
                "noise_multiplier": self.noise_multiplier,
                "stats_sensitivity": self.stats_bound, "update_sensitivity": self.update_bound,
                "clients": self.population, "clients_per_round": self.sample,
                "releases_per_round": self.releases,
                "accounting": "RDP (dp-accounting), K of M clients sampled without "
                              "replacement, replace-one neighbours, central Gaussian noise"}


