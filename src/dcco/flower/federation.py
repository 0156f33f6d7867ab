"""The server side of the Flower app: find the nodes, run rounds, apply the server optimiser.

A round of ``dcco`` (paper §3.3) is two exchanges of plain ``train`` messages:

1. ``stats``: the server samples K clients as the simulator does, sends the model to the
   nodes hosting them and gets back each node's statistics (count + sums);
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid
from torch import Tensor

from dcco.checkpoint import load_checkpoint, save_checkpoint
from dcco.config import RunConfig, to_toml
from dcco.data.datasets import ImageDataset
from dcco.flower import codec, secagg
from dcco.flower.appconfig import FlowerConfig
from dcco.flower.codec import Instruction
from dcco.flower.nodes import NodeIdentity, assign
from dcco.methods.base import Segments
from dcco.optim import apply_pseudo_gradient, set_lr
from dcco.rundir import RunDir, RunDirError
from dcco.seeding import generator
from dcco.server import (
    ReplyTally,
    accept_valid,
    aggregate_updates,
    skip_reason,
    validate_statistics,
    validate_update,
)
from dcco.stats import Moments, merge
from dcco.train import Pretraining, RoundPlan, monitor_knn, sample_clients

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


class Federation:
    """The server's view of the nodes and one round's exchanges.

    Args:
        grid: Flower's grid (or ``dcco.flower.inprocess.InProcessGrid``).
        pt: the training state; its partition fixes the clients and their number.
        fcfg: the adapter's settings.
    """

    def __init__(self, grid: Grid, pt: Pretraining, fcfg: FlowerConfig) -> None:
        self.grid, self.pt, self.fcfg = grid, pt, fcfg
        self.nodes: dict[int, int] = {}
        """Partition id → node id of the nodes in use."""
        self.identities: dict[int, NodeIdentity | None] = {}
        """Node id → identity of every node that answered (None: excluded)."""
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
                problem = f"partition-id {ident.partition_id} is taken"
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
        """Run the exchanges of round ``pt.rounds_done``; the model is left unchanged."""
        self.discover()
        r = self.pt.rounds_done
        targets, unreachable = self.targets(r)
        weights = {k: v.detach() for k, v in self.pt.model.state_dict().items()}
        run = self._secure_round if self.fcfg.secagg else self._plain_round
        return replace(run(r, targets, weights), unreachable=unreachable)

    def step(self) -> RoundAggregate:
        """``collect`` and apply the update with the server optimiser (unless skipped)."""
        agg = self.collect()
        if agg.pseudo_gradient is not None:
            set_lr(self.pt.optimizer, self.pt.lr(agg.round))
            grads = [agg.pseudo_gradient[name] for name, _ in self.pt.params]
            apply_pseudo_gradient(self.pt.optimizer, [p for _, p in self.pt.params], grads)
        self.pt.rounds_done += 1
        return agg

    def _exchange(self, r: int, contents: dict[int, RecordDict],
                  tally: ReplyTally) -> dict[int, RecordDict]:
        """Send ``train`` messages and return the contents of the non-error replies."""
        msgs = [Message(c, dst_node_id=n, message_type=MessageType.TRAIN, group_id=str(r))
                for n, c in contents.items()]
        tally.sent += len(msgs)
        got: dict[int, RecordDict] = {}
        failed: set[int] = set()
        for reply in self.grid.send_and_receive(msgs, timeout=self.fcfg.timeout):
            node = reply.metadata.src_node_id
            if node not in contents or node in got or node in failed:
                continue  # not asked, or a duplicate
            if reply.has_error():
                failed.add(node)
            else:
                got[node] = reply.content
        tally.failed += len(failed)
        tally.missing += len(contents) - len(got) - len(failed)
        return got

    def _plain_round(self, r: int, targets: dict[int, list[int]],
                     weights: dict[str, Tensor]) -> RoundAggregate:
        method, replies = self.pt.method, {}
        shared = None
        if method.needs_statistics:
            tally = replies["stats"] = ReplyTally()
            got = self._exchange(r, {n: codec.encode_instruction(
                Instruction("stats", r, tuple(c), weights)) for n, c in targets.items()}, tally)
            d = self.pt.model.projection_dim
            valid = accept_valid(got.values(), lambda c: validate_statistics(
                codec.decode_stats_reply(c), d, d), tally)
            nodes = list(got)
            targets = {nodes[i]: targets[nodes[i]] for i, _ in valid}
            if reason := skip_reason("stats", len(valid), self.fcfg.min_survivors):
                return _skipped(r, reason, replies)
            shared = merge([s for _, s in valid]).moments()
        tally = replies["update"] = ReplyTally()
        model = None if method.needs_statistics else weights
        got = self._exchange(r, {n: codec.encode_instruction(
            Instruction("update", r, tuple(c), model, shared)) for n, c in targets.items()}, tally)
        shapes = {name: tuple(p.shape) for name, p in self.pt.params}
        valid = accept_valid(got.values(), lambda c: _update(c, shapes), tally)
        if reason := skip_reason("update", len(valid), self.fcfg.min_survivors):
            return _skipped(r, reason, replies, shared)
        nodes, updates = list(got), [u for _, u in valid]
        total = sum(u.num_samples for u in updates)
        return RoundAggregate(
            r, aggregate_updates(updates, dict(self.pt.params)), shared,
            sum(u.num_samples / total * u.loss for u in updates),
            sum(len(targets[nodes[i]]) for i, _ in valid), total, None, replies)

    # ------------------------------------------------------------------ secure rounds

    def calibration(self, r: int) -> secagg.SecureScales:
        """The round's SecAgg+ ranges, from a step on the server's own images."""
        n = min(CALIBRATION_SAMPLES, self.pt.images.shape[0])
        ids = torch.randperm(self.pt.images.shape[0], generator=generator(
            self.pt.cfg.train.seed, "calibrate"))[:n]
        x1, x2 = self.pt.views(RoundPlan(ids, Segments.from_counts([n])), r)
        return secagg.calibrate(self.pt.model, self.pt.method, x1, x2,
                                self.pt.cfg.train.local_lr)

    def _max_weight(self, targets: dict[int, list[int]]) -> float:
        sizes = self.pt.partition.sizes
        return float(max(int(sizes[c].sum()) for c in targets.values()))

    def _secure_exchange(self, r: int, targets: dict[int, list[int]],
                         make: Callable[[list[int]], Instruction], clip: float,
                         scales: secagg.SecureScales,
                         tally: ReplyTally) -> secagg.SecureAverage | None:
        if not targets:
            return None
        params = secagg.SecureParams(self._max_weight(targets), clip,
                                     self.fcfg.secagg_quantization, scales)
        fitins = {n: secagg.secure_instruction(make(c), params) for n, c in targets.items()}
        tally.sent += len(fitins)
        result = secagg.secure_average(self.grid, fitins, r, params.max_weight, clip, self.fcfg)
        tally.accepted += len(result.counts) if result else 0
        tally.failed += len(fitins) - (len(result.counts) if result else 0)
        if result is not None and not all(bool(torch.isfinite(torch.from_numpy(v)).all())
                                          for v in result.values):
            tally.reject("nonfinite")
            return None
        return result

    def _secure_round(self, r: int, targets: dict[int, list[int]],
                      weights: dict[str, Tensor]) -> RoundAggregate:
        method, fcfg, replies, clipped = self.pt.method, self.fcfg, {}, {}
        scales = self.calibration(r)
        shared = None
        if method.needs_statistics:
            tally = replies["stats"] = ReplyTally()
            res = self._secure_exchange(r, targets, lambda c: Instruction(
                "stats", r, tuple(c), weights), fcfg.secagg_stats_clip, scales, tally)
            n = len(res.counts) if res else 0
            if reason := skip_reason("stats", n, fcfg.min_survivors):
                return _skipped(r, reason, replies)
            u = Moments(*(torch.from_numpy(v) for v in res.values[:5]))
            shared, clipped["stats"] = secagg.unstandardise(u, scales), float(res.values[5][0])
            targets = {k: targets[k] for k in res.counts}
        tally = replies["update"] = ReplyTally()
        model = None if method.needs_statistics else weights
        res = self._secure_exchange(r, targets, lambda c: Instruction(
            "update", r, tuple(c), model, shared), fcfg.secagg_update_clip, scales, tally)
        if reason := skip_reason("update", len(res.counts) if res else 0, fcfg.min_survivors):
            return _skipped(r, reason, replies, shared)
        pseudo = {name: (-scales.update * torch.from_numpy(v)).to(p.dtype).reshape(p.shape)
                  for (name, p), v in zip(self.pt.params, res.values[:-1], strict=True)}
        loss_entry, clipped["update"] = (float(x) for x in res.values[-1])
        return RoundAggregate(r, pseudo, shared, loss_entry * scales.loss,
                              sum(len(targets[k]) for k in res.counts), sum(res.counts.values()),
                              None, replies, clipped=clipped)


def _update(content: RecordDict, shapes: dict[str, tuple[int, ...]]) -> Any:
    delta, count, loss = codec.decode_update_reply(content)
    return validate_update(delta, count, shapes, loss=loss)


def _skipped(r: int, reason: str, replies: dict[str, ReplyTally],
             shared: Moments | None = None) -> RoundAggregate:
    LOG.warning("round %d skipped: %s", r + 1, reason)
    return RoundAggregate(r, None, shared, math.nan, 0, 0, reason, replies)


# ---------------------------------------------------------------------- the run


def open_run(cfg: RunConfig, fcfg: FlowerConfig) -> RunDir:
    """The run directory of a Flower run: created, or reopened to resume."""
    path = Path(fcfg.run_dir or
                f"runs/flower-{cfg.train.method}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    if not fcfg.resume:
        run = RunDir.create(path, cfg)
    else:
        run = RunDir.open(path)
        if to_toml(run.config()) != to_toml(cfg):
            raise RunDirError(f"{path} holds a run with another config; cannot resume it "
                              f"with this one")
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

    Returns:
        The summary written to ``summary.json``.
    """
    run = open_run(cfg, fcfg)
    LOG.info("dcco: run directory %s", run.path.resolve())
    pt = Pretraining(cfg, train_set)
    if fcfg.resume and run.checkpoint_path.is_file():
        pt.rounds_done = load_checkpoint(run.checkpoint_path, pt.model, pt.optimizer)
    run.truncate_metrics(pt.rounds_done)
    fed = Federation(grid, pt, fcfg)
    fed.wait_for_nodes()
    LOG.info("dcco: %d nodes for %d partitions, %d clients", len(fed.nodes),
             fed.num_partitions, pt.partition.num_clients)
    started, window = time.perf_counter(), _Window()
    while not pt.finished:
        agg = fed.step()
        window.add(agg)
        m, last = pt.rounds_done, pt.finished
        if agg.skipped:
            run.append_metrics({"round": m, "skipped": agg.skipped})
        if m % cfg.train.log_every == 0 or last:
            run.append_metrics(window.record(m, pt.lr(agg.round)))
            LOG.info("dcco: round %d/%d loss %s", m, cfg.train.rounds, window.last_loss)
            window = _Window()
        if test_set is not None and ((cfg.train.knn_every and m % cfg.train.knn_every == 0)
                                     or last):
            run.append_metrics({"round": m, "knn": monitor_knn(pt, train_set, test_set)})
        if m % cfg.train.checkpoint_every == 0 or last:
            save_checkpoint(run.checkpoint_path, pt.model, pt.optimizer, m,
                            meta={"method": cfg.train.method, "backend": "flower"})
    return _summary(run, cfg, pt, time.perf_counter() - started)


def _summary(run: RunDir, cfg: RunConfig, pt: Pretraining, seconds: float) -> dict[str, Any]:
    history = run.metrics()
    losses = [r["loss"] for r in history if "loss" in r]
    knn = [r["knn"] for r in history if "knn" in r]
    return run.update_summary(
        method=cfg.train.method, dataset=cfg.data.dataset, rounds=pt.rounds_done,
        alpha=cfg.data.alpha, samples_per_client=cfg.data.samples_per_client,
        clients_per_round=cfg.train.clients_per_round,
        final_loss=losses[-1] if losses else None, knn=knn[-1] if knn else None,
        skipped_rounds=sum(1 for r in history if isinstance(r.get("skipped"), str)),
        pretrain_seconds_this_session=seconds,
    )


@dataclass
class _Window:
    """Rounds since the last metrics record (the simulator logs windows of log_every)."""

    rounds: int = 0
    losses: list[float] = field(default_factory=list)
    clients: int = 0
    samples: int = 0
    skipped: int = 0
    unreachable: int = 0
    replies: dict[str, ReplyTally] = field(default_factory=dict)
    clipped: dict[str, list[float]] = field(default_factory=dict)
    start: float = field(default_factory=time.perf_counter)

    @property
    def last_loss(self) -> str:
        return f"{self.losses[-1]:.4g}" if self.losses else "n/a (skipped)"

    def add(self, agg: RoundAggregate) -> None:
        self.rounds += 1
        self.skipped += agg.skipped is not None
        if agg.skipped is None:
            self.losses.append(agg.loss)
            self.clients += agg.clients
            self.samples += agg.samples
        self.unreachable += agg.unreachable
        for phase, tally in agg.replies.items():
            self.replies[phase] = self.replies.get(phase, ReplyTally()) + tally
        for phase, value in agg.clipped.items():
            self.clipped.setdefault(phase, []).append(value)

    def record(self, round_done: int, lr: float) -> dict[str, Any]:
        done = self.rounds - self.skipped
        rec: dict[str, Any] = {"round": round_done}
        if self.losses:
            rec["loss"] = sum(self.losses) / len(self.losses)
        rec |= {"lr": lr, "rounds_per_sec": self.rounds / (time.perf_counter() - self.start),
                "clients": self.clients // max(done, 1), "samples": self.samples // max(done, 1),
                "rounds_skipped": self.skipped, "unreachable": self.unreachable,
                "replies": {p: t.as_dict() for p, t in self.replies.items()}}
        if self.clipped:
            rec["secagg_clipped"] = {p: max(v) for p, v in self.clipped.items()}
        return rec
