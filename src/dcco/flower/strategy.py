"""DCCO as a Flower strategy for your own ServerApp (the Message API, flwr ≥ 1.21).

Where your ServerApp calls Flower's ``FedAvg(...).start(...)``, call ``DCCO(...).start(...)``
with the same arguments; your ClientApp's ``@app.train()`` handler answers with
``dcco.flower.answer`` (``dcco.flower.userapp``). See docs/own_code.md, "Flower".

A round is DCCO's: the strategy samples nodes, and on the same nodes runs two exchanges of
``train`` messages:

1. ``stats``: the global model goes down (``arrays``); each node replies with its sample
   count and the method's sums of its encodings (``statistics``);
2. ``update``: S_A, the merged statistics of the valid replies, goes down to the nodes that
   gave them (the model stays on the node from phase 1); each replies with its update (a
   delta per trained parameter, ``arrays``) and its count and loss (``metrics``).

The server averages the valid updates by sample count and steps its optimiser (LARS or Adam,
``dcco.optim``) with the negated average as the gradient. Every reply is checked as
``dcco.api`` checks it; a malformed or failed one is left out and counted, a node lost after
phase 1 counts in S_A but not in the update (``dcco.server``'s rule), and a phase with fewer
than ``min_survivors`` valid replies skips the round (no model change; its reason in the
round's metrics). Methods without statistics (``cco_fedavg``, ``contrastive_fedavg``) run the
update exchange alone, with the model. With ``secagg=SecAgg(...)`` both exchanges go through
Flower's SecAgg+ (``dcco.flower.secure_round``): the server sees only their averages.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import Tensor

from dcco.api import merge_statistics
from dcco.client import ClientUpdate
from dcco.flower import codec, secagg, secure_round
from dcco.flower.codec import Instruction
from dcco.flower.polling import push_and_pull
from dcco.flower.secure_round import SecAgg
from dcco.methods.base import LossConfig
from dcco.methods.registry import build_method
from dcco.optim import OptimConfig, apply_pseudo_gradient, build_optimizer, scheduled_lr, set_lr
from dcco.seeding import derive_seed
from dcco.server import ReplyError, ReplyTally, accept_valid, pooled_update, validate_update
from dcco.stats import Moments

LOG = logging.getLogger("flwr.dcco")
PHASE, ROUND, VIEWS_SEED, METHOD, LOCAL_LR = ("phase", "server-round", "views-seed", "method",
                                              "local-lr")
"""Keys of the ``config`` record the strategy sends (``dcco.flower.userapp`` reads them)."""


def moments_record(m: Moments) -> ArrayRecord:
    """S_A (its means and count) as one packed ``ArrayRecord``."""
    return codec.array_record({k: v for k, v in m.items()} | {"count": m.count.reshape(1)})


def moments_of(record: ArrayRecord) -> Moments:
    """``moments_record``'s inverse (float64)."""
    tensors = {k: v.to(torch.float64) for k, v in codec.tensors_of(record).items()}
    count = tensors.pop("count").reshape(())
    return Moments(tensors, count=count)


class DCCO(Strategy):
    """DCCO (and the other methods of dcco) for your own Flower app.

    Args:
        fraction_train: the fraction of connected nodes sampled a round (at least
            ``min_train_nodes``), as Flower's ``FedAvg``.
        min_train_nodes: the fewest nodes sampled a round.
        min_available_nodes: nodes to wait for before a round.
        method: ``dcco``, ``dvicreg`` (statistics methods, two exchanges) or a FedAvg method
            of dcco (``cco_fedavg``, ``contrastive_fedavg``; one exchange).
        optimizer, lr, weight_decay, warmup_rounds, schedule: the server optimiser
            (``dcco.optim.OptimConfig``: ``lars`` or ``adam``; ``schedule`` ``cosine`` over
            the run's rounds or ``constant``); ``vector_lr_scale`` the 1-D parameters' share.
        local_lr: the clients' SGD rate (paper: 1.0).
        min_survivors: the fewest valid replies a phase needs, or the round is skipped.
        seed: node sampling and the views' seed of each round.
        trained: the names of the arrays the clients train (their deltas); None: those of
            the first round's valid-looking updates (the names most replies carry), kept for
            the run. The model's other floating arrays (batch norm's running statistics) are
            the sample-weighted average of what the nodes hold after their step, as FedAvg
            averages them; integer arrays stay as they are. Under SecAgg+, the parameters
            of ``secagg.model`` that require gradients.
        secagg: both exchanges through Flower's SecAgg+ (``dcco.flower.secure_round.SecAgg``:
            the nodes' model, the server's calibration samples, the most samples a node
            holds); None: plain messages, each reply checked.
    """

    def __init__(self, fraction_train: float = 1.0, min_train_nodes: int = 2,
                 min_available_nodes: int = 2, method: str = "dcco",
                 optimizer: str = "lars", lr: float = 1.5, weight_decay: float = 1e-6,
                 warmup_rounds: int = 0, schedule: str = "cosine",
                 vector_lr_scale: float = 1.0, local_lr: float = 1.0,
                 min_survivors: int = 1, seed: int = 0,
                 trained: Iterable[str] | None = None, secagg: SecAgg | None = None
                 ) -> None:
        if not 0 < fraction_train <= 1:
            raise ValueError(f"fraction_train must be in (0, 1], got {fraction_train}")
        if min(min_train_nodes, min_available_nodes, min_survivors) < 1:
            raise ValueError("min_train_nodes, min_available_nodes and min_survivors must be "
                             ">= 1")
        self.method = build_method(method, LossConfig())
        if not self.method.federated:
            raise ValueError(f"{method} is centralized; a strategy needs a federated method")
        self.fraction_train, self.min_train_nodes = fraction_train, min_train_nodes
        self.min_available_nodes = min_available_nodes
        self.optim = OptimConfig(name=optimizer, lr=lr, weight_decay=weight_decay,
                                 warmup_steps=warmup_rounds, schedule=schedule,
                                 vector_lr_scale=vector_lr_scale)
        self.local_lr, self.min_survivors, self.seed = local_lr, min_survivors, seed
        self._given = None if trained is None else list(trained)
        self.secagg = secagg
        if secagg is not None:
            if not isinstance(secagg, SecAgg):
                raise TypeError(f"secagg must be a dcco.flower.SecAgg, got "
                                f"{type(secagg).__name__}")
            if min(min_train_nodes, min_available_nodes) < 2:
                raise ValueError("SecAgg+ needs at least 2 nodes an exchange: set "
                                 "min_train_nodes and min_available_nodes >= 2")
            own = secagg.model.state_dict()
            learned = [k for k, p in secagg.model.named_parameters() if p.requires_grad]
            order = [k for k in own if k in set(learned)]
            if self._given is not None and set(self._given) != set(order):
                raise ValueError("under SecAgg+ the trained arrays are the parameters of "
                                 "secagg.model that require gradients; leave trained=None")
            self._given = order
        self.trained = self._given
        self._rng = random.Random(seed)
        self._weights: dict[str, Tensor] = {}
        self._params: dict[str, torch.nn.Parameter] = {}
        self._optimizer: torch.optim.Optimizer | None = None
        self._rounds = self._asked = 1
        self._asked_nodes: set[int] | None = None
        self._phase1_counts: dict[int, int] = {}
        self._skipped: dict | None = None

    # Flower's hooks. ``configure_train`` gives a round's first exchange (the statistics, or
    # the update for methods without them) and ``aggregate_train`` the server's step from
    # the update replies; ``start`` runs the exchange between them. Evaluation on the nodes
    # is the user's own (``evaluate_fn`` runs on the server).

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The round's first messages: the model and ``phase = "stats"`` (statistics
        methods) or ``"update"`` (FedAvg methods) to each sampled node."""
        phase = "stats" if self.method.stats is not None else "update"
        return [Message(RecordDict({"arrays": arrays, "config": self._config(
            phase, server_round, dict(config))}), dst_node_id=n,
            message_type=MessageType.TRAIN, group_id=str(server_round))
            for n in self._sample(grid)]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The update replies' valid average applied with the server optimiser: the new
        model, and the round's loss, samples and reply counters (None, None when too few are
        valid: the round is skipped)."""
        tally = ReplyTally()
        contents, seen = [], set()
        for reply in replies:
            node = reply.metadata.src_node_id
            if node in seen or (self._asked_nodes is not None and node not in self._asked_nodes):
                continue  # a duplicate, or a node that was not asked
            seen.add(node)
            if reply.has_error():
                tally.failed += 1
            else:
                contents.append((node, reply.content))
        tally.sent = max(self._asked, len(seen))  # the messages sent (``start``'s round)
        tally.missing = tally.sent - len(seen)
        check = self._check_update(self._weights, [c for _, c in contents])

        def checked(item: tuple[int, RecordDict]) -> ClientUpdate:
            node, content = item
            update = check(content)
            counted = self._phase1_counts.get(node)
            if counted is not None and counted != update.num_samples:
                raise ReplyError("count", f"node {node} sent statistics of {counted} samples "
                                          f"and an update of {update.num_samples}")
            return update

        updates = accept_valid(contents, checked, tally)
        metrics = _tally("update", tally)
        if len(updates) < self.min_survivors:
            self._skipped = metrics
            return None, None
        pooled = pooled_update([u for _, u in updates], self._params_of(self._weights))
        self._step(self._weights, {k: -v for k, v in pooled.delta.items()}, server_round - 1,
                   self._rounds)
        self._average_buffers([contents[i][1] for i, _ in updates],
                              [u.num_samples for _, u in updates])
        self._skipped = None
        return (ArrayRecord(dict(self._weights)), MetricRecord(
            metrics | {"loss": pooled.loss, "num-examples": pooled.num_samples}))

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        return None

    def summary(self) -> None:
        LOG.info("DCCO strategy: method %s, %s of the nodes a round (at least %d), server %s "
                 "at lr %g", self.method.name, self.fraction_train, self.min_train_nodes,
                 self.optim.name, self.optim.lr)

    # ------------------------------------------------------------------ the run

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
              ) -> Result:
        """Run ``num_rounds`` rounds; Flower's ``Strategy.start`` arguments and ``Result``
        (``train_metrics_clientapp`` holds each round's loss, samples, reply counters per
        phase, and ``skipped`` = 1 for a skipped round). ``train_config`` goes to the nodes
        with every message; ``evaluate_fn(round, arrays)`` runs on the server before the
        first round and after each."""
        self.summary()
        result = Result(arrays=initial_arrays)
        self._weights = {k: v.clone() for k, v in codec.tensors_of(initial_arrays).items()}
        self._rounds, self._params, self._optimizer = num_rounds, {}, None
        self._rng = random.Random(self.seed)
        self.trained = None if self._given is None else list(self._given)
        floating = {k for k, v in self._weights.items() if v.is_floating_point()}
        if self.trained is not None and not set(self.trained) <= floating:
            raise ValueError(f"trained names arrays that initial_arrays does not hold as "
                             f"floating tensors: {sorted(set(self.trained) - floating)[:3]}")
        if self.secagg is not None and (lacking := [
                k for k in self.secagg.model.state_dict() if k not in self._weights]):
            raise ValueError(f"initial_arrays lacks {lacking[0]} of secagg.model; give the "
                             f"state_dict of the nodes' model")
        if evaluate_fn is not None and (res := evaluate_fn(0, initial_arrays)) is not None:
            result.evaluate_metrics_serverapp[0] = res
        config = train_config or ConfigRecord()
        for r in range(1, num_rounds + 1):
            started = time.perf_counter()
            arrays, metrics = self._round(grid, r, config, timeout)
            record = (dict(metrics) | {"skipped": 0.0} if metrics is not None
                      else self._skipped | {"skipped": 1.0})
            record["round-seconds"] = time.perf_counter() - started
            result.train_metrics_clientapp[r] = MetricRecord(record)
            if arrays is not None:
                result.arrays = arrays
            LOG.info("DCCO round %d/%d: %s", r, num_rounds, "skipped" if metrics is None
                     else f"loss {record['loss']:.4g}")
            if evaluate_fn is not None and (res := evaluate_fn(r, result.arrays)) is not None:
                result.evaluate_metrics_serverapp[r] = res
        return result

    def _round(self, grid: Grid, r: int, config: ConfigRecord, timeout: float
               ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """One round: the first exchange, the statistics' merge and the update exchange
        (statistics methods), then ``aggregate_train``."""
        if self.secagg is not None:
            return self._secure_round(grid, r, config, timeout)
        first = list(self.configure_train(r, codec.array_record(self._weights), config, grid))
        self._phase1_counts = {}
        if self.method.stats is None:
            self._asked = len(first)
            self._asked_nodes = {m.metadata.dst_node_id for m in first}
            return self.aggregate_train(r, _send_and_receive(grid, first, timeout))
        tally = ReplyTally()
        got = self._replies(grid, first, timeout, tally)
        merged = self._merge(list(got.values()), tally)
        stats = _tally("stats", tally)
        if merged is None or len(merged.accepted) < self.min_survivors:
            self._skipped = stats
            return None, None
        survivors = [n for i, n in enumerate(got) if i in merged.accepted]
        self._phase1_counts = {n: merged.counts[merged.accepted.index(i)]
                               for i, n in enumerate(got) if i in merged.accepted}
        second = [Message(RecordDict({"statistics": moments_record(merged.aggregate),
                                      "config": self._config("update", r, dict(config))}),
                          dst_node_id=n, message_type=MessageType.TRAIN, group_id=str(r))
                  for n in survivors]
        self._asked, self._asked_nodes = len(second), set(survivors)
        arrays, metrics = self.aggregate_train(r, _send_and_receive(grid, second, timeout))
        if metrics is None:
            self._skipped = stats | self._skipped
            return None, None
        return arrays, MetricRecord(stats | dict(metrics))

    def _secure_round(self, grid: Grid, r: int, config: ConfigRecord, timeout: float
                      ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """One round with both exchanges through SecAgg+ (``dcco.flower.secure_round``): the
        server learns the averages of the nodes' statistics, updates and losses only."""
        sa, spec = self.secagg, self.method.stats
        nodes = self._sample(grid)
        scales = secure_round.calibration(sa, self._weights, self.method, self.local_lr,
                                          self.seed, r)
        extra = {k: v for k, v in self._config("", r, dict(config)).items()
                 if k not in (PHASE, ROUND)}  # the secure config carries its own
        model = {k: self._weights[k] for k in sa.model.state_dict()}  # the nodes' order
        shapes = {k: tuple(self._weights[k].shape) for k in self.trained}
        metrics, shared = {}, None
        if spec is not None:
            tally = ReplyTally()
            got = secure_round.exchange(sa, grid, {n: Instruction("stats", r, (), model)
                                                   for n in nodes}, extra, scales,
                                        sa.stats_clip, r, timeout, tally)
            metrics |= _tally("stats", tally) | {"stats-clipped": got.clipped}
            if got.values is None or len(got.counts) < max(self.min_survivors, 2):
                self._skipped = metrics
                return None, None
            shared = secagg.secure_moments(got.values[:len(spec.fields)], spec, scales,
                                           float(sum(got.counts.values())))
            nodes, model = sorted(got.counts), None
        tally = ReplyTally()
        got = secure_round.exchange(sa, grid, {n: Instruction("update", r, (), model, shared)
                                               for n in nodes}, extra, scales, sa.update_clip,
                                    r, timeout, tally)
        pooled = (secure_round.pooled_delta(got.values, shapes, scales)
                  if got.values is not None else None)
        if got.values is not None and pooled is None:
            tally.accepted -= len(got.counts)
            for _ in got.counts:
                tally.reject("shape")
        metrics |= _tally("update", tally) | {"update-clipped": got.clipped}
        if pooled is None or len(got.counts) < max(self.min_survivors, 2):
            self._skipped = metrics
            return None, None
        self._step(self._weights, {k: -v for k, v in pooled[0].items()}, r - 1, self._rounds)
        return ArrayRecord(dict(self._weights)), MetricRecord(
            metrics | {"loss": pooled[1], "num-examples": sum(got.counts.values())})

    @staticmethod
    def _replies(grid: Grid, messages: list[Message], timeout: float,
                 tally: ReplyTally) -> dict[int, RecordDict]:
        """The contents of the non-error replies, by node (duplicates and strangers left
        out), with the failed and missing ones counted."""
        asked = {m.metadata.dst_node_id for m in messages}
        tally.sent += len(messages)
        got, failed = {}, set()
        for reply in _send_and_receive(grid, messages, timeout):
            node = reply.metadata.src_node_id
            if node not in asked or node in got or node in failed:
                continue
            if reply.has_error():
                failed.add(node)
            else:
                got[node] = reply.content
        tally.failed += len(failed)
        tally.missing += len(asked) - len(got) - len(failed)
        return got

    def _sample(self, grid: Grid) -> list[int]:
        while len(nodes := sorted(grid.get_node_ids())) < self.min_available_nodes:
            LOG.info("waiting for nodes: %d connected, %d needed", len(nodes),
                     self.min_available_nodes)
            time.sleep(1.0)
        k = min(len(nodes), max(self.min_train_nodes, int(self.fraction_train * len(nodes))))
        return sorted(self._rng.sample(nodes, k))

    def _config(self, phase: str, r: int, extra: dict) -> ConfigRecord:
        return ConfigRecord(extra | {PHASE: phase, ROUND: r, METHOD: self.method.name,
                                     VIEWS_SEED: derive_seed(self.seed, "views", r) % (1 << 62),
                                     LOCAL_LR: self.local_lr})

    def _merge(self, contents: list[RecordDict], tally: ReplyTally):
        """The valid statistics replies merged (``dcco.api.merge_statistics``), with the
        encoding width read from the replies (the most common width of ``sum_f``)."""
        replies = []
        for c in contents:
            try:
                sums = codec.tensors_of(c.array_records["statistics"])
                sums["count"] = c.metric_records["metrics"]["num-examples"]
            except (KeyError, TypeError, ValueError):
                sums = {}  # counted as malformed by the merge
            replies.append(sums)
        first = f"sum_{self.method.stats.fields[0].name}"  # its first axis is the width d
        widths = Counter(int(s[first].shape[0]) for s in replies
                         if isinstance(s.get(first), Tensor) and s[first].ndim >= 1)
        if not widths:
            for _ in replies:
                tally.reject("missing_key")
            return None
        merged = merge_statistics(replies, widths.most_common(1)[0][0], self.method)
        tally.accepted += merged.tally.accepted
        for kind, n in merged.tally.rejected.items():
            tally.rejected[kind] = tally.rejected.get(kind, 0) + n
        return merged if merged.aggregate is not None else None

    def _check_update(self, weights: dict[str, Tensor], contents: Iterable[RecordDict]):
        if self.trained is None:  # the names most replies train, fixed from now on
            names = Counter()
            for c in contents:
                try:
                    names[tuple(sorted(codec.tensors_of(c.array_records["arrays"])))] += 1
                except (KeyError, TypeError, ValueError):
                    continue
            if names:
                self.trained = [k for k in weights if k in set(names.most_common(1)[0][0])]
        shapes = {k: tuple(weights[k].shape) for k in self.trained or () if k in weights}

        def check(c: RecordDict) -> ClientUpdate:
            if not shapes:
                raise ReplyError("missing_key", "no update names a parameter of the model")
            delta = codec.tensors_of(c.array_records["arrays"])
            m = c.metric_records["metrics"]
            extra = set(delta) - set(shapes)
            if extra:
                raise ReplyError("missing_key", f"update holds arrays the model lacks or does "
                                                f"not train: {sorted(extra)[:3]}")
            return validate_update(delta, m["num-examples"], shapes, loss=m.get("loss"))

        return check

    def _average_buffers(self, contents: list[RecordDict], counts: list[int]) -> None:
        """The model's floating arrays that nobody trains (batch norm's running statistics)
        as the sample-weighted average of what the valid replies hold after their step, as
        FedAvg averages them; a reply that holds none (or of other shapes) leaves them."""
        kept = [k for k, v in self._weights.items()
                if v.is_floating_point() and k not in set(self.trained or ())]
        if not kept:
            return
        sums, total = {}, 0
        for content, n in zip(contents, counts, strict=True):
            try:
                buffers = codec.tensors_of(content.array_records["buffers"])
            except (KeyError, TypeError, ValueError):
                continue
            if any(k not in buffers or buffers[k].shape != self._weights[k].shape
                   or not torch.isfinite(buffers[k]).all() for k in kept):
                continue
            for k in kept:
                sums[k] = sums.get(k, 0) + n * buffers[k].to(torch.float64)
            total += n
        for k, value in sums.items():
            self._weights[k] = (value / total).to(self._weights[k].dtype)

    def _params_of(self, weights: dict[str, Tensor]) -> dict[str, Tensor]:
        if not self._params:
            self._params = {k: torch.nn.Parameter(weights[k].clone()) for k in self.trained}
            self._optimizer = build_optimizer(list(self._params.items()), self.optim)
        return self._params

    def _step(self, weights: dict[str, Tensor], pseudo: dict[str, Tensor], r: int,
              rounds: int) -> None:
        params = self._params_of(weights)
        set_lr(self._optimizer, scheduled_lr(r, rounds, self.optim.lr, self.optim.warmup_steps,
                                             self.optim.schedule))
        apply_pseudo_gradient(self._optimizer, list(params.values()),
                              [pseudo[k] for k in params])
        for k, p in params.items():
            weights[k] = p.detach().clone()


def _send_and_receive(grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
    """The replies to ``messages``: pulled every 0.01 s (``dcco.flower.polling``) instead of
    Flower's ``Grid.send_and_receive``, which sleeps 3 s between pulls on a deployment's
    grid; a grid that answers at once (``dcco.flower.inprocess``) is asked directly."""
    if getattr(grid, "replies_at_once", False):
        return list(grid.send_and_receive(messages, timeout=timeout))
    return push_and_pull(grid, messages, timeout)


def _tally(phase: str, tally: ReplyTally) -> dict:
    out = {f"{phase}-{k}": float(v) for k, v in tally.as_dict().items() if k != "rejected"}
    out |= {f"{phase}-rejected-{k}": float(v) for k, v in tally.rejected.items()}
    return out


__all__ = ["DCCO", "SecAgg", "moments_of", "moments_record"]
