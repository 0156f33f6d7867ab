"""DCCO in your own code: a round's parts over your own PyTorch model, and a simulator that
trains it over your own clients (docs/own_code.md). Everything here is re-exported from
``dcco``.

A round of a statistics method (``dcco``, ``dvicreg``), with K clients::

    replies = [dcco.statistics(model, x1_k, x2_k) for each client]         # phase 1, clients
    shared = dcco.merge_statistics(replies, model)                          # server
    updates = [dcco.local_update(model, x1_k, x2_k, shared.aggregate) ...]  # phase 2, clients
    step = dcco.aggregate_updates(updates, model)                           # server
    dcco.apply_update(model, optimizer, step.pseudo_gradient)               # server

One such round is one centralized step on the pooled batch (``tests/test_api.py`` checks it
against dcco's reference round to 1e-12 in float64). The server's functions validate every
reply as dcco's Flower app does: a malformed one is left out and counted by kind
(``ReplyTally``), never used. ``dcco.fit`` runs whole trainings in the batched simulator.

A model is either a ``DualEncoder`` (``dual_encoder(...)``: your encoder or two towers, and a
projector) or a plain ``nn.Module`` that maps a batch of one view to (N, d) encodings; the
latter is the shared encoder of both views, and updates are keyed by its own parameter names.
"""

from __future__ import annotations

from dcco.models.user_encoder import IdentityProjector, dual_encoder, feature_dim
from dcco.round_parts import (
    Aggregated,
    KeptForward,
    Merged,
    Model,
    aggregate_updates,
    apply_update,
    local_update,
    merge_statistics,
    method,
    server_optimizer,
    statistics,
    statistics_kept,
    update_from_kept,
)

__all__ = [
    "Aggregated",
    "IdentityProjector",
    "KeptForward",
    "Merged",
    "Model",
    "aggregate_updates",
    "apply_update",
    "dual_encoder",
    "feature_dim",
    "local_update",
    "merge_statistics",
    "method",
    "server_optimizer",
    "statistics",
    "statistics_kept",
    "update_from_kept",
]
