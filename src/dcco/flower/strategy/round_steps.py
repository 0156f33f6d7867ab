"""One round of the public strategy: the statistics exchange and the update exchange over
the sampled nodes (plain messages, or SecAgg+), the server's step, and the round's metrics
with the collapse figures of its S_A.

The exchanges are ``dcco.flower.exchanges``'s, which dcco's own app runs too; the sequence is
``Algorithm.round``'s, the simulator's. Every reply left out is logged with its reason, and
a skipped round says why (``dcco.flower.failures``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from torch import Tensor

from dcco.core.algorithm import Algorithm, RoundSkipped
from dcco.core.collapse import CollapseWatch, collapse_figures
from dcco.core.server import ReplyTally
from dcco.core.statistics_cache import StatisticsCache
from dcco.core.stats import Moments
from dcco.flower import polling, secure_round
from dcco.flower.exchanges import PlainExchanges, SecureExchanges, replies_by_node
from dcco.flower.failures import causes, every_node_failed, hint, problem_lines
from dcco.flower.roundlog import tally_metrics
from dcco.flower.secure_round import SecAgg
from dcco.flower.server_model import ServerModel
from dcco.flower.userwire import NodeSettings, UserWire
from dcco.methods.predictive import head_parts, target_decay

LOG = logging.getLogger("flwr.dcco")


@dataclass
class Outcome:
    """What a round came to: the new model and its metrics, or, for a skipped round, the
    reply counters, the reason and the errors if every node failed."""

    arrays: ArrayRecord | None
    metrics: dict
    reason: str = ""
    all_failed: frozenset[str] = field(default_factory=frozenset)

    @property
    def skipped(self) -> bool:
        return self.arrays is None


class StrategyRounds:
    """The strategy's rounds.

    Args:
        algorithm: the method and the clients' rate (one local step).
        model: the server's copy of the model and its optimiser.
        nodes: what every training message tells a node.
        min_survivors: the fewest valid replies a phase needs.
        secagg: both exchanges through SecAgg+, or None.
        watch: the collapse watch of the run.
        cache: FedSC's cache of absent nodes' statistics, or None.
    """

    def __init__(self, algorithm: Algorithm, model: ServerModel, nodes: NodeSettings,
                 min_survivors: int, secagg: SecAgg | None, watch: CollapseWatch,
                 cache: StatisticsCache | None = None) -> None:
        self.algorithm, self.method = algorithm, algorithm.method
        self.model, self.nodes, self.min_survivors = model, nodes, min_survivors
        self.secagg, self.watch, self.cache = secagg, watch, cache
        self.moves_target = head_parts(self.method)[1] and not self.method.stateful
        """Whether the server moves a target network after its step (BYOL's; FedU's,
        FedEMA's and MoCo's clients each keep their own)."""

    def wire(self, r: int, config: dict, arrays: ArrayRecord | None = None) -> UserWire:
        """Round ``r``'s message layout."""
        return UserWire(self.model, self.nodes, r, config,
                        self.secagg.model if self.secagg is not None else None, arrays)

    def run(self, grid: Grid, r: int, nodes: list[int], config: ConfigRecord,
            timeout: float) -> Outcome:
        """Round ``r`` on ``nodes``: ``Algorithm.round`` over their exchanges, then the
        server's step."""
        exchanges = self._exchanges(r, {n: [n] for n in nodes}, config, timeout, grid)
        try:
            result = self.algorithm.round(exchanges, absent=exchanges.absent(self.cache))
        except RoundSkipped as e:
            self._log_problems(r, exchanges)
            return Outcome(None, self._metrics(exchanges),
                           f"{e.reason}{causes(exchanges)}{hint(exchanges)}",
                           every_node_failed(exchanges))
        self._log_problems(r, exchanges)
        arrays, metrics = self.apply(r, exchanges, result.pseudo_gradient, result.loss,
                                     result.num_samples)
        return Outcome(arrays, self._watched(r, metrics, result.shared))

    def aggregate(self, r: int, replies: Iterable[Message], asked: set[int]) -> Outcome:
        """Flower's own loop (``aggregate_train``): the update replies to round ``r``'s
        first message, through the same checks, and the server's step."""
        exchanges = PlainExchanges(None, self.wire(r, {}), r, 0.0,
                                   {n: [n] for n in sorted(asked)}, self.min_survivors)
        tally = exchanges.replies["update"] = ReplyTally()
        tally.sent = len(asked)
        try:
            updates = exchanges.take_updates(replies_by_node(replies, asked, tally), tally)
        except RoundSkipped as e:
            return Outcome(None, tally_metrics("update", tally), e.reason)
        arrays, metrics = self.apply(r, exchanges, updates.pseudo_gradient, updates.loss,
                                     updates.num_samples)
        return Outcome(arrays, metrics)

    def apply(self, r: int, exchanges: PlainExchanges, pseudo: dict[str, Tensor],
              loss: float, samples: int) -> tuple[ArrayRecord, dict]:
        """The server's step with the round's pseudo-gradient, the untrained floating arrays
        averaged from the replies used (plain messages), and the round's metrics."""
        self.model.step(pseudo, r - 1)
        if self.moves_target:  # BYOL + FedAvg: the server's target network follows
            self.model.move_target(target_decay(self.method.loss.target_decay, r - 1,
                                                self.model.rounds))
        if exchanges.used:
            self.model.average_buffers([c for _, c, _ in exchanges.used],
                                       [n for _, _, n in exchanges.used])
        return self.model.arrays(), (self._metrics(exchanges)
                                     | {"loss": float(loss), "num-examples": samples})

    def _exchanges(self, r: int, targets: dict[int, list[int]], config: ConfigRecord,
                   timeout: float, grid: Grid) -> PlainExchanges:
        wire = self.wire(r, dict(config))
        if self.secagg is None:
            return PlainExchanges(partial(polling.send_and_receive, grid), wire, r, timeout,
                                  targets, self.min_survivors)
        sa = self.secagg
        scales = secure_round.calibration(sa, self.model.weights, self.method,
                                          self.algorithm.local_lr, self.nodes.seed, r)
        return SecureExchanges(grid, wire, r, targets, self.min_survivors, scales,
                               sa.flower_config(timeout), lambda _: float(sa.max_samples),
                               wire.secure_extra())

    def _watched(self, r: int, metrics: dict, shared: Moments | None) -> dict:
        """The round's metrics with the collapse figures of its S_A (none for a method
        without statistics), and the collapse warning logged the first time they show
        collapse after the warm-up (``dcco.core.collapse.CollapseWatch``)."""
        if shared is None:
            return metrics
        figures = {k: float(v) for k, v in collapse_figures(
            shared, eps=self.method.variance_eps()).items()}
        d = next(iter(shared.tensors())).shape[0]
        if (warning := self.watch.check(r, figures, d)) is not None:
            LOG.warning("DCCO: %s", warning)
            figures["collapse-warning"] = 1.0
        return metrics | figures

    @staticmethod
    def _metrics(exchanges: PlainExchanges) -> dict:
        out = {}
        for phase, tally in exchanges.replies.items():
            out |= tally_metrics(phase, tally)
            if isinstance(exchanges, SecureExchanges):
                out[f"{phase}-clipped"] = exchanges.clipped.get(phase, 0.0)
        return out

    @staticmethod
    def _log_problems(r: int, exchanges: PlainExchanges) -> None:
        for phase, tally in exchanges.replies.items():
            for problem in problem_lines(tally.problems):
                LOG.warning("DCCO round %d, %s: %s", r, phase, problem)


class RoundsSkipped(RuntimeError):
    """Every round of ``DCCOStrategy.start`` was skipped, or, before any trained, two rounds
    in a row failed on every node with the same error: the model was never trained.

    Attributes:
        result: the run's ``Result`` (its metrics say, round by round, what became of the
            replies).
    """

    def __init__(self, message: str, result: Result) -> None:
        super().__init__(message)
        self.result = result


def skipped_round(r: int, num_rounds: int, outcome: Outcome, skipped: list[str],
                  failing: list[frozenset[str]], result: Result) -> None:
    """Log a skipped round; stop the run once, before any round trained, two rounds in a
    row failed on every node with the same error."""
    LOG.warning("DCCO round %d/%d: skipped, the model unchanged: %s", r, num_rounds,
                outcome.reason)
    skipped.append(f"round {r}: {outcome.reason}")
    failing[:] = (failing + [outcome.all_failed])[-2:] if outcome.all_failed else []
    if (len(failing) == 2 and failing[0] == failing[1] and r < num_rounds
            and all(m["skipped"] for m in result.train_metrics_clientapp.values())):
        raise RoundsSkipped(
            f"no round has trained, and rounds {r - 1} and {r} failed on every node with "
            f"the same error, which each of the {num_rounds - r} rounds left would meet too; "
            f"stopped after round {r}: {outcome.reason}", result)


__all__ = ["Outcome", "RoundsSkipped", "StrategyRounds", "skipped_round"]
