"""MoCo v2 with FedAvg (He et al., CVPR 2020; Chen, Fan, Girshick & He 2020), the
queue-based contrastive baseline of FedU's and FedEMA's papers.

A client's query encoder is the global model (backbone and projector); its key encoder is a
copy of the global query encoder at the round's start that follows the query encoder after
each local step by a moving average (``loss.target_decay``'s schedule, as BYOL's target:
``dcco.core.client.stateful_update``). Each query's positive is the key of its sample's
other view; its negatives are the keys of the client's other samples and the client's
queue (``dcco.core.losses.moco_loss_per_sample``, InfoNCE at τ = ``loss.moco_temperature``,
0.2 as v2). The server averages the query encoders; keys and queue never leave the client.

Choices the papers leave open, and the ones made here:

- **The key encoder restarts from the global query encoder every round**, as the authors'
  federated code does (EasyFL's ``fedssl``: ``reset_key_encoder``): a client that takes part
  once has no key encoder of its own to keep, and one kept for a returning client would be
  an average of an old global model.
- **The queue is the client's own** (``loss.moco_queue`` keys, its state between rounds,
  ``dcco.core.client_state``): a server-side queue would gather clients' encodings at the
  server, which is what federated learning exists to avoid. After its local steps a client
  pushes the keys of both views of its samples, from its key encoder as the round leaves
  it, and keeps the newest ``moco_queue``.
- **Its size is 0 by default**, so the negatives are the client's own batch (MoCo v3's
  in-batch keys). A client of 1 to 16 photos that queued its keys would meet, in its next
  round, the keys of the very photos it then sees: negatives that are its positives. For
  clients of tens to hundreds of samples that return every round (the cross-silo setting)
  set one round's keys, twice the client's samples: the newest key of each view of each of
  its photos, so a query meets two older keys of its own photo among the queue (1 % of its
  negatives at 64 photos: experiments/fedssl_cross_silo_fmnist.toml).
- **In-batch negatives as well as the queue**: with an empty queue, MoCo's queue-only
  negatives leave a query nothing to contrast with.
- **The key encoder's momentum is BYOL's schedule** (``loss.target_decay``, 0.99 rising to
  1 over the run), not v2's fixed 0.999: one setting serves every target network of dcco.
  Since the key encoder restarts from the global query encoder each round, its momentum
  only sets how far it follows the queries within a round's local steps (1 to 5 % of the
  way in 1 to 5 steps at 0.99; a tenth of that at 0.999); ``loss.target_decay = 0.999``
  gives v2's start. With one local step the key encoder is the round's global query
  encoder itself: the keys are the queries with their gradient stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcco.config import LossConfig
from dcco.core.client_state import ClientStart, Layout
from dcco.core.losses import moco_loss_per_sample, split_prediction
from dcco.core.stats import Moments
from dcco.methods.base import MethodBase
from dcco.methods.predictive import PredictiveMethod

QUEUE = "moco.queue"
"""A MoCo client's queue in its state: (Q, d) unit keys, the newest first."""


def _no_predictor(projector: tuple[int, ...]) -> tuple[int, ...]:
    """MoCo has no predictor: its queries are the projections."""
    return ()


@dataclass(frozen=True)
class MoCoFedAvg(PredictiveMethod):
    """MoCo v2 with FedAvg: He, Fan, Wu, Xie & Girshick, "Momentum Contrast for Unsupervised
    Visual Representation Learning", CVPR 2020; Chen, Fan, Girshick & He, "Improved
    Baselines with Momentum Contrastive Learning", arXiv:2003.04297, 2020; the baseline of
    FedU's and FedEMA's papers. A client's InfoNCE of its queries against its key encoder's
    keys and its own queue; the module's docstring gives the choices made where the papers
    leave them open."""

    loss: LossConfig = field(default_factory=LossConfig)
    queue: Tensor | None = field(default=None, compare=False, repr=False)
    """The client's queue during its local steps (set per client by ``client_start``)."""

    name: ClassVar[str] = "moco_fedavg"
    federated: ClassVar[bool] = True
    stateful: ClassVar[bool] = True
    has_predictor: ClassVar[bool] = False
    min_client_samples: ClassVar[int] = 2
    target: ClassVar[str] = "ema"
    default_projector: ClassVar[tuple[int, ...]] = (2048, 128)  # MoCo v2's MLP head
    default_predictor = staticmethod(_no_predictor)
    loss_kind: ClassVar[str] = "MoCo InfoNCE within each client (weighted mean)"
    similarity: ClassVar[str] = "cosine"

    round_loss = MethodBase.round_loss  # client by client: negatives stay within a client

    def client_loss(self, f: Tensor, g: Tensor, shared: Moments | None) -> Tensor:
        """The mean InfoNCE over the client's samples, its two directions averaged (or
        summed: ``loss.moco_directions``); F = [q₁, k₁], G = [q₂, k₂]."""
        (q1, k1), (q2, k2) = split_prediction(f), split_prediction(g)
        loss = moco_loss_per_sample(q1, q2, k1, k2, self.queue,
                                    self.loss.moco_temperature).mean()
        return loss * 2 if self.loss.moco_directions == "sum" else loss

    def client_start(self, global_weights: Mapping[str, Tensor],
                     state: Mapping[str, Tensor] | None, layout: Layout,
                     round_index: int) -> ClientStart:
        """The global query encoder, a key encoder copied from it, and the client's queue."""
        weights = {n: global_weights[n] for n in layout.online}
        weights |= {t: global_weights[o] for t, o in layout.target}
        queue = None if state is None else state.get(QUEUE)
        return ClientStart(weights, {} if queue is None else {QUEUE: queue},
                           replace(self, queue=queue))

    @torch.no_grad()
    def client_end(self, end: dict[str, Tensor], start: ClientStart, work: nn.Module,
                   x1: Tensor, x2: Tensor) -> dict[str, Tensor]:
        """The client's queue with its keys of this round pushed in, the newest
        ``loss.moco_queue`` kept (nothing without a queue)."""
        size = self.loss.moco_queue
        if not size:
            return {}
        f, g = work(x1, x2)
        keys = F.normalize(torch.cat([split_prediction(f)[1], split_prediction(g)[1]]), dim=1)
        old = start.keep.get(QUEUE)
        queue = keys if old is None else torch.cat([keys, old.to(keys.dtype)])
        return {QUEUE: queue[:size].clone()}

    def state_shapes(self, model: nn.Module) -> dict[str, torch.Size]:
        """One client's state: its queue of ``loss.moco_queue`` keys of width d."""
        size = self.loss.moco_queue
        return {QUEUE: torch.Size([size, model.projection_dim])} if size else {}
