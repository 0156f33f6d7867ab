"""``DCCOStrategy``: the Flower hooks and the run (the package's doc says what a round is)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from dcco.config import USER, OptimConfig
from dcco.core.algorithm import Algorithm
from dcco.core.collapse import CollapseWatch, watch_start
from dcco.core.statistics_cache import StatisticsCache
from dcco.errors import arguments_of
from dcco.flower.secure_round import SecAgg
from dcco.flower.server_model import ServerModel
from dcco.flower.strategy import arguments
from dcco.flower.strategy.federated_evaluation import FederatedEvaluation, ServerEvaluation
from dcco.flower.strategy.node_sampling import NodeSampler
from dcco.flower.strategy.round_steps import RoundsSkipped, StrategyRounds
from dcco.flower.strategy.run_config import strategy_arguments
from dcco.flower.strategy.strategy_run import run_rounds
from dcco.flower.userwire import NodeSettings

LOG = logging.getLogger("flwr.dcco")


class DCCOStrategy(Strategy):
    """DCCO (and the other methods of dcco) for your own Flower app.

    It takes Flower ``FedAvg``'s arguments first, in its order, so that swapping one for
    the other is one line (those it cannot honour are refused by name, with the reason);
    its own are keyword-only.

    Two rounds on two in-process nodes (``vector_app``'s handler returns ``answer``):

    >>> import torch
    >>> from flwr.app import ArrayRecord
    >>> from dcco.flower.testing.inprocess import InProcessGrid, vector_app
    >>> strategy = DCCOStrategy(min_train_nodes=2, fraction_evaluate=0.0)
    >>> result = strategy.start(InProcessGrid(vector_app(), [{}, {}], {}),
    ...                         ArrayRecord(torch.nn.Linear(6, 8).state_dict()), num_rounds=2)
    >>> metrics = result.train_metrics_clientapp
    >>> sorted(metrics), metrics[2]["num-examples"], metrics[2]["update-accepted"]
    ([1, 2], 16, 2.0)

    Parameters
    ----------
    fraction_train : float (default: 1.0)
        The fraction of connected nodes sampled a round (at least ``min_train_nodes``).
    fraction_evaluate : float (default: 1.0)
        The fraction sampled for your ``@app.evaluate`` after each round; 0: none.
    min_train_nodes : int (default: 2)
        The fewest nodes sampled a round.
    min_evaluate_nodes : int (default: 2)
        The fewest nodes sampled for federated evaluation.
    min_available_nodes : int (default: 2)
        The nodes to wait for before a round.
    weighted_by_key : str (default: "num-examples")
        Only ``"num-examples"``, the sample count ``answer`` reports: the exact round's weight.
    arrayrecord_key : str (default: "arrays")
        The key of the model in the evaluation messages (training uses ``answer``'s layout).
    configrecord_key : str (default: "config")
        The key of the config in the evaluation messages.
    train_metrics_aggr_fn : None (default: None)
        Refused: DCCO's training metrics are its own.
    evaluate_metrics_aggr_fn : callable or None (default: None)
        Combines the evaluation replies' metrics, as ``FedAvg``'s.
    method : str (default: "dcco")
        ``dcco``, ``dvicreg`` or a FedAvg method of dcco (``cco_fedavg``, ``contrastive_fedavg``,
        ``byol_fedavg``, ``simsiam_fedavg``, ``moco_fedavg``, ``fedu``, ``fedema``; the last
        five on ``dcco.dual_encoder(..., method=...)``'s model).
    optimizer : str (default: ``dcco.config.USER``'s, "adam")
        The server optimiser: ``adam``, ``lars`` or ``sgd`` (``dcco.config.OptimConfig``).
    lr : float (default: ``USER``'s, 1e-3)
        The server's rate.
    weight_decay : float (default: ``USER``'s, 0)
        The server optimiser's weight decay.
    warmup_rounds : int (default: ``USER``'s, 10)
        Rounds of linear warm-up of the server's rate.
    schedule : str (default: "cosine")
        ``cosine`` over the run's rounds, or ``constant``.
    vector_lr_scale : float (default: 1.0)
        The 1-D parameters' share of the rate (Barlow Twins' form: 0.024).
    local_lr : float (default: 1.0)
        The clients' SGD rate (the paper's 1.0), sent to them.
    lambd : float (default: ``USER``'s, 5)
        λ of the CCO loss, sent to the nodes (the paper's 20 suits its 1024-wide projector).
    min_survivors : int (default: 1)
        The fewest valid replies a phase needs, or the round is skipped.
    seed : int (default: 0)
        Node sampling's and each round's views' seed.
    trained : iterable of str or None (default: None)
        The arrays the clients train; None: the names most first-round updates carry. Other
        floating arrays (batch norm's statistics) are averaged by samples, as FedAvg does.
    secagg : SecAgg or None (default: None)
        Both exchanges through Flower's SecAgg+ (``dcco.flower.secure_round.SecAgg``);
        None: plain messages, each reply checked.
    absent_statistics : str (default: "drop")
        ``drop``: a round's S_A is its own nodes' (the exact round); ``cached``: merged with
        every absent node's last statistics (FedSC's partial participation,
        ``dcco.core.statistics_cache``; plain messages only).
    checkpoint : str, Path or None (default: None)
        A file rewritten atomically after every round; a ``start`` that finds it (the same
        arguments) resumes after its last round, to the model of an uninterrupted run.
    loss : mapping or None (default: None)
        The loss's other settings (``dcco.config.LossConfig``'s keys), sent to the nodes.
    metrics_file : str, Path or None (default: None)
        JSON lines, one a round from round 0: train metrics, rate and evaluations.
    aggregation : str (default: "fedavg")
        ``"fedavg"`` or ``"ldawa"``: L-DAWA's server (ICCV 2023), each node's layers scaled
        by their cosine with the global model's (``dcco.core.aggregation``).
    """

    def __init__(self, fraction_train: float = 1.0, fraction_evaluate: float = 1.0,
                 min_train_nodes: int = 2, min_evaluate_nodes: int = 2,
                 min_available_nodes: int = 2, weighted_by_key: str = "num-examples",
                 arrayrecord_key: str = "arrays", configrecord_key: str = "config",
                 train_metrics_aggr_fn: Callable | None = None,
                 evaluate_metrics_aggr_fn: Callable | None = None, *, method: str = "dcco",
                 optimizer: str = USER.optim.optimizer, lr: float = USER.optim.lr,
                 weight_decay: float = USER.optim.weight_decay,
                 warmup_rounds: int = USER.optim.warmup_rounds,
                 schedule: str = "cosine", vector_lr_scale: float = 1.0,
                 local_lr: float = 1.0, lambd: float = USER.lambd,
                 min_survivors: int = 1, seed: int = 0,
                 trained: Iterable[str] | None = None, secagg: SecAgg | None = None,
                 absent_statistics: str = "drop", checkpoint: str | Path | None = None,
                 loss: Mapping[str, Any] | None = None,
                 metrics_file: str | Path | None = None, aggregation: str = "fedavg") -> None:
        with arguments_of("DCCOStrategy", arguments.CONFIG_KEYS):
            arguments.refuse_fedavg_arguments(train_metrics_aggr_fn, weighted_by_key)
            if min_survivors < 1:
                raise ValueError(f"min_survivors must be >= 1, got {min_survivors}")
            self.sampler = NodeSampler(fraction_train, min_train_nodes, fraction_evaluate,
                                       min_evaluate_nodes, min_available_nodes, seed)
            self.method = arguments.strategy_method(method, lambd, absent_statistics, secagg, loss)
            self.algorithm = Algorithm(self.method, local_lr=local_lr, aggregation=aggregation)
            self.evaluation = FederatedEvaluation(self.sampler, lambd, arrayrecord_key,
                                                  configrecord_key, evaluate_metrics_aggr_fn,
                                                  weighted_by_key)
            self.optim = OptimConfig(optimizer=optimizer, lr=lr, weight_decay=weight_decay,
                                     warmup_rounds=warmup_rounds, schedule=schedule,
                                     vector_lr_scale=vector_lr_scale)
            self.model = ServerModel(self.optim, arguments.trained_names(
                trained, secagg, min_train_nodes, min_available_nodes))
            self.nodes = NodeSettings(self.method.name, local_lr, seed, self.method.loss,
                                      aggregation)
            self.absent_statistics, self.secagg = absent_statistics, secagg
            self.local_lr, self.min_survivors, self.seed = local_lr, min_survivors, seed
            self.checkpoint = Path(checkpoint) if checkpoint is not None else None
            self.metrics_file = Path(metrics_file) if metrics_file is not None else None
            self.rounds = StrategyRounds(self.algorithm, self.model, self.nodes, min_survivors,
                                         secagg, self._watch())
            self.asked_nodes: set[int] | None = None
            """The nodes asked in the round running (``aggregate_train`` counts their replies)."""

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], **defaults: Any) -> DCCOStrategy:
        """The strategy of ``defaults`` (its arguments) with every ``dcco.*`` key of
        ``run_config`` (your ServerApp's ``context.run_config``) over them: ``dcco.lr``,
        ``dcco.warmup-rounds``, each argument's name with ``-`` for ``_``, and
        ``dcco.loss.<key>`` (``dcco.flower.strategy.run_config``). Declare the keys in your
        app's ``pyproject.toml`` so that ``flwr run --run-config`` can change them.

        Raises:
            ConfigError: a ``dcco.*`` key that names no setting, or a value of the wrong
                type, named by its key.
        """
        given = strategy_arguments(run_config)
        if "loss" in given and defaults.get("loss"):
            given["loss"] = dict(defaults["loss"]) | given["loss"]
        return cls(**(defaults | given))

    @property
    def cache(self) -> StatisticsCache | None:
        """Every node's last statistics under ``absent_statistics='cached'``."""
        return self.rounds.cache

    def node_config(self, phase: str, r: int, extra: dict) -> ConfigRecord:
        """The ``config`` record of round ``r``'s ``phase`` message (``NodeSettings``)."""
        return self.nodes.config(phase, r, extra, self.model.rounds, self.model.states_key)

    def _watch(self) -> CollapseWatch:
        return CollapseWatch(watch_start(self.optim.warmup_rounds),
                             eps=self.method.variance_eps(), offer_rewind=False)

    # Flower's hooks: a round's first exchange and the server's step from its update replies
    # (``start`` runs the exchange between them); FedAvg's federated evaluation.

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The round's first messages: the model and ``phase = "stats"`` (statistics
        methods) or ``"update"`` (FedAvg methods) to each sampled node."""
        wire = self.rounds.wire(server_round, dict(config), arrays)
        nodes = self.sampler.train(grid)
        self.asked_nodes = set(nodes)
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
            raise RuntimeError("under SecAgg+ a round runs in DCCOStrategy.start: the server "
                               "never sees one node's reply to aggregate")
        replies = list(replies)
        asked = self.asked_nodes or {m.metadata.src_node_id for m in replies}
        outcome = self.rounds.aggregate(server_round, replies, asked)
        if outcome.skipped:
            LOG.warning("DCCO round %d: skipped, the model unchanged: %s", server_round,
                        outcome.reason)
            return None, None
        return outcome.arrays, MetricRecord(outcome.metrics)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Federated evaluation, as ``FedAvg``'s: the model and ``config`` (with
        ``server-round``, and the loss's λ for ``dcco.flower.evaluate_encoder``) to
        ``fraction_evaluate`` of the nodes (at least ``min_evaluate_nodes``), for your
        ClientApp's ``@app.evaluate`` (``FederatedEvaluation``)."""
        return self.evaluation.messages(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """The evaluation replies' metrics combined by ``evaluate_metrics_aggr_fn`` (their
        average weighted by ``num-examples``); None when none is valid."""
        return self.evaluation.combine(server_round, replies)

    def summary(self) -> None:
        LOG.info("DCCO strategy: method %s, %s of the nodes a round (at least %d), server %s "
                 "at lr %g after %d warm-up rounds, λ %g", self.method.name,
                 self.sampler.fraction_train, self.sampler.min_train_nodes,
                 self.optim.optimizer, self.optim.lr, self.optim.warmup_rounds,
                 self.evaluation.lambd)

    # ------------------------------------------------------------------ the run

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: ServerEvaluation | None = None
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
        config = arguments.train_config_checked(train_config, self.local_lr, self.optim.lr)
        self.summary()
        return run_rounds(self, grid, initial_arrays, num_rounds, timeout, config,
                          evaluate_config, evaluate_fn)

    def begin(self, initial_arrays: ArrayRecord, num_rounds: int) -> None:
        """A run's start: the weights of ``initial_arrays``, a fresh server optimiser, node
        sampling and collapse watch, and the checks of ``trained`` and ``secagg`` against
        the arrays (``start`` calls it; Flower's own loop of ``configure_train`` and
        ``aggregate_train`` needs it called first)."""
        self.model.begin(initial_arrays, num_rounds)
        arguments.check_arrays(self.method, self.secagg, self.model.weights)
        self.sampler.begin()
        self.evaluation.missing = False
        self.rounds.cache = StatisticsCache() if self.absent_statistics == "cached" else None
        self.rounds.watch = self._watch()


__all__ = ["DCCOStrategy", "RoundsSkipped", "SecAgg"]
