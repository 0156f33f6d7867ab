"""DCCO as a Flower strategy for your own ServerApp (the Message API; dcco pins flwr 1.41-1.42).

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
``dcco.core.optim``) with the negated average as the gradient. Every reply is checked as
``dcco.api`` checks it; a malformed or failed one is left out and counted, a node lost after
phase 1 counts in S_A but not in the update (``dcco.core.server``'s rule), and a phase with fewer
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
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords
from torch import Tensor

from dcco.config import USER
from dcco.core.algorithm import Algorithm, RoundSkipped
from dcco.core.collapse import CollapseWatch, collapse_figures, watch_start
from dcco.core.optim import (
    OptimConfig,
    apply_pseudo_gradient,
    build_optimizer,
    scheduled_lr,
    set_lr,
)
from dcco.core.seeding import derive_seed
from dcco.core.server import ReplyTally
from dcco.core.statistics_cache import StatisticsCache
from dcco.core.stats import Moments
from dcco.flower import codec, polling, secure_round
from dcco.flower.exchanges import PlainExchanges, SecureExchanges, replies_by_node
from dcco.flower.failures import causes, every_node_failed, hint
from dcco.flower.roundlog import metrics_line, round_line, run_summary, tally_metrics
from dcco.flower.secure_round import SecAgg
from dcco.flower.strategy_checkpoint import resume_strategy, save_strategy
from dcco.flower.userwire import LAMBDA, LOCAL_LR, METHOD, PHASE, ROUND, VIEWS_SEED, UserWire
from dcco.methods.base import LossConfig
from dcco.methods.registry import build_method

LOG = logging.getLogger("flwr.dcco")
NO_EVALUATE = "No evaluate function registered"
"""What Flower's ClientApp raises for an ``evaluate`` message without an ``@app.evaluate``
(``flwr/clientapp/client_app.py``, 1.41 and 1.42), in the error reply's reason."""


class DCCO(Strategy):
    """DCCO (and the other methods of dcco) for your own Flower app.

    It takes Flower ``FedAvg``'s arguments, so that swapping one for the other is one line;
    those it cannot honour are refused by name, with the reason (``train_metrics_aggr_fn``:
    DCCO's training metrics are its own; a ``weighted_by_key`` other than
    ``"num-examples"``: the exact round weighs each node by its sample count, which
    ``answer`` reports under that key).

    Args:
        fraction_train: the fraction of connected nodes sampled a round (at least
            ``min_train_nodes``), as Flower's ``FedAvg``.
        fraction_evaluate, min_evaluate_nodes: the nodes sampled for federated evaluation
            after each round (``configure_evaluate``: the model and ``evaluate_config`` to
            your ClientApp's ``@app.evaluate``), as ``FedAvg``'s; ``fraction_evaluate = 0``:
            none.
        arrayrecord_key, configrecord_key: the keys of the model and the config in the
            evaluation messages, as ``FedAvg``'s (the training messages are
            ``dcco.flower.answer``'s own layout).
        evaluate_metrics_aggr_fn: how the evaluation replies' metrics are combined (as
            ``FedAvg``'s; default: their average weighted by ``"num-examples"``).
        min_train_nodes: the fewest nodes sampled a round.
        min_available_nodes: nodes to wait for before a round.
        method: ``dcco``, ``dvicreg`` (statistics methods, two exchanges) or a FedAvg method
            of dcco (``cco_fedavg``, ``contrastive_fedavg``; one exchange).
        optimizer, lr, weight_decay, warmup_rounds, schedule: the server optimiser
            (``dcco.core.optim.OptimConfig``: ``adam``, ``lars`` or ``sgd``; ``schedule``
            ``cosine`` over the run's rounds or ``constant``); ``vector_lr_scale`` the 1-D
            parameters' share. The default, Adam 1e-3 with 10 warm-up rounds, trains the
            models CCO collapses under larger steps (docs/own_code.md, "Collapse").
        local_lr: the clients' SGD rate (paper: 1.0).
        lambd: λ of the CCO loss, sent to the nodes with every instruction. The default, 5
            (``dcco.config.USER``, as ``dcco.fit``'s), trained every model of the learning
            study better than the paper's 20, which suits its 1024-wide projector
            (docs/results.md, "What training is worth").
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
            ``dcco.core.statistics_cache``: not a centralized step; a statistics method with
            plain messages; kept for the run of ``start``, and in ``checkpoint``).
        checkpoint: a file the strategy rewrites atomically after every round: the model,
            the server optimiser's state, the round, the node sampling's state, FedSC's cache
            and the metrics so far. A ``start`` that finds it resumes after its last round (a
            stopped ServerApp is started again with the same arguments; ``initial_arrays``
            is then ignored, and the log says so), to the same model as an uninterrupted
            run. None: no checkpoint.
    """

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0,
                 min_train_nodes: int = 2, min_evaluate_nodes: int = 2,
                 min_available_nodes: int = 2, weighted_by_key: str = "num-examples",
                 arrayrecord_key: str = "arrays", configrecord_key: str = "config",
                 train_metrics_aggr_fn: Callable | None = None,
                 evaluate_metrics_aggr_fn: Callable | None = None, method: str = "dcco",
                 optimizer: str = USER.optim.name, lr: float = USER.optim.lr,
                 weight_decay: float = USER.optim.weight_decay,
                 warmup_rounds: int = USER.optim.warmup_steps,
                 schedule: str = "cosine", vector_lr_scale: float = 1.0,
                 local_lr: float = 1.0, lambd: float = USER.lambd,
                 min_survivors: int = 1, seed: int = 0,
                 trained: Iterable[str] | None = None, secagg: SecAgg | None = None,
                 absent_statistics: str = "drop", checkpoint: str | Path | None = None
                 ) -> None:
        if not 0 < fraction_train <= 1:
            raise ValueError(f"fraction_train must be in (0, 1], got {fraction_train}")
        if not 0 <= fraction_evaluate <= 1:
            raise ValueError(f"fraction_evaluate must be in [0, 1], got {fraction_evaluate}")
        if min(min_train_nodes, min_available_nodes, min_survivors) < 1:
            raise ValueError("min_train_nodes, min_available_nodes and min_survivors must be "
                             ">= 1")
        if min_evaluate_nodes < 0:
            raise ValueError(f"min_evaluate_nodes must be >= 0, got {min_evaluate_nodes}")
        if train_metrics_aggr_fn is not None:
            raise ValueError("train_metrics_aggr_fn: DCCO's training metrics are its own (the "
                             "round's loss over its valid updates, samples, reply counters "
                             "and collapse figures, in Result.train_metrics_clientapp); "
                             "leave it unset")
        if weighted_by_key != "num-examples":
            raise ValueError(f"weighted_by_key = {weighted_by_key!r}: DCCO's exact round "
                             f"weighs each node by its sample count, which "
                             f"dcco.flower.answer reports as 'num-examples'; leave it unset")
        self.fraction_evaluate = fraction_evaluate
        self.min_evaluate_nodes = 0 if fraction_evaluate == 0 else min_evaluate_nodes
        self.arrayrecord_key, self.configrecord_key = arrayrecord_key, configrecord_key
        self.weighted_by_key = weighted_by_key
        self.evaluate_metrics_aggr_fn = evaluate_metrics_aggr_fn or aggregate_metricrecords
        self.method = build_method(method, LossConfig(lambd=lambd))
        if not self.method.federated:
            raise ValueError(f"{method} is centralized; a strategy needs a federated method")
        if self.method.stateful:
            raise ValueError(f"{method}'s clients keep state between rounds, which runs in "
                             f"dcco's simulator and dcco's own Flower app (dcco.flower.app); "
                             f"in a Flower app of your own it is not implemented yet")
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
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        self.watch = CollapseWatch(watch_start(warmup_rounds), eps=self.method.variance_eps())
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
        self._eval_rng = random.Random(derive_seed(seed, "evaluate"))
        self._no_evaluate = False
        """Whether the nodes' ClientApp turned out to have no ``@app.evaluate``."""
        self._weights: dict[str, Tensor] = {}
        self._params: dict[str, torch.nn.Parameter] = {}
        self._optimizer: torch.optim.Optimizer | None = None
        self._rounds = 1
        self._asked_nodes: set[int] | None = None
        self._skipped: dict | None = None
        self._skip_reason = ""
        self._all_failed: frozenset[str] = frozenset()

    # Flower's hooks. ``configure_train`` gives a round's first exchange (the statistics, or
    # the update for methods without them) and ``aggregate_train`` the server's step from
    # the update replies; ``start`` runs the exchange between them. ``configure_evaluate``
    # and ``aggregate_evaluate`` are FedAvg's federated evaluation.

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
            self._skipped = tally_metrics("update", tally)
            return None, None
        return self._apply(server_round, exchanges, updates.pseudo_gradient, updates.loss,
                           updates.num_samples)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Federated evaluation, as ``FedAvg``'s: the model and ``config`` (with
        ``server-round``, and the loss's λ for ``dcco.flower.evaluate_encoder``) to
        ``fraction_evaluate`` of the nodes (at least ``min_evaluate_nodes``), for your
        ClientApp's ``@app.evaluate``; none once a round's every reply said the ClientApp
        has none (``aggregate_evaluate``)."""
        if self.fraction_evaluate == 0 or self._no_evaluate:
            return []
        nodes = self._sample(grid, self.fraction_evaluate, self.min_evaluate_nodes)
        config = ConfigRecord(dict(config) | {"server-round": server_round,
                                              LAMBDA: float(self.method.loss.lambd)})
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return [Message(content, dst_node_id=n, message_type=MessageType.EVALUATE,
                        group_id=str(server_round)) for n in nodes]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """The evaluation replies' metrics combined by ``evaluate_metrics_aggr_fn`` (their
        average weighted by ``num-examples``); a failed reply is logged with its reason and
        left out; None when none is valid. When every reply failed because the ClientApp has
        no ``@app.evaluate`` (FedAvg's default ``fraction_evaluate = 1`` meeting an app that
        only trains), that is said once and the run asks for no more evaluation."""
        replies = list(replies)
        if replies and all(r.has_error() and NO_EVALUATE in r.error.reason for r in replies):
            self._no_evaluate = True
            LOG.warning("DCCO round %d, evaluation: the nodes' ClientApp has no @app.evaluate "
                        "(%s); no more federated evaluation in this run. Add one, or pass "
                        "DCCO(fraction_evaluate=0.0) to ask for none", server_round,
                        replies[0].error.reason)
            return None
        valid = []
        for reply in replies:
            if reply.has_error():
                LOG.warning("DCCO round %d, evaluation: node %d failed: %s", server_round,
                            reply.metadata.src_node_id, reply.error.reason)
            else:
                valid.append(reply.content)
        if not valid:
            return None
        try:
            return self.evaluate_metrics_aggr_fn(valid, self.weighted_by_key)
        except (KeyError, ValueError, TypeError) as e:
            LOG.warning("DCCO round %d, evaluation: the replies' metrics could not be "
                        "combined (%s: %s); an @app.evaluate reply needs a MetricRecord "
                        "with %r", server_round, type(e).__name__, e, self.weighted_by_key)
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
        """Run ``num_rounds`` rounds; Flower's ``Strategy.start`` arguments and ``Result``.

        ``train_metrics_clientapp`` holds each round's loss, samples, reply counters per
        phase, ``skipped`` = 1 for a skipped round, and for a statistics method the collapse
        figures of its S_A, ``dead_dims``, ``corr_diag`` and ``eff_rank``, with
        ``collapse-warning`` = 1 at the round the collapse warning was logged
        (``dcco.core.collapse``). ``train_config`` goes to the nodes with every training message
        (a ``lr`` in it is refused: DCCO's nodes step at ``local_lr``, the server's optimiser
        at ``lr``). After each round, ``configure_evaluate`` sends the model and
        ``evaluate_config`` to the sampled nodes' ``@app.evaluate``, whose metrics fill
        ``evaluate_metrics_clientapp``; ``evaluate_fn(round, arrays)`` runs on the server
        before the first round and after each (``evaluate_metrics_serverapp``).

        Every node that fails or replies without what DCCO needs is logged with its reason,
        round by round, and a skipped round says why.

        Raises:
            ValueError: ``num_rounds`` < 1, a ``lr`` in ``train_config``, or arrays that do
                not fit ``trained`` or ``secagg``.
            RoundsSkipped: every round was skipped: nothing was trained, and the reasons are
                in the message; or, before any round trained, two rounds in a row failed on
                every node with the same error (a fault of the nodes' code or data, which
                every later round would meet), and the run stopped there.
        """
        if not isinstance(num_rounds, int) or num_rounds < 1:
            raise ValueError(f"num_rounds must be an integer >= 1, got {num_rounds!r}")
        config = train_config or ConfigRecord()
        if "lr" in config:
            raise ValueError(f"train_config['lr'] = {config['lr']!r}: DCCO's nodes take one "
                             f"SGD step at the strategy's local_lr ({self.local_lr:g}, the "
                             f"paper's) and the server's optimiser sets the model's step "
                             f"(DCCO(lr={self.optim.lr:g})); remove 'lr' from train_config "
                             f"and set DCCO(lr=...) instead")
        self.summary()
        began = time.perf_counter()
        result = Result(arrays=initial_arrays)
        self.begin(initial_arrays, num_rounds)
        first, skipped = 1, []
        failing: list[frozenset[str]] = []  # the errors of consecutive rounds every node failed
        if self.checkpoint is not None and self.checkpoint.is_file():
            first, skipped = resume_strategy(self, self.checkpoint, result, num_rounds)
            LOG.info("DCCO: resuming from %s after round %d of %d (initial_arrays ignored)",
                     self.checkpoint, first - 1, num_rounds)
        elif evaluate_fn is not None and (res := evaluate_fn(0, initial_arrays)) is not None:
            result.evaluate_metrics_serverapp[0] = res
        for r in range(first, num_rounds + 1):
            started = time.perf_counter()
            arrays, metrics = self._round(grid, r, config, timeout)
            record = (dict(metrics) | {"skipped": 0.0} if metrics is not None
                      else self._skipped | {"skipped": 1.0})
            record["round-seconds"] = time.perf_counter() - started
            result.train_metrics_clientapp[r] = MetricRecord(record)
            if arrays is not None:
                result.arrays = arrays
                LOG.info("DCCO round %d/%d: %s", r, num_rounds, round_line(record))
            else:
                LOG.warning("DCCO round %d/%d: skipped, the model unchanged: %s", r,
                            num_rounds, self._skip_reason)
                skipped.append(f"round {r}: {self._skip_reason}")
                failing = (failing + [self._all_failed])[-2:] if self._all_failed else []
                if (len(failing) == 2 and failing[0] == failing[1] and r < num_rounds
                        and all(m["skipped"] for m in result.train_metrics_clientapp.values())):
                    raise RoundsSkipped(
                        f"no round has trained, and rounds {r - 1} and {r} failed on every "
                        f"node with the same error, which the other {num_rounds - r} would "
                        f"meet too; stopped after round {r}: " + "; ".join(skipped[-2:]),
                        result)
            self._evaluate(grid, r, result, evaluate_config, timeout)
            if (res := result.evaluate_metrics_clientapp.get(r)) is not None:
                LOG.info("DCCO round %d/%d, federated evaluation: %s", r, num_rounds,
                         metrics_line(res))
            if evaluate_fn is not None and (res := evaluate_fn(r, result.arrays)) is not None:
                result.evaluate_metrics_serverapp[r] = res
                LOG.info("DCCO round %d/%d, server evaluation: %s", r, num_rounds,
                         metrics_line(res))
            if self.checkpoint is not None:
                save_strategy(self, self.checkpoint, r, num_rounds, result, skipped)
        LOG.info("DCCO: %s", run_summary(result, num_rounds, time.perf_counter() - began))
        if len(skipped) == num_rounds:
            raise RoundsSkipped(
                f"every one of the {num_rounds} rounds was skipped, so the model was never "
                f"trained: " + "; ".join(skipped[:3])
                + (f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""), result)
        return result

    def begin(self, initial_arrays: ArrayRecord, num_rounds: int) -> None:
        """A run's start: the weights of ``initial_arrays``, a fresh server optimiser, node
        sampling and collapse watch, and the checks of ``trained`` and ``secagg`` against
        the arrays (``start`` calls it; Flower's own loop of ``configure_train`` and
        ``aggregate_train`` needs it called first)."""
        self._weights = {k: v.clone() for k, v in codec.tensors_of(initial_arrays).items()}
        self._rounds, self._params, self._optimizer = num_rounds, {}, None
        self._rng = random.Random(self.seed)
        self._eval_rng = random.Random(derive_seed(self.seed, "evaluate"))
        self._no_evaluate = False
        self.cache = StatisticsCache() if self.absent_statistics == "cached" else None
        self.watch = CollapseWatch(watch_start(self.optim.warmup_steps),
                                   eps=self.method.variance_eps())
        self.trained = None if self._given is None else list(self._given)
        floating = {k for k, v in self._weights.items() if v.is_floating_point()}
        if self.trained is not None and not set(self.trained) <= floating:
            raise ValueError(f"trained names arrays that initial_arrays does not hold as "
                             f"floating tensors: {sorted(set(self.trained) - floating)[:3]}")
        if self.secagg is not None and (lacking := [
                k for k in self.secagg.model.state_dict() if k not in self._weights]):
            raise ValueError(f"initial_arrays lacks {lacking[0]} of secagg.model; give the "
                             f"state_dict of the nodes' model")

    def _evaluate(self, grid: Grid, r: int, result: Result, config: ConfigRecord | None,
                  timeout: float) -> None:
        """Round ``r``'s federated evaluation into ``result.evaluate_metrics_clientapp``."""
        messages = list(self.configure_evaluate(r, result.arrays, config or ConfigRecord(),
                                                grid))
        if not messages:
            return
        replies = grid.send_and_receive(messages, timeout=timeout)
        if (metrics := self.aggregate_evaluate(r, replies)) is not None:
            result.evaluate_metrics_clientapp[r] = metrics

    def _round(self, grid: Grid, r: int, config: ConfigRecord, timeout: float
               ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """One round: ``Algorithm.run_round`` over the sampled nodes' exchanges (plain or
        SecAgg+: ``dcco.flower.exchanges``, the round of dcco's own app), then the server's
        step. Every reply not used is logged with its reason."""
        targets = {n: [n] for n in self._sample(grid)}
        exchanges = self._exchanges(r, targets, config, timeout, grid)
        self._asked_nodes = set(targets)
        try:
            result = self.algorithm.run_round(exchanges, absent=exchanges.absent(self.cache))
        except RoundSkipped as e:
            self._log_problems(r, exchanges)
            self._skipped = self._metrics(exchanges)
            self._skip_reason = f"{e.reason}{causes(exchanges)}{hint(exchanges)}"
            self._all_failed = every_node_failed(exchanges)
            return None, None
        self._log_problems(r, exchanges)
        arrays, metrics = self._apply(r, exchanges, result.pseudo_gradient, result.loss,
                                      result.num_samples)
        return arrays, self._watched(r, metrics, result.shared)

    @staticmethod
    def _log_problems(r: int, exchanges: PlainExchanges) -> None:
        for phase, tally in exchanges.replies.items():
            for problem in tally.problems:
                LOG.warning("DCCO round %d, %s: %s", r, phase, problem)

    def _watched(self, r: int, metrics: MetricRecord, shared: Moments | None) -> MetricRecord:
        """The round's metrics with the collapse figures of its S_A (``dcco.core.collapse``; none
        for a method without statistics), and the collapse warning logged the first time
        they show collapse after the warm-up (``CollapseWatch``)."""
        if shared is None:
            return metrics
        figures = {k: float(v) for k, v in collapse_figures(
            shared, eps=self.method.variance_eps()).items()}
        d = next(iter(shared.tensors())).shape[0]
        if (warning := self.watch.check(r, figures, d)) is not None:
            LOG.warning("DCCO: %s", warning)
            figures["collapse-warning"] = 1.0
        return MetricRecord(dict(metrics) | figures)

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
            out |= tally_metrics(phase, tally)
            if isinstance(exchanges, SecureExchanges):
                out[f"{phase}-clipped"] = exchanges.clipped.get(phase, 0.0)
        return out

    def _sample(self, grid: Grid, fraction: float | None = None,
                minimum: int | None = None) -> list[int]:
        """``fraction`` of the connected nodes, at least ``minimum`` (default: training's),
        once ``min_available_nodes`` are connected; evaluation draws from a stream of its
        own, so that it leaves training's sample of nodes as it would be without it."""
        while len(nodes := sorted(grid.get_node_ids())) < self.min_available_nodes:
            LOG.info("waiting for nodes: %d connected, %d needed", len(nodes),
                     self.min_available_nodes)
            time.sleep(1.0)
        rng = self._rng if fraction is None else self._eval_rng
        fraction = self.fraction_train if fraction is None else fraction
        minimum = self.min_train_nodes if minimum is None else minimum
        k = min(len(nodes), max(minimum, int(fraction * len(nodes))))
        return sorted(rng.sample(nodes, k))

    def _config(self, phase: str, r: int, extra: dict) -> ConfigRecord:
        return ConfigRecord(extra | {PHASE: phase, ROUND: r, METHOD: self.method.name,
                                     VIEWS_SEED: derive_seed(self.seed, "views", r) % (1 << 62),
                                     LOCAL_LR: self.local_lr,
                                     LAMBDA: float(self.method.loss.lambd)})

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


class RoundsSkipped(RuntimeError):
    """Every round of ``DCCO.start`` was skipped, or, before any trained, two rounds in a row
    failed on every node with the same error: the model was never trained.

    Attributes:
        result: the run's ``Result`` (its metrics say, round by round, what became of the
            replies).
    """

    def __init__(self, message: str, result: Result) -> None:
        super().__init__(message)
        self.result = result


__all__ = ["DCCO", "RoundsSkipped", "SecAgg"]
