"""The ClientApp mod for SecAgg+: Flower's ``secaggplus_mod`` on SecAgg+'s messages only, so
that one ClientApp serves plain and secure rounds (dcco's own app, and yours with the
``dcco.flower.DCCOStrategy`` strategy: ``@app.train(mods=[secure_aggregation_mod])``). It imports
Flower only."""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS


def secure_aggregation_mod(msg: Message, context: Context,
                           call_next: ClientAppCallable) -> Message:
    """Flower's ``secaggplus_mod`` for the messages of a SecAgg+ exchange, the others
    straight to the handler.

    Parameters
    ----------
    msg : Message
        The message the ClientApp received.
    context : Context
        The node's context.
    call_next : ClientAppCallable
        The next mod or the handler (Flower's mod chain).
    """
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


__all__ = ["secure_aggregation_mod"]
