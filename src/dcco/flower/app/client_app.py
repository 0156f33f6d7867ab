"""The dcco ClientApp: hand each message of the server to the node's handlers.

The handlers (``dcco.flower.app.handlers``: ``query``, and ``train`` for both phases of a round)
run here, or, with ``flower.worker = true``, in the node's long-lived worker
(``dcco.flower.app.worker``), which holds torch, the data and the model across messages: Flower
starts this app in a new process for every message, and without a worker each process
imports torch again. This module imports Flower only; the handlers are imported when a
message needs them here.

Under SecAgg+ the same handler runs inside Flower's ``secaggplus_mod``, which masks the reply
(here, in the ClientApp's process, with or without a worker).
"""

from __future__ import annotations

import time

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from dcco.flower import timing
from dcco.flower.app import worker
from dcco.flower.mods import secure_aggregation_mod

app = ClientApp()


def _handled(kind: str, msg: Message, context: Context) -> Message:
    started = time.time()
    if worker.enabled(context.run_config):
        reply: RecordDict = worker.call(kind, msg.content, context)
    else:
        from dcco.flower.app import handlers

        reply = getattr(handlers, kind)(msg.content, context)
    if timing.enabled():  # when the reply goes back to Flower, for the reply gaps
        timing.record("app", message=kind, app_start=started, app_return=time.time())
    return Message(reply, reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Who this node is: the server maps partition ids to node ids with it."""
    return _handled("query", msg, context)


@app.train(mods=[secure_aggregation_mod])
def train(msg: Message, context: Context) -> Message:
    """Phase "stats" or "update" of a round for the node's sampled clients."""
    return _handled("train", msg, context)
