"""Federated evaluation in the public strategy, as Flower's ``FedAvg`` does it, and before
the first round too (the untrained model's score, the baseline of the later ones): after each
round the model and ``evaluate_config`` go to a sample of the nodes' ``@app.evaluate``, and
their metrics are combined (by default, their average weighted by ``num-examples``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from dcco.flower.roundlog import metrics_line
from dcco.flower.strategy.node_sampling import NodeSampler
from dcco.flower.userwire import LAMBDA

LOG = logging.getLogger("flwr.dcco")
NO_EVALUATE = "No evaluate function registered"
"""What Flower's ClientApp raises for an ``evaluate`` message without an ``@app.evaluate``
(``flwr/clientapp/client_app.py``, 1.41 and 1.42), in the error reply's reason."""


class FederatedEvaluation:
    """The evaluation messages and the combination of their replies.

    Args:
        sampler: whose ``evaluate`` stream picks the nodes.
        lambd: the loss's λ, sent with the config (``dcco.flower.evaluate_encoder`` reads it).
        arrayrecord_key, configrecord_key: the messages' keys, as ``FedAvg``'s.
        aggregate: combines the replies' metrics (``FedAvg``'s ``evaluate_metrics_aggr_fn``);
            None: their average weighted by ``weighted_by_key``.
        weighted_by_key: the replies' sample count key.
    """

    def __init__(self, sampler: NodeSampler, lambd: float, arrayrecord_key: str,
                 configrecord_key: str, aggregate: Callable | None,
                 weighted_by_key: str) -> None:
        self.sampler, self.lambd = sampler, lambd
        self.arrayrecord_key, self.configrecord_key = arrayrecord_key, configrecord_key
        self.aggregate_fn = aggregate or aggregate_metricrecords
        self.weighted_by_key = weighted_by_key
        self.missing = False
        """Whether the nodes' ClientApp turned out to have no ``@app.evaluate``."""

    def messages(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                 grid: Grid) -> Iterable[Message]:
        """The model and ``config`` (with ``server-round`` and λ) to the sampled nodes; none
        at ``fraction_evaluate = 0`` or once the ClientApp was found to have no
        ``@app.evaluate``."""
        if self.missing:
            return []
        nodes = self.sampler.evaluate(grid)
        config = ConfigRecord(dict(config) | {"server-round": server_round,
                                              LAMBDA: float(self.lambd)})
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return [Message(content, dst_node_id=n, message_type=MessageType.EVALUATE,
                        group_id=str(server_round)) for n in nodes]

    def combine(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The replies' metrics combined; a failed reply is logged with its reason and left
        out; None when none is valid. When every reply failed because the ClientApp has no
        ``@app.evaluate`` (FedAvg's default ``fraction_evaluate = 1`` meeting an app that
        only trains), that is said once and the run asks for no more evaluation."""
        replies = list(replies)
        if replies and all(r.has_error() and NO_EVALUATE in r.error.reason for r in replies):
            self.missing = True
            LOG.warning("DCCO round %d, evaluation: the nodes' ClientApp has no @app.evaluate "
                        "(%s); no more federated evaluation in this run. Add one, or pass "
                        "DCCOStrategy(fraction_evaluate=0.0) to ask for none", server_round,
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
            return self.aggregate_fn(valid, self.weighted_by_key)
        except (KeyError, ValueError, TypeError) as e:
            LOG.warning("DCCO round %d, evaluation: the replies' metrics could not be "
                        "combined (%s: %s); an @app.evaluate reply needs a MetricRecord "
                        "with %r", server_round, type(e).__name__, e, self.weighted_by_key)
            return None

    def run(self, grid: Grid, r: int, result: Result, config: ConfigRecord | None,
            timeout: float) -> list[int]:
        """Round ``r``'s evaluation into ``result.evaluate_metrics_clientapp``; the nodes
        asked."""
        messages = list(self.messages(r, result.arrays, config or ConfigRecord(), grid))
        if not messages:
            return []
        replies = grid.send_and_receive(messages, timeout=timeout)
        if (metrics := self.combine(r, replies)) is not None:
            result.evaluate_metrics_clientapp[r] = metrics
        return [m.metadata.dst_node_id for m in messages]


ServerEvaluation = Callable[[int, ArrayRecord], MetricRecord | None]
"""Flower's ``evaluate_fn``: the round (0: the initial model) and the model's arrays."""


def evaluate_round(evaluation: FederatedEvaluation, grid: Grid, r: int, num_rounds: int,
                   result: Result, config: ConfigRecord | None, timeout: float,
                   evaluate_fn: ServerEvaluation | None) -> None:
    """Round ``r``'s federated evaluation (``r = 0``: the initial model's, on the nodes of
    evaluation's own sample, as each later round's) and the server's ``evaluate_fn``, into
    ``result`` and each in a line of the log, the federated one with the nodes it asked."""
    nodes = evaluation.run(grid, r, result, config, timeout)
    which = f"round {r}/{num_rounds}" + (" (the initial model)" if r == 0 else "")
    if (metrics := result.evaluate_metrics_clientapp.get(r)) is not None:
        LOG.info("DCCO %s, federated evaluation on %s: %s", which, _nodes(nodes),
                 metrics_line(metrics))
    if evaluate_fn is not None and (metrics := evaluate_fn(r, result.arrays)) is not None:
        result.evaluate_metrics_serverapp[r] = metrics
        LOG.info("DCCO %s, server evaluation: %s", which, metrics_line(metrics))


def _nodes(nodes: list[int]) -> str:
    shown = ", ".join(map(str, nodes[:8])) + (", ..." if len(nodes) > 8 else "")
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} ({shown})"


__all__ = ["NO_EVALUATE", "FederatedEvaluation", "ServerEvaluation", "evaluate_round"]
