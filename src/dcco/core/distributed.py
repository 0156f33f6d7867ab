"""A round's clients across processes and machines with ``torch.distributed``.

DCCO maps onto collective operations exactly. Every rank computes the same round plan (client
sampling and augmentation are functions of (seed, round)), takes its contiguous share of the
round's clients, and runs them with the usual executor; then

- the statistics exchange is an all-reduce of the count and sums (float64), so every rank
  holds S_A;
- under FedSC's partial participation (``train.absent_statistics = "cached"``) the
  statistics travel client by client instead: each rank fills its share of a stack of the
  round's clients' sums (zeros elsewhere) and the all-reduce completes it exactly, so every
  rank keeps the same copy of the server's cache (``dcco.core.statistics_cache``);
- the update exchange is an all-reduce of each rank's pseudo-gradient scaled by its share of
  the round's samples, N_rank / N: Σ_ranks (N_rank/N) Σ_{k ∈ rank} (N_k/N_rank)·g_k is the
  round's Σ_k (N_k/N)·g_k.

Every rank then applies the same pseudo-gradient with its own copy of the server optimiser, so
the models stay identical without broadcasting them. A centralized step splits its batch
across the ranks and runs as DCCO over them (one "client" per rank: the anchored loss of the
pooled statistics, paper appendix A), which is exactly the centralized gradient.

Launch: ``torchrun --nproc_per_node N -m dcco pretrain CONFIG --run-dir DIR`` (or several
nodes with ``--nnodes`` and a rendezvous endpoint). Gloo on CPUs, NCCL on GPUs. Rank 0 alone
writes the run directory. Collectives time out after ``DCCO_DIST_TIMEOUT`` seconds (default
300): a rank that dies stops the others with an error instead of a hang.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from dcco.core.algorithm import Algorithm, Executor, Updates
from dcco.core.client_state import ClientStates
from dcco.core.method import Segments
from dcco.core.stats import EncodingStats, Moments, StatsSpec

TIMEOUT_ENV = "DCCO_DIST_TIMEOUT"
DEFAULT_TIMEOUT = 300.0


def launched() -> bool:
    """Whether this process was started as one of several ranks (``torchrun`` sets
    ``WORLD_SIZE``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_from_env(device_type: str = "cpu") -> None:
    """Join the process group ``torchrun`` describes (gloo on CPUs, NCCL on GPUs), with the
    collectives' timeout from ``DCCO_DIST_TIMEOUT`` (seconds). Does nothing when already
    joined or when this is a single process."""
    if not launched() or dist.is_initialized():
        return
    timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT))
    backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))


def rank_and_size() -> tuple[int, int]:
    """(rank, world size); (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def share(num_clients: int, rank: int, size: int) -> slice:
    """This rank's contiguous share of a round's clients (the first ``num_clients % size``
    ranks take one more)."""
    if num_clients < size:
        raise ValueError(f"a round of {num_clients} clients cannot be split over {size} ranks: "
                         f"give each rank at least one (train.clients_per_round >= {size})")
    base, extra = divmod(num_clients, size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def _sum(t: Tensor) -> Tensor:
    out = t.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def _sum_stats(stats: EncodingStats) -> EncodingStats:
    return EncodingStats({k: _sum(v) for k, v in stats.items()})


class AllReduceExecutor:
    """One rank's share of a round: ``inner`` runs this rank's clients; the statistics and
    the updates are summed across the ranks (see the module docs).

    Args:
        inner: the executor of this rank's clients (batched or reference).
        local_samples: the samples of this rank's clients. total_samples: the round's.
        clients: the round's number of clients, split over the ranks by ``share``, for
            ``each_statistics``; None where the round is not split by client (a centralized
            batch).
    """

    def __init__(self, inner: Executor, local_samples: int, total_samples: int,
                 clients: int | None = None) -> None:
        self.inner, self.local, self.total = inner, local_samples, total_samples
        self.clients = clients

    def statistics(self, spec: StatsSpec) -> EncodingStats:
        return _sum_stats(self.inner.statistics(spec))

    def each_statistics(self, spec: StatsSpec) -> list[EncodingStats]:
        """Every client's statistics of the round, in the round's order, on every rank: this
        rank's clients' stacked into their rows of a zero stack, the stacks all-reduced (a
        sum with zeros, so exact)."""
        if self.clients is None:
            raise ValueError("client-by-client statistics need the rank's share of the "
                             "round's clients (a centralized batch has none)")
        mine, total = self.inner.each_statistics(spec), self.clients
        rows_of_mine = share(total, *rank_and_size())
        stacks = {}
        for name in mine[0]:
            rows = torch.stack([s[name] for s in mine])
            full = rows.new_zeros((total, *rows.shape[1:]))
            full[rows_of_mine] = rows
            stacks[name] = _sum(full)
        return [EncodingStats({k: v[i] for k, v in stacks.items()}) for i in range(total)]

    def updates(self, algorithm: Algorithm, shared: Moments | None,
                with_stats: StatsSpec | None) -> Updates:
        out = self.inner.updates(algorithm, shared, with_stats)
        w = self.local / self.total
        pseudo = {k: _sum(v * w) for k, v in out.pseudo_gradient.items()}
        some = next(iter(out.pseudo_gradient.values()))
        loss = torch.as_tensor(out.loss, dtype=torch.float64, device=some.device) * w
        clients = torch.tensor(float(out.num_clients), dtype=torch.float64, device=some.device)
        stats = _sum_stats(out.stats) if out.stats is not None else None
        return Updates(pseudo, _sum(loss), int(_sum(clients)), self.total, stats)


def share_client_states(store: ClientStates, mine: list[int]) -> None:
    """After a round over the ranks, every rank's ``store`` takes the states that each
    rank's clients (``mine``, this rank's) were left with, so that every rank holds the
    same store as one process would (FedU, FedEMA, MoCo's queue): each rank's entries
    gathered to all (``all_gather_object``; exact, they are copied, not summed)."""
    entries = {c: store.held(c) for c in mine}
    gathered: list[dict[int, dict[str, Tensor]] | None] = [None] * rank_and_size()[1]
    dist.all_gather_object(gathered, entries)
    for part in gathered:
        for client, entry in (part or {}).items():
            if entry is not None:
                store.hold(client, entry)


def local_segments(segments: Segments, rank: int, size: int) -> tuple[slice, Segments]:
    """The sample positions (a slice of the round's batch) and segments of this rank's
    clients."""
    clients = share(segments.num_clients, rank, size)
    counts = segments.counts[clients]
    first = int(segments.counts[:clients.start].sum())
    return slice(first, first + int(counts.sum())), Segments.from_counts(counts)


def split_batch(num_samples: int, rank: int, size: int) -> tuple[slice, Segments]:
    """A centralized step's batch split over the ranks: this rank's samples as one
    segment."""
    part = share(num_samples, rank, size)
    return part, Segments.from_counts([part.stop - part.start])


__all__ = ["AllReduceExecutor", "init_from_env", "launched", "local_segments", "rank_and_size",
           "share", "share_client_states", "split_batch"]
