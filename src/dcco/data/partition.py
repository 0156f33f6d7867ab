"""Clients: which samples each one holds.

``dirichlet_partition`` is the sampling process of Hsu, Qi & Brown (2019) used by the paper:
every client gets the same number of samples, and its class mix is q ~ Dir(α·p) with p the
class prior (α = 0: exactly one class per client; α = 1000: close to IID).
``natural_partition`` keeps a grouping the data already has (e.g. a DERM case of 1–6 images).
A client is an index tensor; all clients together are stored in CSR form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dcco.seeding import derive_seed


@dataclass(frozen=True)
class PartitionSummary:
    """Sizes and class diversity of a partition."""

    num_clients: int
    num_samples: int
    min_size: int
    mean_size: float
    max_size: int
    min_classes: int
    mean_classes: float
    max_classes: int

    def __str__(self) -> str:
        return (f"{self.num_clients} clients, {self.num_samples} samples; samples per client "
                f"{self.min_size}–{self.max_size} (mean {self.mean_size:.2f}); classes per "
                f"client {self.min_classes}–{self.max_classes} (mean {self.mean_classes:.2f})")


@dataclass(frozen=True)
class Partition:
    """Clients in CSR form: client k holds ``indices[offsets[k]:offsets[k+1]]``.

    Attributes:
        indices: int64 (M,), sample ids into the data set, grouped by client.
        offsets: int64 (K+1,), start of each client's ids; offsets[0] = 0, offsets[K] = M.
        keys: for natural partitions, the original id of each client; else None.
    """

    indices: Tensor
    offsets: Tensor
    keys: tuple | None = None

    def __post_init__(self) -> None:
        if self.offsets.ndim != 1 or self.offsets.shape[0] < 1 or int(self.offsets[0]) != 0:
            raise ValueError("Partition.offsets must be 1-D and start at 0")
        if int(self.offsets[-1]) != self.indices.shape[0]:
            raise ValueError("Partition.offsets must end at len(indices)")

    @property
    def num_clients(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def sizes(self) -> Tensor:
        """int64 (K,), the number of samples of each client."""
        return self.offsets[1:] - self.offsets[:-1]

    def client(self, k: int) -> Tensor:
        """The sample ids of client ``k``."""
        return self.indices[int(self.offsets[k]):int(self.offsets[k + 1])]

    def gather(self, clients: Tensor) -> tuple[Tensor, Tensor]:
        """The samples of ``clients`` (in that order) and the slot 0..len−1 of their client.

        Returns:
            sample ids, int64 (N,), and segment ids, int64 (N,), grouped client by client.
        """
        clients = torch.as_tensor(clients, dtype=torch.int64)
        starts, sizes = self.offsets[clients], self.sizes[clients]
        segment_ids = torch.repeat_interleave(torch.arange(len(clients)), sizes)
        first = torch.cumsum(sizes, 0) - sizes  # position of each client's first sample
        within = torch.arange(int(sizes.sum())) - first[segment_ids]
        return self.indices[starts[segment_ids] + within], segment_ids

    def summary(self, labels: Tensor | np.ndarray) -> PartitionSummary:
        """Sizes and number of distinct classes per client."""
        labels = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
        sizes = self.sizes
        owner = torch.repeat_interleave(torch.arange(self.num_clients), sizes)
        num_classes = int(labels.max()) + 1 if labels.numel() else 1
        pairs = torch.unique(owner * num_classes + labels[self.indices])
        classes = torch.bincount(pairs // num_classes, minlength=self.num_clients)
        return PartitionSummary(
            self.num_clients, int(sizes.sum()), int(sizes.min()), float(sizes.double().mean()),
            int(sizes.max()), int(classes.min()), float(classes.double().mean()),
            int(classes.max()),
        )


def _from_lists(groups: Sequence[np.ndarray], keys: tuple | None = None) -> Partition:
    sizes = np.array([len(g) for g in groups], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    flat = np.concatenate(groups) if len(groups) else np.zeros(0, np.int64)
    return Partition(torch.from_numpy(flat.astype(np.int64)), torch.from_numpy(offsets), keys)


def dirichlet_partition(labels: Tensor | np.ndarray, samples_per_client: int, alpha: float,
                        seed: int, num_clients: int | None = None) -> Partition:
    """Hsu, Qi & Brown (2019) partitioning: equal-size clients with class mix q ~ Dir(α·p).

    Each client draws q ~ Dir(α·p) (p: the class prior), then draws its samples' classes from q
    and takes samples of those classes from the remaining pool without replacement; when a
    class runs out, q is renormalised over the classes that still have samples. α = 0 is
    handled exactly: each client takes one class, chosen with probability proportional to the
    samples that class still has, among classes with at least ``samples_per_client`` left.

    Args:
        labels: int (N,), the class of every sample.
        samples_per_client: the size of every client.
        alpha: Dirichlet concentration α ≥ 0.
        seed: run seed; the stream is ``derive_seed(seed, "partition")``.
        num_clients: how many clients; None → as many as fit (N // samples_per_client;
            fewer at α = 0 if classes do not divide evenly).
    """
    labels = np.asarray(labels.cpu() if isinstance(labels, Tensor) else labels, dtype=np.int64)
    if samples_per_client < 1:
        raise ValueError(f"samples_per_client must be >= 1, got {samples_per_client}")
    if not alpha >= 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    n, classes = labels.shape[0], int(labels.max()) + 1 if labels.size else 0
    rng = np.random.default_rng(derive_seed(seed, "partition"))
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(classes)]
    if alpha == 0:
        fit = sum(len(p) // samples_per_client for p in pools)
        k = fit if num_clients is None else num_clients
        if k > fit:
            raise ValueError(
                f"alpha = 0 needs {samples_per_client} samples of one class per client: the data "
                f"fits at most {fit} such clients, but {k} were asked for")
        return _one_class_clients(pools, samples_per_client, k, rng)
    k = n // samples_per_client if num_clients is None else num_clients
    if k * samples_per_client > n:
        raise ValueError(f"{k} clients × {samples_per_client} samples need {k * samples_per_client}"
                         f" samples, but the data has {n}")
    prior = np.array([len(p) for p in pools], dtype=np.float64) / n
    left = np.array([len(p) for p in pools], dtype=np.int64)
    taken = np.zeros(classes, dtype=np.int64)
    groups = []
    for q in rng.dirichlet(alpha * prior, size=k):
        counts = np.zeros(classes, dtype=np.int64)
        for _ in range(samples_per_client):
            w = np.where(left - counts > 0, q, 0.0)
            if w.sum() <= 0:  # q has mass only on exhausted classes: fall back to availability
                w = (left - counts).astype(np.float64)
            counts[rng.choice(classes, p=w / w.sum())] += 1
        groups.append(np.concatenate([pools[c][taken[c]:taken[c] + counts[c]]
                                      for c in np.flatnonzero(counts)]))
        taken += counts
        left -= counts
    return _from_lists(groups)


def _one_class_clients(pools: list[np.ndarray], size: int, k: int,
                       rng: np.random.Generator) -> Partition:
    slots = np.array([len(p) // size for p in pools], dtype=np.int64)
    left = np.array([len(p) for p in pools], dtype=np.float64)
    used = np.zeros(len(pools), dtype=np.int64)
    groups = []
    for _ in range(k):
        w = np.where(slots - used > 0, left, 0.0)
        c = int(rng.choice(len(pools), p=w / w.sum()))
        groups.append(pools[c][used[c] * size:(used[c] + 1) * size])
        used[c] += 1
        left[c] -= size
    return _from_lists(groups)


def natural_partition(client_ids: Sequence | np.ndarray | Tensor) -> Partition:
    """One client per distinct id, e.g. the cases of the DERM data set (1–6 images each).

    Args:
        client_ids: (N,), the client (case) of every sample.

    Returns:
        The partition, clients in sorted id order, ``keys`` holding the ids.
    """
    ids = np.asarray(client_ids.cpu() if isinstance(client_ids, Tensor) else client_ids)
    order = np.argsort(ids, kind="stable")
    keys, starts = np.unique(ids[order], return_index=True)
    groups = np.split(order.astype(np.int64), starts[1:])
    return _from_lists(groups, keys=tuple(keys.tolist()))
