"""DCCO as a Flower strategy for your own ServerApp (the Message API; dcco pins flwr 1.41-1.42).

Where your ServerApp calls Flower's ``FedAvg(...).start(...)``, call ``DCCOStrategy(...).start(...)``
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

The package by job: ``strategy`` (``DCCOStrategy``: Flower's hooks and the run),
``arguments`` (the checks of its arguments), ``sampling`` (the nodes of each round),
``rounds`` (a round's two exchanges, the server's step, the round's metrics), ``evaluation``
(FedAvg's federated evaluation) and ``checkpoint`` (resume after a stop). The server's copy
of the model is ``dcco.flower.server_model``'s, and the messages' layout
``dcco.flower.userwire``'s, which the nodes' side reads too.
"""

from dcco.flower.secure_round import SecAgg
from dcco.flower.strategy.round_steps import RoundsSkipped
from dcco.flower.strategy.strategy import DCCOStrategy

__all__ = ["DCCOStrategy", "RoundsSkipped", "SecAgg"]
