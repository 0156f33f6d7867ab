"""The server side of the Flower app: find the nodes, run rounds, apply the server optimiser.

A round of ``dcco`` (paper §3.3) is two exchanges of plain ``train`` messages:

1. ``stats``: the server samples K clients as the simulator does, sends the model to the
   nodes hosting them and gets back each node's statistics (count + sums; each client's own
   under FedSC's cache of absent clients, ``train.absent_statistics = "cached"``, which the
   server keeps as the simulator does and saves with its checkpoints);
2. ``update``: the server sends the aggregate S_A (the merged statistics of the valid phase-1
   replies) to those nodes and gets back each node's update and count;

then it applies the sample-weighted average of the valid updates with Adam or LARS
(``dcco.optim``). ``cco_fedavg`` and ``contrastive_fedavg`` have only the update exchange.
Faults follow ``dcco.server``: a reply that is an error, late or malformed is dropped and
counted; phase 2 goes to the valid phase-1 repliers only; a phase with fewer than
``flower.min_survivors`` valid replies skips the round (no model change) and is logged.

The training state (model, optimiser, rounds done) is a ``dcco.train.Pretraining``, the
simulator's, so checkpoints and run directories are the simulator's too.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from flwr.app import Message, MessageType, RecordDict
from flwr.common.serde import recorddict_to_proto
from flwr.serverapp import Grid
from torch import Tensor

from dcco.algorithm import RoundResult, RoundSkipped
from dcco.client import ClientUpdate
from dcco.config import RunConfig
from dcco.data.datasets import ImageDataset
from dcco.flower import codec, polling, secagg
from dcco.flower.appconfig import FlowerConfig
from dcco.flower.codec import Instruction
from dcco.flower.exchanges import PlainExchanges, SecureExchanges
from dcco.flower.nodes import NodeIdentity, assign
from dcco.methods.base import Segments
from dcco.rundir import RunDir, RunDirError, config_differences
from dcco.seeding import generator
from dcco.server import (
    ReplyError,
    ReplyTally,
    validate_statistics,
    validate_update,
)
from dcco.stats import EncodingStats, Moments, StatsSpec
from dcco.train import (
    MetricsWindow,
    Pretraining,
    RoundMetrics,
    RoundPlan,
    pretraining_loop,
    resume_from_checkpoint,
    sample_clients,
)

LOG = logging.getLogger("flwr.dcco")
CALIBRATION_SAMPLES = 64
"""Server images in the calibration step that sets the SecAgg+ ranges of a round."""


def content_bytes(message: Message) -> int:
    """Bytes of a message's content as Flower serialises it (protobuf), framing aside."""
    return recorddict_to_proto(message.content).ByteSize()



class MeteredGrid:
    """A grid that counts the content bytes of every message it carries, per node: sent to
    it (``down``) and received from it (``up``). Everything else is the wrapped grid's.

    Every exchange of a round goes through ``send_and_receive``, Flower's SecAgg+ workflow
    included, so the counts are what a round really sends: models, statistics, updates, and
    SecAgg+'s key exchange, shares and masked vectors."""

    def __init__(self, grid: Grid) -> None:
        self._grid = grid
        self.down: Counter[int] = Counter()
        self.up: Counter[int] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """Push the messages, then pull their replies every ``POLL_S`` until all are in or
        ``timeout`` passes: Flower's ``Grid.send_and_receive``, whose 3 s sleep between pulls
        would add up to 3 s to every exchange (``push_messages`` and ``pull_messages`` are
        its public parts)."""
        messages = list(messages)
        for m in messages:
            self.down[m.metadata.dst_node_id] += content_bytes(m)
        replies = polling.send_and_receive(self._grid, messages, timeout)
        for r in replies:
            if not r.has_error():
                self.up[r.metadata.src_node_id] += content_bytes(r)
        return replies

    def take(self) -> dict[str, int]:
        """The counts since the last ``take``: totals and the mean per node that took part
        (``per_node_up``/``_down``); the counters start again from zero."""
        nodes = set(self.down) | set(self.up)
        out = {"up": sum(self.up.values()), "down": sum(self.down.values()),
               "nodes": len(nodes)}
        out |= {"per_node_up": out["up"] // max(len(nodes), 1),
                "per_node_down": out["down"] // max(len(nodes), 1)}
        self.down, self.up = Counter(), Counter()
        return out


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
        grid: Flower's grid (or ``dcco.flower.inprocess.InProcessGrid``).
        pt: the training state; its partition fixes the clients and their number.
        fcfg: the adapter's settings.
    """

    def __init__(self, grid: Grid, pt: Pretraining, fcfg: FlowerConfig) -> None:
        self.grid, self.pt, self.fcfg = MeteredGrid(grid), pt, fcfg
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
        """Run the exchanges of round ``pt.rounds_done`` (``Algorithm.run_round`` over the
        nodes); the model is left unchanged."""
        self.discover()
        r = self.pt.rounds_done
        self.grid.take()  # node discovery is not the round's traffic
        targets, unreachable = self.targets(r)
        weights = {k: v.detach() for k, v in self.pt.model.state_dict().items()}
        wire = AppWire(self.pt, r, weights)
        if self.fcfg.secagg:
            exchanges = SecureExchanges(self.grid, wire, r, targets, self.fcfg.min_survivors,
                                        self.calibration(r), self.fcfg, self._max_weight)
        else:
            exchanges = PlainExchanges(self.grid.send_and_receive, wire, r, self.fcfg.timeout,
                                       targets, self.fcfg.min_survivors, self._answered)
        absent = None
        if self.pt.cache is not None:
            cache = self.pt.cache

            def absent(fresh: list[EncodingStats]) -> EncodingStats:
                """FedSC's cache: fresh statistics of the clients that answered."""
                return cache.merge_round(exchanges.answered, fresh)
        try:
            result = self.pt.algorithm.run_round(exchanges, self.pt.previous(r),
                                                 self.pt.round_noise(r), absent)
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


class AppWire:
    """dcco's app's layout of a round's messages (``dcco.flower.codec``): each node hosts
    several of the run's clients, named in its instruction, and its replies are checked
    against the server's own model (``dcco.flower.exchanges.Wire``).

    Args:
        pt: the training state (the model's width and trained parameters).
        r: the round. weights: the global model (``state_dict``).
    """

    def __init__(self, pt: Pretraining, r: int, weights: dict[str, Tensor]) -> None:
        self.pt, self.r, self.weights = pt, r, weights

    def instruction(self, phase: str, clients: list[int], model: bool,
                    shared: Moments | None = None, with_stats: bool = False) -> Instruction:
        return Instruction(phase, self.r, tuple(clients), self.weights if model else None,
                           shared, with_stats)

    def stats_message(self, clients: list[int]) -> RecordDict:
        return codec.encode_instruction(self.instruction("stats", clients, True))

    def update_message(self, clients: list[int], model: bool, shared: Moments | None,
                       with_stats: bool) -> RecordDict:
        return codec.encode_instruction(self.instruction("update", clients, model, shared,
                                                         with_stats))

    def stats_check(self, contents: list[RecordDict], spec: StatsSpec
                    ) -> Callable[[RecordDict], EncodingStats]:
        d = self.pt.model.projection_dim
        return lambda c: validate_statistics(codec.decode_stats_reply(c), d, d, spec=spec)

    def update_check(self, contents: list[RecordDict], with_stats: StatsSpec | None
                     ) -> Callable[[RecordDict], tuple[ClientUpdate, EncodingStats | None]]:
        shapes = {name: tuple(p.shape) for name, p in self.pt.params}
        d = self.pt.model.projection_dim
        return lambda c: validate_update_reply(c, shapes, d, with_stats)

    def each_stats_check(self, contents: list[RecordDict], spec: StatsSpec
                         ) -> Callable[[RecordDict, int], list[EncodingStats]]:
        d = self.pt.model.projection_dim
        return lambda c, clients: [validate_statistics(s, d, d, spec=spec)
                                   for s in codec.decode_each_stats_reply(c, clients)]

    def params(self) -> dict[str, Tensor]:
        return dict(self.pt.params)


def validate_update_reply(content: RecordDict, shapes: dict[str, tuple[int, ...]], d: int,
                          with_stats: StatsSpec | None) -> tuple[Any, EncodingStats | None]:
    """An update reply → (``ClientUpdate``, its statistics in stale mode, else None), or
    ``ReplyError``; the statistics must be of as many samples as the update."""
    delta, count, loss = codec.decode_update_reply(content)
    update = validate_update(delta, count, shapes, loss=loss)
    if with_stats is None:
        return update, None
    stats = validate_statistics(codec.decode_stats_reply(content), d, d, spec=with_stats)
    if int(stats.count) != update.num_samples:
        raise ReplyError("count", f"statistics of {int(stats.count)} samples with an update "
                                  f"of {update.num_samples}")
    return update, stats


# ---------------------------------------------------------------------- the run


def open_run(cfg: RunConfig, fcfg: FlowerConfig) -> RunDir:
    """The run directory of a Flower run: created, or reopened to resume."""
    path = Path(fcfg.run_dir or
                f"runs/flower-{cfg.train.method}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    if not fcfg.resume:
        try:
            run = RunDir.create(path, cfg)
        except RunDirError:  # its message speaks of the CLI's flags, not the app's keys
            raise RunDirError(
                f"flower.run_dir {path} already holds a run; continue it with "
                f"--run-config \"flower.resume=true flower.run_dir='{path}'\", or choose "
                f"another flower.run_dir") from None
    else:
        if not (path / "config.toml").is_file():
            raise RunDirError(f"flower.resume = true, but flower.run_dir {path} holds no dcco "
                              f"run (no config.toml); set flower.run_dir to the run to continue")
        run = RunDir.open(path)
        if differ := config_differences(run.config(), cfg):
            raise RunDirError(f"flower.resume: {path} holds a run with another config "
                              f"({differ}); cannot resume it with this one")
        run.stop_path.unlink(missing_ok=True)  # a request to stop the run that ended
    run.update_summary(backend="flower", flower=asdict(fcfg))
    return run


def run_federated(grid: Grid, cfg: RunConfig, fcfg: FlowerConfig, train_set: ImageDataset,
                  test_set: ImageDataset | None = None) -> dict[str, Any]:
    """Pretrain over Flower into a run directory in the simulator's format.

    Writes ``config.toml``, ``version.json``, ``metrics.jsonl`` (the simulator's round records,
    plus ``replies``, ``skipped`` and ``unreachable`` counters; a skipped round also gets a
    record ``{"round", "skipped": reason}``), ``checkpoint.safetensors`` and ``summary.json``,
    so ``dcco evaluate`` and ``dcco compare`` work on Flower runs.

    Args:
        grid: the ServerApp's grid.
        cfg: the run config. fcfg: the adapter's settings.
        train_set: the server's training split (client partition, k-NN bank, calibration).
        test_set: the k-NN monitor's queries; None disables the monitor.

    A file ``STOP`` created in the run directory stops the run at its next logged round, with
    a checkpoint and a ``{"round", "stopped"}`` record, as an unfinished run that
    ``flower.resume = true`` continues; ``flwr stop`` instead ends the ServerApp wherever it
    is, and resuming goes back to the last checkpoint.

    Returns:
        The summary written to ``summary.json``; for a stopped run ``{"rounds", "stopped"}``.
    """
    run = open_run(cfg, fcfg)
    LOG.info("dcco: run directory %s", run.path.resolve())
    pt = Pretraining(cfg, train_set)
    if fcfg.resume:
        resume_from_checkpoint(pt, run)
    else:
        run.truncate_metrics(0)
    fed = Federation(grid, pt, fcfg)
    fed.wait_for_nodes()
    LOG.info("dcco: %d nodes for %d partitions, %d clients", len(fed.nodes),
             fed.num_partitions, pt.partition.num_clients)

    def step() -> RoundMetrics:
        start = time.perf_counter()
        agg = fed.step()
        return RoundMetrics(pt.rounds_done, agg.loss, pt.lr(agg.round), agg.clients,
                            agg.samples, time.perf_counter() - start,
                            agg.result.exchanges if agg.result else 0, agg.skipped, agg)

    def log(record: dict[str, Any]) -> None:
        loss = f"{record['loss']:.4g}" if "loss" in record else "n/a (skipped)"
        LOG.info("dcco: round %d/%d loss %s", record["round"], cfg.train.rounds, loss)

    summary = pretraining_loop(pt, run, step, train_set, test_set, window=FlowerWindow,
                               meta={"backend": "flower"}, on_log=log, stop=run.stop_requested)
    if "stopped" in summary:
        LOG.info("dcco: %s after round %d; continue it with flower.resume = true",
                 summary["stopped"], summary["rounds"])
    return summary


class FlowerWindow(MetricsWindow):
    """The simulator's metrics window plus Flower's counters: skipped rounds, unreachable
    clients, the fate of the requests per phase, and the SecAgg+ clipped fraction."""

    def __init__(self) -> None:
        super().__init__()
        self.unreachable = 0
        self.replies: dict[str, ReplyTally] = {}
        self.clipped: dict[str, list[float]] = {}
        self.traffic: Counter[str] = Counter()

    def add(self, m: RoundMetrics) -> None:
        super().add(m)
        agg: RoundAggregate = m.details
        self.unreachable += agg.unreachable
        for phase, tally in agg.replies.items():
            self.replies[phase] = self.replies.get(phase, ReplyTally()) + tally
        for phase, value in agg.clipped.items():
            self.clipped.setdefault(phase, []).append(value)
        self.traffic.update(agg.traffic)

    def record(self, round_done: int, lr: float) -> dict[str, Any]:
        rec = super().record(round_done, lr) | {
            "rounds_skipped": self.skipped, "unreachable": self.unreachable,
            "replies": {p: t.as_dict() for p, t in self.replies.items()}}
        if self.clipped:
            rec["secagg_clipped"] = {p: max(v) for p, v in self.clipped.items()}
        if self.traffic:  # measured from the messages, per round of the window
            rec["message_bytes"] = {k: v // max(self.rounds, 1)
                                    for k, v in self.traffic.items()}
        return rec
