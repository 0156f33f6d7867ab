"""Clients: which samples each one holds.

``dirichlet_partition`` is the sampling process of Hsu, Qi & Brown (2019), "Measuring the
effects of non-identical data distribution for federated visual classification", which the DCCO
paper (Vemulapalli et al., ICLR 2023, Sec. 5) uses to make non-IID clients: every client holds
the same number of samples and its class mix is q ~ Dir(α·p), p being the class prior
(α = 0: exactly one class per client; α = 1000: close to IID).
``natural_partition`` keeps a grouping the data already has (e.g. a DERM case of 1–6 images).

A client is an index tensor; all clients together are stored in CSR form (``Partition``), so a
round gathers the samples of hundreds of clients with a few tensor ops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dcco.core.seeding import derive_seed

# Clients whose class counts are drawn in one vectorised multinomial call. Each chunk ends early
# at the first client that would take more of a class than is left (at most once per class), so
# the cost is O(K·C + C²·chunk) whatever α is. Changing it changes the partitions of a seed.
_CHUNK = 1024


@dataclass(frozen=True)
class PartitionSummary:
    """Sizes and class diversity of a partition.

    Attributes:
        num_clients: K.
        num_samples: samples over all clients.
        min_size, mean_size, max_size: samples per client.
        min_classes, mean_classes, max_classes: distinct classes per client.
    """

    num_clients: int
    num_samples: int
    min_size: int
    mean_size: float
    max_size: int
    min_classes: int
    mean_classes: float
    max_classes: int

    def format(self) -> str:
        """One paragraph of text, e.g. for a run's log."""
        return (f"{self.num_clients} clients, {self.num_samples} samples; samples per client "
                f"{self.min_size}–{self.max_size} (mean {self.mean_size:.2f}); distinct classes "
                f"per client {self.min_classes}–{self.max_classes} "
                f"(mean {self.mean_classes:.2f}).")

    def __str__(self) -> str:
        return self.format()


@dataclass(frozen=True, eq=False)
class Partition:
    """Clients in CSR form: client k holds ``indices[offsets[k]:offsets[k + 1]]``.

    Equality is identity (the fields are tensors); compare contents with ``torch.equal``.

    Attributes:
        indices: int64 (M,), sample ids into the data set, grouped client by client.
        offsets: int64 (K + 1,), nondecreasing; offsets[0] = 0 and offsets[K] = M.
        keys: for natural partitions, the sorted distinct id of each client (K entries);
            None for Dirichlet partitions.
    """

    indices: Tensor
    offsets: Tensor
    keys: tuple | None = None

    def __post_init__(self) -> None:
        for name, t in (("indices", self.indices), ("offsets", self.offsets)):
            if not isinstance(t, Tensor) or t.dtype != torch.int64 or t.ndim != 1:
                raise ValueError(f"Partition.{name} must be a 1-D int64 tensor, got "
                                 f"{getattr(t, 'dtype', type(t))} {tuple(getattr(t, 'shape', ()))}")
        if self.offsets.numel() < 1 or int(self.offsets[0]) != 0:
            raise ValueError("Partition.offsets must start with 0")
        if int(self.offsets[-1]) != self.indices.numel():
            raise ValueError(f"Partition.offsets must end at len(indices) = "
                             f"{self.indices.numel()}, got {int(self.offsets[-1])}")
        if bool((self.offsets[1:] < self.offsets[:-1]).any()):
            raise ValueError("Partition.offsets must be nondecreasing")
        if self.keys is not None and len(self.keys) != self.num_clients:
            raise ValueError(f"Partition.keys has {len(self.keys)} entries for "
                             f"{self.num_clients} clients")

    @property
    def num_clients(self) -> int:
        """K, the number of clients."""
        return int(self.offsets.numel() - 1)

    @property
    def sizes(self) -> Tensor:
        """int64 (K,), the number of samples of each client."""
        return self.offsets[1:] - self.offsets[:-1]

    def client(self, k: int) -> Tensor:
        """int64 (n_k,), the sample ids of client ``k`` (0 ≤ k < K)."""
        if not 0 <= k < self.num_clients:
            raise IndexError(f"client {k} out of range: the partition has {self.num_clients}")
        return self.indices[int(self.offsets[k]):int(self.offsets[k + 1])]

    def gather(self, clients: Tensor) -> tuple[Tensor, Tensor]:
        """The samples of ``clients``, in that order, and the slot of their client.

        Vectorised (no loop over clients): it runs every round.

        Args:
            clients: int (R,), client ids in [0, K); repeats are allowed.

        Returns:
            ``(sample_ids, segment_ids)``, both int64 (Σ n_k,): the sample ids of ``clients[0]``,
            then of ``clients[1]``, ...; ``segment_ids[i]`` is the position in ``clients``
            (0..R−1) of the client that sample i belongs to.
        """
        clients = torch.as_tensor(clients, device=self.offsets.device)
        if clients.ndim != 1 or clients.dtype.is_floating_point or clients.dtype == torch.bool:
            raise ValueError(f"clients must be a 1-D integer tensor, got {clients.dtype} "
                             f"{tuple(clients.shape)}")
        clients = clients.long()
        if clients.numel() and (int(clients.min()) < 0 or int(clients.max()) >= self.num_clients):
            raise IndexError(f"client ids must lie in [0, {self.num_clients}), got "
                             f"{int(clients.min())}..{int(clients.max())}")
        starts, sizes = self.offsets[clients], self.sizes[clients]
        segment_ids = torch.repeat_interleave(
            torch.arange(clients.numel(), device=clients.device), sizes)
        first = torch.cumsum(sizes, 0) - sizes  # position in the output of each client's first
        within = torch.arange(segment_ids.numel(), device=clients.device) - first[segment_ids]
        return self.indices[starts[segment_ids] + within], segment_ids

    def summary(self, labels: Tensor | np.ndarray) -> PartitionSummary:
        """Sizes and number of distinct classes per client.

        Args:
            labels: int (N,), the class of every sample of the data set.
        """
        if self.num_clients == 0:
            return PartitionSummary(0, 0, 0, 0.0, 0, 0, 0.0, 0)
        sizes = self.sizes.cpu().numpy()
        owner = np.repeat(np.arange(self.num_clients), sizes)
        client_labels = _as_numpy(labels).astype(np.int64)[self.indices.cpu().numpy()]
        span = int(client_labels.max()) + 1 if client_labels.size else 1
        pairs = np.unique(owner * span + client_labels)  # distinct (client, class) pairs
        classes = np.bincount(pairs // span, minlength=self.num_clients)
        return PartitionSummary(
            num_clients=self.num_clients, num_samples=int(sizes.sum()),
            min_size=int(sizes.min()), mean_size=float(sizes.mean()),
            max_size=int(sizes.max()), min_classes=int(classes.min()),
            mean_classes=float(classes.mean()), max_classes=int(classes.max()),
        )


def dirichlet_partition(labels: Tensor | np.ndarray, samples_per_client: int, alpha: float,
                        seed: int, num_clients: int | None = None) -> Partition:
    """Equal-size clients whose class mix is q ~ Dir(α·p) (Hsu, Qi & Brown, 2019).

    Client by client, q ~ Dir(α·p) with p the class prior of ``labels``; the client's
    ``samples_per_client`` samples are drawn class by class from q, without replacement from
    the pool the previous clients left; when a class runs out, q is renormalised over the
    classes that still have samples (if q has no mass left on them, the remaining pool's class
    proportions are used instead). The draw is vectorised but exact: drawing all of a client's
    classes from q and redrawing those that overflow a class equals the sample-by-sample process.

    α = 0 (Dir(0) is undefined) is handled apart and gives exactly one class per client: each
    client takes one class with probability proportional to the number of whole clients that
    class can still fill, i.e. the clients are a random selection of all single-class slots.

    Args:
        labels: int (N,), the class of every sample (any non-negative integers).
        samples_per_client: n ≥ 1, the size of every client.
        alpha: the Dirichlet concentration α ≥ 0 (finite).
        seed: the run seed; the stream is ``numpy.random.default_rng(derive_seed(seed,
            "partition"))``.
        num_clients: K ≥ 1; None: as many as the data allows (N // n, or at α = 0 the number
            of single-class slots Σ_c ⌊N_c / n⌋).

    Returns:
        The partition, each client's samples grouped by class.

    Raises:
        ValueError: invalid arguments, or fewer samples than the clients need.
    """
    labels_np = _as_numpy(labels)
    if labels_np.ndim != 1 or labels_np.size == 0 or labels_np.dtype.kind not in "iu":
        raise ValueError(f"labels must be a non-empty 1-D integer array, got {labels_np.dtype} "
                         f"{labels_np.shape}")
    if int(labels_np.min()) < 0:
        raise ValueError(f"labels must be >= 0, found {int(labels_np.min())}")
    if isinstance(samples_per_client, bool) or int(samples_per_client) != samples_per_client \
            or samples_per_client < 1:
        raise ValueError(f"samples_per_client must be an integer >= 1, got {samples_per_client!r}")
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
    if num_clients is not None and num_clients < 1:
        raise ValueError(f"num_clients must be >= 1 or None, got {num_clients}")
    n = int(samples_per_client)
    classes, class_of = np.unique(labels_np, return_inverse=True)  # only classes present
    pool_sizes = np.bincount(class_of, minlength=classes.size).astype(np.int64)
    rng = np.random.default_rng(derive_seed(seed, "partition"))
    # Sample ids grouped by class, in a random order within each class: client after client
    # takes the next unused ids of each class.
    perm = rng.permutation(labels_np.size)
    pools = perm[np.argsort(class_of[perm], kind="stable")]
    if alpha == 0:
        counts = _one_class_counts(pool_sizes, n, num_clients, rng)
    else:
        k = labels_np.size // n if num_clients is None else int(num_clients)
        if k * n > labels_np.size:
            raise ValueError(f"{k} clients × {n} samples need {k * n} samples, but labels has "
                             f"only {labels_np.size}")
        q = rng.dirichlet(alpha * pool_sizes / labels_np.size, size=k)
        counts = _dirichlet_counts(q, n, pool_sizes, rng)
    return _partition_from_counts(counts, pools, pool_sizes)


def _one_class_counts(pool_sizes: np.ndarray, n: int, num_clients: int | None,
                      rng: np.random.Generator) -> np.ndarray:
    """Counts (K, C) for α = 0: each client n samples of a single class."""
    slots = pool_sizes // n
    k = int(slots.sum()) if num_clients is None else int(num_clients)
    if k > slots.sum():
        raise ValueError(
            f"alpha = 0 gives every client {n} samples of one class: the data fits at most "
            f"{int(slots.sum())} such clients ({n} samples each from classes of sizes "
            f"{pool_sizes.tolist()}), but {k} were asked for")
    slot_class = np.repeat(np.arange(pool_sizes.size), slots)
    chosen = slot_class[rng.permutation(slot_class.size)[:k]]
    counts = np.zeros((k, pool_sizes.size), dtype=np.int64)
    counts[np.arange(k), chosen] = n
    return counts


def _dirichlet_counts(q: np.ndarray, n: int, pool_sizes: np.ndarray,
                      rng: np.random.Generator) -> np.ndarray:
    """Class counts (K, C) of clients with class mixes ``q`` (K, C), drawn in client order.

    A chunk of clients draws Multinomial(n, q restricted to the classes left) at once; all
    clients before the first one that takes more of a class than is left are kept exactly
    (a multinomial that misses exhausted classes is the renormalised multinomial), that client
    is completed by ``_capped_draw``, and the rest of the chunk is drawn again.
    """
    k, c = q.shape
    counts = np.zeros((k, c), dtype=np.int64)
    left = pool_sizes.copy()
    start = 0
    while start < k:
        draw = rng.multinomial(n, _restricted(q[start:start + _CHUNK], left))
        cum = np.cumsum(draw, axis=0)
        over = (cum > left).any(axis=1)
        end = int(over.argmax()) if over.any() else draw.shape[0]
        counts[start:start + end] = draw[:end]
        if end:
            left -= cum[end - 1]
        if end == draw.shape[0]:
            start += end
            continue
        j = start + end
        counts[j] = _capped_draw(q[j], draw[end], n, left, rng)
        left -= counts[j]
        start = j + 1
    return counts


def _capped_draw(q: np.ndarray, draw: np.ndarray, n: int, left: np.ndarray,
                 rng: np.random.Generator) -> np.ndarray:
    """Complete one client whose first draw (C,) overflowed ``left``: keep what fits, redraw the
    rest from q renormalised over the classes still available (the sequential process)."""
    taken = np.minimum(draw, left)
    while (missing := n - int(taken.sum())) > 0:
        taken += np.minimum(rng.multinomial(missing, _restricted(q[None], left - taken)[0]),
                            left - taken)
    return taken


def _restricted(q: np.ndarray, left: np.ndarray) -> np.ndarray:
    """Rows of q (R, C) renormalised over the classes with ``left`` > 0; rows without mass
    there fall back to the class proportions of what is left."""
    w = np.where(left > 0, np.nan_to_num(q, nan=0.0), 0.0)
    total = w.sum(axis=1, keepdims=True)
    fallback = left / left.sum()
    return np.where(total > 0, w / np.where(total > 0, total, 1.0), fallback)


def _partition_from_counts(counts: np.ndarray, pools: np.ndarray,
                           pool_sizes: np.ndarray) -> Partition:
    """The partition in which client j takes counts[j, c] samples of class c, the next unused
    ones of ``pools`` (sample ids grouped by class, sizes ``pool_sizes``)."""
    pool_start = np.concatenate([[0], np.cumsum(pool_sizes)[:-1]])
    used_before = np.cumsum(counts, axis=0) - counts  # (K, C): taken by earlier clients
    rows, cols = np.nonzero(counts)  # row-major: client by client, class by class
    block = counts[rows, cols]
    block_first = np.cumsum(block) - block
    within = np.arange(int(block.sum())) - np.repeat(block_first, block)
    positions = np.repeat(pool_start[cols] + used_before[rows, cols], block) + within
    offsets = np.concatenate([[0], np.cumsum(counts.sum(axis=1))])
    return Partition(torch.from_numpy(pools[positions].astype(np.int64)),
                     torch.from_numpy(offsets.astype(np.int64)))


def natural_partition(client_ids: Sequence | np.ndarray | Tensor) -> Partition:
    """One client per distinct id, e.g. the cases of the DERM data set (1–6 images each).

    Args:
        client_ids: (N,), the client (case) id of every sample; any sortable values.

    Returns:
        The partition with clients in sorted id order, ``keys`` holding those ids; each
        client's sample ids in increasing order.
    """
    ids = _as_numpy(client_ids)
    if ids.ndim != 1:
        raise ValueError(f"client_ids must be 1-D, got shape {ids.shape}")
    order = np.argsort(ids, kind="stable")
    keys, starts = np.unique(ids[order], return_index=True)
    offsets = np.append(starts, ids.size).astype(np.int64)
    return Partition(torch.from_numpy(order.astype(np.int64)), torch.from_numpy(offsets),
                     keys=tuple(keys.tolist()))


def clients_of_at_least(partition: Partition, minimum: int) -> Partition:
    """The clients holding at least ``minimum`` samples (in their order, keys kept): the
    clients a method whose loss lives within a client can use (FedAvg baselines need 2)."""
    keep = torch.nonzero(partition.sizes >= minimum).flatten()
    if keep.numel() == partition.num_clients:
        return partition
    sizes = partition.sizes[keep]
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(sizes, 0)])
    indices = partition.gather(keep)[0] if keep.numel() else partition.indices[:0]
    keys = None if partition.keys is None else tuple(partition.keys[k] for k in keep.tolist())
    return Partition(indices, offsets, keys)


def _as_numpy(x: Tensor | np.ndarray | Sequence) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)
