"""FedSC's server cache for partial participation (Jing et al. 2024, its code's
``COV_list``): the server keeps every client's last statistics, and a round's aggregate merges
the fresh statistics of the round's clients with the last ones of every client seen before
but absent now (``train.absent_statistics = "cached"``).

The aggregate then stands for all the clients seen, not the round's batch: a round is no
longer one centralized step (the absent clients' statistics are those of older models), and
gradients still flow only through each client's own fresh samples. The cache holds each
client's raw sums at the server, which differential privacy and SecAgg+ exist to prevent, so
it is refused with either (``dcco.config``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from dcco.core.stats import EncodingStats

MAX_CACHE_BYTES = 4 << 30
"""The largest cache a run may plan for (``cache_bytes``): beyond it the run is refused."""


def cache_bytes(num_clients: int, rounds: int, clients_per_round: int, values: int) -> int:
    """Bytes the cache can grow to: one float64 row of ``values`` per client it can see."""
    return min(num_clients, rounds * clients_per_round) * (values + 1) * 8


class StatisticsCache:
    """Every client's last statistics (on the CPU, float64) and their running sum.

    Attributes:
        last: client id → its statistics when it last took part.
        total: the sum of ``last`` over all clients, kept up to date round by round (not
            summed afresh, and saved with checkpoints, so a resumed run adds in the same order).
    """

    def __init__(self) -> None:
        self.last: dict[int, EncodingStats] = {}
        self.total: EncodingStats | None = None

    def merge_round(self, clients: Sequence[int], fresh: Sequence[EncodingStats]) -> EncodingStats:
        """Replace the round's clients' entries by their fresh statistics and return the
        aggregate of all clients seen: Σ_{k in round} S_k + Σ_{k seen, absent} S_k^last,
        on the fresh statistics' device."""
        if len(clients) != len(fresh) or not fresh:
            raise ValueError(f"the cache takes one statistics per client of the round, got "
                             f"{len(fresh)} for {len(clients)} clients")
        device = fresh[0].count.device
        for client, stats in zip(clients, fresh, strict=True):
            new = {k: v.detach().to("cpu", torch.float64) for k, v in stats.items()}
            old = self.last.get(int(client))
            if self.total is None:
                total = new
            elif old is None:  # in the fresh statistics' order of names
                total = {k: self.total[k] + v for k, v in new.items()}
            else:
                total = {k: self.total[k] + v - old[k] for k, v in new.items()}
            self.total = EncodingStats(total)
            self.last[int(client)] = EncodingStats(new)
        return EncodingStats({k: v.to(device) for k, v in self.total.items()})

    def state(self) -> dict[str, Tensor]:
        """The cache as named tensors for a checkpoint: the client ids, each sum stacked by
        client, and the running total."""
        if self.total is None:
            return {}
        ids = sorted(self.last)
        out = {"cache.clients": torch.tensor(ids, dtype=torch.int64)}
        for name in self.total:
            out[f"cache.last.{name}"] = torch.stack([self.last[i][name] for i in ids])
            out[f"cache.total.{name}"] = self.total[name]
        return out

    @classmethod
    def from_state(cls, state: dict[str, Tensor]) -> StatisticsCache:
        """The cache of ``state`` (an empty one when it holds none)."""
        cache = cls()
        if "cache.clients" not in state:
            return cache
        ids = state["cache.clients"].tolist()
        names = [k[len("cache.total."):] for k in state if k.startswith("cache.total.")]
        cache.total = EncodingStats({n: state[f"cache.total.{n}"].to("cpu", torch.float64)
                                     for n in names})
        for row, client in enumerate(ids):
            cache.last[int(client)] = EncodingStats(
                {n: state[f"cache.last.{n}"][row].to("cpu", torch.float64) for n in names})
        return cache
