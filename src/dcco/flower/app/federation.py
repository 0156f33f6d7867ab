"""The server side of the Flower app: find the nodes, run rounds, apply the server optimiser.

A round of ``dcco`` (paper §3.3) is two exchanges of plain ``train`` messages:

1. ``stats``: the server samples K clients as the simulator does, sends the model to the
   nodes hosting them and gets back each node's statistics (count + sums; each client's own
   under FedSC's cache of absent clients, ``train.absent_statistics = "cached"``, which the
   server keeps as the simulator does and saves with its checkpoints);
2. ``update``: the server sends the aggregate S_A (the merged statistics of the valid phase-1
   replies) to those nodes and gets back each node's update and count;

then it applies the sample-weighted average of the valid updates with Adam or LARS
(``dcco.core.optim``). ``cco_fedavg`` and ``contrastive_fedavg`` have only the update exchange.
Faults follow ``dcco.core.server``: a reply that is an error, late or malformed is dropped and
counted; phase 2 goes to the valid phase-1 repliers only; a phase with fewer than
``flower.min_survivors`` valid replies skips the round (no model change) and is logged.

The training state (model, optimiser, rounds done) is a ``dcco.run.pretraining.Pretraining``, the
simulator's, so checkpoints and run directories are the simulator's too. The messages'
layout is ``dcco.flower.app.wire``'s, their bytes are counted by ``dcco.flower.metering``, and
a whole run (its directory, loop and metrics) is ``dcco.flower.app.run``'s.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
from flwr.app import Message, MessageType
from flwr.serverapp import Grid
from torch import Tensor

from dcco.core.algorithm import RoundResult, RoundSkipped
from dcco.core.client_state import kept_by_clients
from dcco.core.seeding import generator
from dcco.core.server import ReplyTally
from dcco.core.stats import Moments
from dcco.flower import codec, secagg
from dcco.flower.app.wire import AppWire
from dcco.flower.appconfig import FlowerConfig
from dcco.flower.exchanges import PlainExchanges, SecureExchanges
from dcco.flower.metering import MeteredGrid
from dcco.flower.node_states import new_states_key
from dcco.flower.placement import NodeIdentity, assign
from dcco.methods.base import Segments
from dcco.run.planning import RoundPlan
from dcco.run.pretraining import Pretraining
from dcco.run.sampling import sample_clients

LOG = logging.getLogger("flwr.dcco")
CALIBRATION_SAMPLES = 64
"""Server images in the calibration step that sets the SecAgg+ ranges of a round."""


@dataclass(frozen=True)
class RoundAggregate:
    """A round's exchanges, before the server optimiser.

    Attributes:
        round: 0-based index.
        pseudo_gradient: −Σ_k (N_k/N)·Δ_k over the survivors, by parameter name; None when
            the round is skipped.
        shared: S_A, the aggregated moments sent in DCCO's phase 2 (None otherwise).
        loss: the survivors' sample-weighted loss (NaN when skipped).
        clients: sampled clients whose update was used.
        samples: their samples.
        skipped: why the round was skipped, or None.
        replies: per phase ("stats", "update"), what became of the requests.
        unreachable: sampled clients whose node is not connected.
        clipped: under SecAgg+, per phase, the mean fraction of values that were clipped.
    """

    round: int
    pseudo_gradient: dict[str, Tensor] | None
    shared: Moments | None
    loss: float
    clients: int
    samples: int
    skipped: str | None
    replies: dict[str, ReplyTally]
    unreachable: int = 0
    clipped: dict[str, float] = field(default_factory=dict)
    result: RoundResult | None = None
    """The round's outcome for the server optimiser; None when skipped."""
    traffic: dict[str, int] = field(default_factory=dict)
    """Content bytes the round's messages carried (``MeteredGrid.take``)."""


class Federation:
    """The server's view of the nodes and one round's exchanges.

    Args:
        grid: Flower's grid (or ``dcco.flower.testing.inprocess.InProcessGrid``).
        pt: the training state; its partition fixes the clients and their number.
        fcfg: the adapter's settings.
        states_key: the run's key for its clients' states on the nodes' disks
            (``dcco.flower.node_states``), sent with every instruction; None: a new one.
    """

    def __init__(self, grid: Grid, pt: Pretraining, fcfg: FlowerConfig,
                 states_key: str | None = None) -> None:
        self.grid, self.pt, self.fcfg = MeteredGrid(grid), pt, fcfg
        self.states_key = states_key or new_states_key()
        self.nodes: dict[int, int] = {}
        """Partition id → node id of the nodes in use."""
        self.identities: dict[int, NodeIdentity | None] = {}
        """Node id → identity of every node that answered (None: excluded)."""
        self.unresponsive: set[int] = set()
        """Nodes whose last exchange brought no valid answer (lost, timed out or failed): a
        new node claiming one's partition-id replaces it (a restarted SuperNode)."""
        self.num_partitions: int | None = None

    # ------------------------------------------------------------------ nodes

    def wait_for_nodes(self) -> None:
        """Block until ``min_nodes`` nodes are connected and identified."""
        deadline = time.monotonic() + self.fcfg.wait_nodes
        while True:
            self.discover()
            if len(self.nodes) >= self.fcfg.min_nodes:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"only {len(self.nodes)} usable SuperNodes after {self.fcfg.wait_nodes} s, "
                    f"flower.min_nodes = {self.fcfg.min_nodes}; are the SuperNodes running and "
                    f"started with --node-config \"partition-id=I num-partitions=N\"?")
            time.sleep(1.0)

    def discover(self) -> None:
        """Ask the connected nodes not yet known who they are, and place them."""
        new = [n for n in self.grid.get_node_ids() if n not in self.identities]
        if not new:
            return
        msgs = [Message(codec.node_query(), dst_node_id=n, message_type=MessageType.QUERY)
                for n in new]
        answers: dict[int, NodeIdentity] = {}
        for reply in self.grid.send_and_receive(msgs, timeout=self.fcfg.timeout):
            if not reply.has_error():
                try:
                    answers[reply.metadata.src_node_id] = codec.decode_identity(reply.content)
                except (KeyError, TypeError, ValueError) as e:
                    LOG.warning("node %s sent an unreadable identity: %s",
                                reply.metadata.src_node_id, e)
        self._place(answers)

    def _place(self, answers: dict[int, NodeIdentity]) -> None:
        expected = self.pt.partition.num_clients
        if self.num_partitions is None and answers:
            counts = Counter(a.num_partitions for a in answers.values())
            self.num_partitions = counts.most_common(1)[0][0]
        for node_id, ident in answers.items():
            problem = None
            if ident.num_clients != expected:
                problem = f"has {ident.num_clients} clients, the server's data {expected}"
            elif ident.num_partitions != self.num_partitions:
                problem = f"num-partitions {ident.num_partitions} != {self.num_partitions}"
            elif ident.partition_id in self.nodes:
                old = self.nodes[ident.partition_id]
                if old in self.unresponsive or old not in set(self.grid.get_node_ids()):
                    LOG.info("node %s takes partition-id %d over from node %s, which stopped "
                             "answering (a restarted SuperNode)", node_id, ident.partition_id,
                             old)
                    self.identities[old] = None
                    self.unresponsive.discard(old)
                else:
                    problem = (f"partition-id {ident.partition_id} is taken by node {old}, "
                               f"which still answers")
            if problem:
                LOG.warning("node %s excluded: %s", node_id, problem)
                self.identities[node_id] = None
                continue
            self.identities[node_id] = ident
            self.nodes[ident.partition_id] = node_id

    def targets(self, round_index: int) -> tuple[dict[int, list[int]], int]:
        """(node id → its sampled clients, number of sampled clients without a live node)."""
        cfg = self.pt.cfg
        clients = sample_clients(cfg.train.seed, round_index, self.pt.partition.num_clients,
                                 cfg.train.clients_per_round).tolist()
        online = set(self.grid.get_node_ids())
        targets, unreachable = {}, 0
        for pid, group in assign(clients, self.num_partitions or 1).items():
            node = self.nodes.get(pid)
            if node is None or node not in online:
                unreachable += len(group)
            else:
                targets[node] = group
        return targets, unreachable

    # ------------------------------------------------------------------ rounds

    def collect(self) -> RoundAggregate:
        """Run the exchanges of round ``pt.rounds_done`` (``Algorithm.round`` over the
        nodes); the model is left unchanged."""
        self.discover()
        r = self.pt.rounds_done
        self.grid.take()  # node discovery is not the round's traffic
        targets, unreachable = self.targets(r)
        kept = kept_by_clients(self.pt.model, self.pt.method)  # FedU's, FedEMA's, MoCo's
        weights = {k: v.detach() for k, v in self.pt.model.state_dict().items()
                   if k not in kept}
        wire = AppWire(self.pt, r, weights, self.states_key)
        if self.fcfg.secagg:
            exchanges = SecureExchanges(self.grid, wire, r, targets, self.fcfg.min_survivors,
                                        self.calibration(r), self.fcfg, self._max_weight)
        else:
            exchanges = PlainExchanges(self.grid.send_and_receive, wire, r, self.fcfg.timeout,
                                       targets, self.fcfg.min_survivors, self._answered)
        try:
            result = self.pt.algorithm.round(exchanges, self.pt.previous(r),
                                                 self.pt.round_noise(r),
                                                 exchanges.absent(self.pt.cache))
        except RoundSkipped as skip:
            LOG.warning("round %d skipped: %s", r + 1, skip.reason)
            return RoundAggregate(r, None, skip.shared, math.nan, 0, 0, skip.reason,
                                  exchanges.replies, unreachable, exchanges.clipped,
                                  traffic=self.grid.take())
        return RoundAggregate(r, result.pseudo_gradient, result.shared, result.loss,
                              result.num_clients, result.num_samples, None, exchanges.replies,
                              unreachable, exchanges.clipped, result, self.grid.take())

    def step(self) -> RoundAggregate:
        """``collect`` and apply the update with the server optimiser (unless skipped)."""
        agg = self.collect()
        if agg.result is not None:
            self.pt.apply(agg.result, self.pt.lr(agg.round), time.perf_counter())
        else:
            self.pt.rounds_done += 1
        return agg

    def _answered(self, asked: set[int], answered: set[int]) -> None:
        """After an exchange: the nodes asked that brought no valid-looking answer are
        unresponsive (a restarted SuperNode may take their partitions over)."""
        self.unresponsive = (self.unresponsive | (asked - answered)) - answered

    def _max_weight(self, targets: dict[int, list[int]]) -> float:
        """SecAgg+'s weight normaliser: the most samples one node holds in the round."""
        sizes = self.pt.partition.sizes
        return float(max(int(sizes[c].sum()) for c in targets.values()))

    def calibration(self, r: int) -> secagg.SecureScales:
        """The round's SecAgg+ ranges, from a step on the server's own images."""
        n = min(CALIBRATION_SAMPLES, self.pt.images.shape[0])
        ids = torch.randperm(self.pt.images.shape[0], generator=generator(
            self.pt.cfg.train.seed, "calibrate"))[:n]
        x1, x2 = self.pt.views(RoundPlan(ids, Segments.from_counts([n])), r)
        return secagg.calibrate(self.pt.model, self.pt.method, x1, x2,
                                self.pt.cfg.train.local_lr)


__all__ = ["CALIBRATION_SAMPLES", "Federation", "RoundAggregate"]
