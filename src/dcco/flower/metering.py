"""Traffic of dcco's Flower server: the content bytes of every message a round carries."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from flwr.app import Message
from flwr.common.serde import recorddict_to_proto
from flwr.serverapp import Grid

from dcco.flower import polling


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


__all__ = ["MeteredGrid", "content_bytes"]
