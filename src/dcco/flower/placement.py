"""Where clients live in a Flower deployment (no torch, no Flower).

The run's clients are the simulator's (``dcco.run.planning.build_partition`` on the training labels,
same seed). A SuperNode with ``partition-id`` i of ``num-partitions`` N hosts the clients k
with k mod N = i, like a hospital or an edge server holding several users' data; with N equal
to the number of clients, each node is exactly one client. Each round the server samples K
clients exactly as the simulator does (``dcco.run.sampling.sample_clients(seed, r, ...)``) and asks
every node that hosts sampled clients for their work in one message (``dcco.flower.app.nodes``
computes it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def partition_of(client: int, num_partitions: int) -> int:
    """The partition id (SuperNode) hosting client ``client``."""
    return client % num_partitions


def hosted_clients(partition_id: int, num_partitions: int, num_clients: int) -> range:
    """The clients hosted by node ``partition_id`` out of ``num_clients``."""
    return range(partition_id, num_clients, num_partitions)


def assign(clients: Sequence[int], num_partitions: int) -> dict[int, list[int]]:
    """Sampled clients grouped by the partition id of their node, in sampled order."""
    groups: dict[int, list[int]] = {}
    for k in clients:
        groups.setdefault(partition_of(int(k), num_partitions), []).append(int(k))
    return groups


@dataclass(frozen=True)
class NodeIdentity:
    """What a node tells the server about itself (the answer to a ``query`` message).

    Attributes:
        partition_id: i, from ``--node-config partition-id=i``.
        num_partitions: N, from ``--node-config num-partitions=N``.
        num_clients: the number of clients of the whole partition, from its own data (a
            check that all nodes and the server split the data alike).
    """

    partition_id: int
    num_partitions: int
    num_clients: int

    def __post_init__(self) -> None:
        if not 0 <= self.partition_id < self.num_partitions:
            raise ValueError(f"node-config partition-id = {self.partition_id} must lie in "
                             f"[0, num-partitions = {self.num_partitions})")


def node_partition(node_config: dict[str, object]) -> tuple[int, int]:
    """(partition-id, num-partitions) of a SuperNode's ``--node-config``."""
    try:
        pid, n = node_config["partition-id"], node_config["num-partitions"]
    except KeyError as e:
        raise ValueError(f"the SuperNode's node config lacks {e.args[0]!r}; start it with "
                         f"--node-config \"partition-id=I num-partitions=N\"") from None
    if not (isinstance(pid, int) and isinstance(n, int)) or isinstance(pid, bool) or n < 1:
        raise ValueError(f"node config partition-id = {pid!r}, num-partitions = {n!r} must be "
                         f"integers with num-partitions >= 1")
    return pid, n


def check_hosted(clients: Sequence[int], identity: NodeIdentity) -> None:
    """Refuse clients this node does not host (a server or configuration error)."""
    for k in clients:
        if not (0 <= k < identity.num_clients
                and partition_of(k, identity.num_partitions) == identity.partition_id):
            raise ValueError(
                f"client {k} is not hosted by node partition-id {identity.partition_id} of "
                f"{identity.num_partitions} ({identity.num_clients} clients)")


__all__ = ["NodeIdentity", "assign", "check_hosted", "hosted_clients", "node_partition",
           "partition_of"]
