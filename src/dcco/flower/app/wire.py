"""dcco's app's layout of a round's messages (a ``dcco.flower.exchanges.Wire``): the
instruction codec of ``dcco.flower.codec``, each node hosting several of the run's clients, and
the checks of the nodes' replies against the server's own model."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flwr.app import RecordDict
from torch import Tensor

from dcco.core.client import ClientUpdate
from dcco.core.server import ReplyError, validate_statistics, validate_update
from dcco.core.stats import EncodingStats, Moments, StatsSpec
from dcco.flower import codec
from dcco.flower.codec import Instruction

if TYPE_CHECKING:  # the run's state, which the app's server holds
    from dcco.run.pretraining import Pretraining


class AppWire:
    """dcco's app's layout of a round's messages (``dcco.flower.codec``): each node hosts
    several of the run's clients, named in its instruction, and its replies are checked
    against the server's own model (``dcco.flower.exchanges.Wire``).

    Args:
        pt: the training state (the model's width and trained parameters).
        r: the round. weights: the global model (``state_dict``).
        states_key: the run's key for the clients' states on the nodes' disks.
    """

    def __init__(self, pt: Pretraining, r: int, weights: dict[str, Tensor],
                 states_key: str = "") -> None:
        self.pt, self.r, self.weights, self.states_key = pt, r, weights, states_key

    def instruction(self, phase: str, clients: list[int], model: bool,
                    shared: Moments | None = None, with_stats: bool = False) -> Instruction:
        return Instruction(phase, self.r, tuple(clients), self.weights if model else None,
                           shared, with_stats, self.states_key)

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


__all__ = ["AppWire", "validate_update_reply"]
