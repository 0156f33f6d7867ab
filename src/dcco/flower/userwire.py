"""The messages of dcco's public strategy (``dcco.flower.DCCOStrategy``) and a user's ClientApp
(``dcco.flower.answer``): the keys of the ``config`` record the strategy sends, S_A as a record,
and ``UserWire``, the strategy's layout of a round's messages with the checks of the nodes'
replies (a ``dcco.flower.exchanges.Wire``; one client a node)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from torch import Tensor, nn

from dcco.config import LossConfig
from dcco.core.client import ClientUpdate
from dcco.core.seeding import derive_seed
from dcco.core.server import ReplyError, validate_statistics, validate_update
from dcco.core.stats import EncodingStats, Moments, StatsSpec
from dcco.flower import codec
from dcco.flower.codec import Instruction
from dcco.flower.server_model import ServerModel
from dcco.methods.predictive import target_decay
from dcco.methods.registry import METHODS

PHASE, ROUND, VIEWS_SEED, METHOD, LOCAL_LR = ("phase", "server-round", "views-seed", "method",
                                              "local-lr")
"""Keys of the ``config`` record the strategy sends (``dcco.flower.userapp`` reads them)."""
LAMBDA = "loss-lambda"
"""The CCO loss's λ, which the nodes' losses use (a node given none: the paper's 20)."""
LOSS, TARGET_DECAY = "loss-config", "target-decay"
"""The method's loss settings besides λ (``LossConfig``'s as JSON; a node given none: their
defaults), and the round's τ, by which a FedU, FedEMA or MoCo client's own target network
follows its online network after each local step."""
AGGREGATION = "aggregation"
"""The server's rule for combining updates when it is not FedAvg's ("ldawa": each node scales
its update by L-DAWA's layer cosines before replying, ``dcco.core.aggregation``)."""
STATES_KEY = "states-key"
"""The run's key for a FedU, FedEMA or MoCo node's state on its own disk
(``answer(state_dir=...)``, ``dcco.flower.node_states``): a resumed run keeps its own."""


def moments_record(m: Moments) -> ArrayRecord:
    """S_A (its means and count) as one packed ``ArrayRecord``."""
    return codec.array_record({k: v for k, v in m.items()} | {"count": m.count.reshape(1)})


def moments_of(record: ArrayRecord) -> Moments:
    """``moments_record``'s inverse (float64)."""
    tensors = {k: v.to(torch.float64) for k, v in codec.tensors_of(record).items()}
    count = tensors.pop("count").reshape(())
    return Moments(tensors, count=count)


@dataclass(frozen=True)
class NodeSettings:
    """What every training message tells a node: the method, the client rate, the seed that
    each round's views derive from, the method's loss settings (λ on its own key, the others
    when they are not the defaults), and for a client that keeps a target network of its own
    the round's τ."""

    method: str
    local_lr: float
    seed: int
    loss: LossConfig
    aggregation: str = "fedavg"

    @property
    def lambd(self) -> float:
        return self.loss.lambd

    def config(self, phase: str, r: int, extra: dict, rounds: int = 1,
               states_key: str = "") -> ConfigRecord:
        """The ``config`` record of round ``r`` (of ``rounds``)'s ``phase`` message, over the
        user's ``train_config`` (``extra``); a stateful method's carries the run's
        ``states_key``."""
        out = extra | {PHASE: phase, ROUND: r, METHOD: self.method,
                       VIEWS_SEED: derive_seed(self.seed, "views", r) % (1 << 62),
                       LOCAL_LR: self.local_lr, LAMBDA: float(self.lambd)}
        if self.loss != LossConfig(lambd=self.lambd):
            out[LOSS] = json.dumps(asdict(self.loss))
        if self.aggregation != "fedavg":
            out[AGGREGATION] = self.aggregation
        if METHODS[self.method].stateful:
            out[TARGET_DECAY] = target_decay(self.loss.target_decay, r - 1, rounds)
            if states_key:
                out[STATES_KEY] = states_key
        return ConfigRecord(out)


class UserWire:
    """The strategy's layout of a round's messages (``dcco.flower.exchanges.Wire``): the
    records a user's ClientApp answers with ``dcco.flower.answer``, one client a node. The
    replies are checked against what most of them hold (the encoding width of most
    statistics replies, the arrays most updates train): the strategy has no model of its own.

    Args:
        model: the strategy's copy of the model (its weights, the trained names, the
            optimiser's parameters). nodes: what every message tells a node.
        r: the round (from 1). config: the user's ``train_config``.
        secagg_model: the nodes' model under SecAgg+ (its arrays' order), or None.
        arrays: the model to send (default: ``model``'s weights), less what the nodes
            keep (``kept_by_nodes``).
    """

    def __init__(self, model: ServerModel, nodes: NodeSettings, r: int, config: dict,
                 secagg_model: nn.Module | None = None,
                 arrays: ArrayRecord | None = None) -> None:
        self.model, self.nodes, self.r, self.config = model, nodes, r, config
        self.secagg_model, self._arrays = secagg_model, arrays
        self._sent: ArrayRecord | None = None

    def _model(self) -> ArrayRecord:
        if self._sent is None:  # one record for every node's message
            kept = self.kept_by_nodes()
            if self._arrays is not None and not kept:
                self._sent = self._arrays
            else:
                weights = (self.model.weights if self._arrays is None
                           else codec.tensors_of(self._arrays))
                self._sent = codec.array_record({k: v for k, v in weights.items()
                                                 if k not in kept})
        return self._sent

    def _config(self, phase: str) -> ConfigRecord:
        return self.nodes.config(phase, self.r, self.config, self.model.rounds,
                                 self.model.states_key)

    def kept_by_nodes(self) -> set[str]:
        """The arrays a training message leaves out: for FedU, FedEMA and MoCo, whose
        clients keep their own target network, the target of each trained array (known
        from the first round's replies, or ``trained``); none for the other methods."""
        if not METHODS[self.nodes.method].stateful:
            return set()
        return {t for t, _ in self.model.target_pairs()}

    def stats_message(self, clients: list[int]) -> RecordDict:
        return RecordDict({"arrays": self._model(),
                           "config": self._config("stats")})

    def update_message(self, clients: list[int], model: bool, shared: Moments | None,
                       with_stats: bool) -> RecordDict:
        content = {"config": self._config("update")}
        if model:
            content["arrays"] = self._model()
        if shared is not None:
            content["statistics"] = moments_record(shared)
        return RecordDict(content)

    def instruction(self, phase: str, clients: list[int], model: bool,
                    shared: Moments | None = None, with_stats: bool = False) -> Instruction:
        weights = self.model.weights  # in the nodes' order (secagg.model's)
        own = {k: weights[k] for k in self.secagg_model.state_dict()} if model else None
        return Instruction(phase, self.r, (), own, shared, with_stats)

    def secure_extra(self) -> dict:
        """The strategy's keys for a secure exchange's config (which carries its own phase
        and round)."""
        return {k: v for k, v in self._config("").items()
                if k not in (PHASE, ROUND)}

    def stats_check(self, contents: list[RecordDict], spec: StatsSpec
                    ) -> Callable[[RecordDict], EncodingStats]:
        decoded: dict[int, dict | Exception] = {}  # each reply decoded once, by identity
        for c in contents:
            try:
                sums = codec.tensors_of(c.array_records["statistics"])
                decoded[id(c)] = sums | {"count": c.metric_records["metrics"]["num-examples"]}
            except (KeyError, TypeError, ValueError) as e:
                decoded[id(c)] = e
        first = f"sum_{spec.fields[0].name}"  # its first axis is the width d
        widths = Counter(int(s[first].shape[0]) for s in decoded.values()
                         if isinstance(s, dict) and isinstance(s.get(first), Tensor)
                         and s[first].ndim >= 1)
        d = widths.most_common(1)[0][0] if widths else None

        def check(c: RecordDict) -> EncodingStats:
            sums = decoded[id(c)]
            if isinstance(sums, Exception):
                raise sums  # counted by its kind (accept_valid)
            if d is None:
                raise ReplyError("missing_key", f"no statistics reply holds {first}")
            return validate_statistics(sums, d, d, spec=spec)

        return check

    def each_stats_check(self, contents: list[RecordDict], spec: StatsSpec
                         ) -> Callable[[RecordDict, int], list[EncodingStats]]:
        check = self.stats_check(contents, spec)  # a node is one client
        return lambda c, clients: [check(c)]

    def update_check(self, contents: list[RecordDict], with_stats: StatsSpec | None
                     ) -> Callable[[RecordDict], tuple[ClientUpdate, None]]:
        server = self.model
        server.learn_trained(contents)  # the names most replies train, fixed from now on
        shapes = {k: tuple(server.weights[k].shape) for k in server.trained or ()
                  if k in server.weights}

        def check(c: RecordDict) -> tuple[ClientUpdate, None]:
            if not shapes:
                raise ReplyError("missing_key", "no update names a parameter of the model")
            delta = codec.tensors_of(c.array_records["arrays"])
            m = c.metric_records["metrics"]
            extra = set(delta) - set(shapes)
            if extra:
                raise ReplyError("missing_key", f"update holds arrays the model lacks or does "
                                                f"not train: {sorted(extra)[:3]}")
            return validate_update(delta, m["num-examples"], shapes, loss=m.get("loss")), None

        return check

    def params(self) -> dict[str, Tensor]:
        return self.model.params()


__all__ = ["AGGREGATION", "LAMBDA", "LOCAL_LR", "LOSS", "METHOD", "PHASE", "ROUND", "TARGET_DECAY", "VIEWS_SEED",
           "NodeSettings", "UserWire", "moments_of", "moments_record"]
