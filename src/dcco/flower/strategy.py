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
from collections.abc import Callable, Iterable
from functools import partial

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import Tensor

from dcco.algorithm import Algorithm, RoundSkipped
from dcco.flower import codec, polling, secure_round
from dcco.flower.exchanges import PlainExchanges, SecureExchanges, replies_by_node
from dcco.flower.secure_round import SecAgg
from dcco.flower.userwire import LOCAL_LR, METHOD, PHASE, ROUND, VIEWS_SEED, UserWire
from dcco.methods.base import LossConfig
from dcco.methods.registry import build_method
from dcco.optim import OptimConfig, apply_pseudo_gradient, build_optimizer, scheduled_lr, set_lr
from dcco.seeding import derive_seed
from dcco.server import ReplyTally
from dcco.statistics_cache import StatisticsCache

LOG = logging.getLogger("flwr.dcco")
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
        absent_statistics: ``drop``: a round's S_A is its own nodes' (the exact round);
            ``cached``: the strategy keeps every node's last statistics and merges those of
            the nodes absent from a round into its S_A (FedSC's partial participation,
            ``dcco.statistics_cache``: not a centralized step; a statistics method with
            plain messages; kept in memory for the run of ``start``).
    """

    def __init__(self, fraction_train: float = 1.0, min_train_nodes: int = 2,
                 min_available_nodes: int = 2, method: str = "dcco",
                 optimizer: str = "lars", lr: float = 1.5, weight_decay: float = 1e-6,
                 warmup_rounds: int = 0, schedule: str = "cosine",
                 vector_lr_scale: float = 1.0, local_lr: float = 1.0,
                 min_survivors: int = 1, seed: int = 0,
                 trained: Iterable[str] | None = None, secagg: SecAgg | None = None,
                 absent_statistics: str = "drop") -> None:
        if not 0 < fraction_train <= 1:
            raise ValueError(f"fraction_train must be in (0, 1], got {fraction_train}")
        if min(min_train_nodes, min_available_nodes, min_survivors) < 1:
            raise ValueError("min_train_nodes, min_available_nodes and min_survivors must be "
                             ">= 1")
        self.method = build_method(method, LossConfig())
        if not self.method.federated:
            raise ValueError(f"{method} is centralized; a strategy needs a federated method")
        self.algorithm = Algorithm(self.method, local_lr=local_lr)
        if absent_statistics not in ("drop", "cached"):
            raise ValueError(f"absent_statistics must be 'drop' or 'cached', got "
                             f"{absent_statistics!r}")
        if absent_statistics == "cached" and self.method.stats is None:
            raise ValueError(f"absent_statistics='cached' keeps each node's statistics; "
                             f"{method} shares none")
        if absent_statistics == "cached" and secagg is not None:
            raise ValueError("absent_statistics='cached' keeps each node's statistics, and "
                             "SecAgg+ shows the server only their sum: use plain messages "
                             "(secagg=None) or 'drop'")
        self.absent_statistics = absent_statistics
        self.cache: StatisticsCache | None = None
        """Every node's last statistics under ``absent_statistics='cached'`` (from
        ``start``)."""
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
        self._rounds = 1
        self._asked_nodes: set[int] | None = None
        self._skipped: dict | None = None

    # Flower's hooks. ``configure_train`` gives a round's first exchange (the statistics, or
    # the update for methods without them) and ``aggregate_train`` the server's step from
    # the update replies; ``start`` runs the exchange between them. Evaluation on the nodes
    # is the user's own (``evaluate_fn`` runs on the server).

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The round's first messages: the model and ``phase = "stats"`` (statistics
        methods) or ``"update"`` (FedAvg methods) to each sampled node."""
        wire = UserWire(self, server_round, dict(config), arrays)
        nodes = self._sample(grid)
        self._asked_nodes = set(nodes)
        return [Message(wire.stats_message([n]) if self.method.stats is not None
                        else wire.update_message([n], True, None, False), dst_node_id=n,
                        message_type=MessageType.TRAIN, group_id=str(server_round))
                for n in nodes]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The update replies' valid average applied with the server optimiser: the new
        model, and the round's loss, samples and reply counters (None, None when too few are
        valid: the round is skipped). ``start`` runs its rounds through the same checks
        (``dcco.flower.exchanges``); this is the hook for Flower's own loop, where the
        update exchange is the round's only one."""
        if self.secagg is not None:
            raise RuntimeError("under SecAgg+ a round runs in DCCO.start: the server never "
                               "sees one node's reply to aggregate")
        replies = list(replies)
        asked = self._asked_nodes or {m.metadata.src_node_id for m in replies}
        exchanges = PlainExchanges(None, UserWire(self, server_round, {}), server_round, 0.0,
                                   {n: [n] for n in sorted(asked)}, self.min_survivors)
        tally = exchanges.replies["update"] = ReplyTally()
        tally.sent = len(asked)
        try:
            updates = exchanges.take_updates(replies_by_node(replies, asked, tally), tally)
        except RoundSkipped:
            self._skipped = _tally("update", tally)
            return None, None
        return self._apply(server_round, exchanges, updates.pseudo_gradient, updates.loss,
                           updates.num_samples)

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
        self.cache = StatisticsCache() if self.absent_statistics == "cached" else None
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
        """One round: ``Algorithm.run_round`` over the sampled nodes' exchanges (plain or
        SecAgg+: ``dcco.flower.exchanges``, the round of dcco's own app), then the server's
        step."""
        targets = {n: [n] for n in self._sample(grid)}
        exchanges = self._exchanges(r, targets, config, timeout, grid)
        self._asked_nodes = set(targets)
        try:
            result = self.algorithm.run_round(exchanges, absent=exchanges.absent(self.cache))
        except RoundSkipped:
            self._skipped = self._metrics(exchanges)
            return None, None
        return self._apply(r, exchanges, result.pseudo_gradient, result.loss,
                           result.num_samples)

    def _exchanges(self, r: int, targets: dict[int, list[int]], config: ConfigRecord,
                   timeout: float, grid: Grid | None = None) -> PlainExchanges:
        wire = UserWire(self, r, dict(config))
        if self.secagg is None:
            return PlainExchanges(partial(polling.send_and_receive, grid), wire, r, timeout,
                                  targets, self.min_survivors)
        sa = self.secagg
        scales = secure_round.calibration(sa, self._weights, self.method, self.local_lr,
                                          self.seed, r)
        return SecureExchanges(grid, wire, r, targets, self.min_survivors, scales,
                               sa.flower_config(timeout), lambda _: float(sa.max_samples),
                               wire.secure_extra())

    def _apply(self, r: int, exchanges: PlainExchanges, pseudo: dict[str, Tensor],
               loss: float, samples: int) -> tuple[ArrayRecord, MetricRecord]:
        """The server's step with the round's pseudo-gradient, the untrained floating arrays
        averaged from the replies used (plain messages), and the round's metrics."""
        self._step(self._weights, pseudo, r - 1, self._rounds)
        if exchanges.used:
            self._average_buffers([c for _, c, _ in exchanges.used],
                                  [n for _, _, n in exchanges.used])
        self._skipped = None
        return ArrayRecord(dict(self._weights)), MetricRecord(
            self._metrics(exchanges) | {"loss": float(loss), "num-examples": samples})

    @staticmethod
    def _metrics(exchanges: PlainExchanges) -> dict:
        out = {}
        for phase, tally in exchanges.replies.items():
            out |= _tally(phase, tally)
            if isinstance(exchanges, SecureExchanges):
                out[f"{phase}-clipped"] = exchanges.clipped.get(phase, 0.0)
        return out

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


def _tally(phase: str, tally: ReplyTally) -> dict:
    out = {f"{phase}-{k}": float(v) for k, v in tally.as_dict().items() if k != "rejected"}
    out |= {f"{phase}-rejected-{k}": float(v) for k, v in tally.rejected.items()}
    return out


__all__ = ["DCCO", "SecAgg"]
