"""A Flower ``Grid`` that delivers messages to a ClientApp in this process.

For tests and debugging: the ServerApp's round logic and the real ClientApp (mods included,
so SecAgg+ runs for real) talk through Flower ``Message`` objects without a SuperLink. Every
message is deep-copied in both directions, as the network would, and each node keeps its own
``Context`` (node config, state) across messages, as a SuperNode does. A ``tamper`` hook sees
every reply and may replace or drop it: how the tests make clients fail, time out or send
malformed replies.

Like Flower's ``flwr-serverapp`` process, the grid sets Flower's process-wide
``TaskIdentity`` (run 1, server node 0), which ``Message`` needs to stamp new instructions.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Mapping

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

RUN_ID, SERVER_NODE_ID = 1, 0

Tamper = Callable[[int, Message, Message], Message | None]
"""(node id, instruction, reply) → the reply to deliver, or None to lose it."""


class InProcessGrid(Grid):
    """Nodes ``1..n`` (or ``node_ids``) with the given node configs, all running ``app``.

    Args:
        app: the ClientApp every node runs.
        node_configs: one ``--node-config`` mapping per node.
        run_config: the run config every node sees.
        tamper: optional hook on every reply.
        node_ids: the nodes' ids, one per node config (default ``1..n``); Flower's own
            deployments draw a random 64-bit id for each node.
    """

    def __init__(self, app: ClientApp, node_configs: list[Mapping[str, object]],
                 run_config: Mapping[str, object], tamper: Tamper | None = None,
                 node_ids: list[int] | None = None) -> None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN_ID, SERVER_NODE_ID, 0
        self.app, self.tamper = app, tamper
        ids = list(range(1, len(node_configs) + 1)) if node_ids is None else list(node_ids)
        if len(ids) != len(node_configs) or len(set(ids)) != len(ids) or SERVER_NODE_ID in ids:
            raise ValueError(f"node_ids must be {len(node_configs)} distinct ids other than the "
                             f"server's {SERVER_NODE_ID}, one per node config; got {ids}")
        self.contexts = {
            node: Context(run_id=RUN_ID, node_id=node, node_config=dict(nc), state=RecordDict(),
                          run_config=dict(run_config))
            for node, nc in zip(ids, node_configs, strict=True)
        }
        self.online = set(self.contexts)
        self._run = Run.create_empty(RUN_ID)
        self._ids = itertools.count()
        self._replies: dict[str, Message] = {}

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return sorted(self.online)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg_id = str(next(self._ids))
            sent = copy.deepcopy(msg)
            # as a SuperLink does: the message gets its id, and its reply names it
            sent.metadata.__dict__["_message_id"] = msg_id
            reply = self._deliver(sent)
            if reply is not None:
                self._replies[msg_id] = copy.deepcopy(reply)
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    replies_at_once = True
    """Every reply exists once its message is pushed (a lost node's never will), so a caller
    need not poll (``metering.MeteredGrid``)."""

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return list(self.pull_messages(list(self.push_messages(messages))))

    def _deliver(self, msg: Message) -> Message | None:
        node = msg.metadata.dst_node_id
        if node not in self.online:
            return None
        try:
            reply = self.app(msg, self.contexts[node])
        except Exception as e:  # noqa: BLE001 (a SuperNode turns any ClientApp exception into an error reply)
            reason = f"{type(e)}:<'{e}'>"  # as Flower 1.42's SuperNode and simulation write it
            reply = Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason), reply_to=msg)
        return reply if self.tamper is None else self.tamper(node, msg, reply)


def vector_app(samples: int = 8, width: int = 6, out: int = 8):
    """A ClientApp to try a strategy with in this process: each node holds ``samples`` seeded
    random vectors of ``width`` (seeded by its node id) and answers every training message
    with ``dcco.flower.answer`` on a ``torch.nn.Linear(width, out)``, its views the vectors
    with a little noise."""
    import torch
    from flwr.clientapp import ClientApp

    from dcco.flower.userapp import answer

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        gen = torch.Generator().manual_seed(context.node_id)
        x = torch.randn(samples, width, generator=gen)
        return answer(msg, context, torch.nn.Linear(width, out), x, views_key=context.node_id,
                      augment=lambda v: v + 0.1 * torch.randn_like(v))

    return app

