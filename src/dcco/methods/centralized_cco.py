"""Centralized CCO: Barlow Twins minibatch training on the pooled data (the paper's upper bound).

Its optimiser's parameter groups come in dcco's form and Barlow Twins' (``optim.vector_lr_scale
= 0.024``), and its loss has Barlow Twins' code's ε: ``dcco.methods.dcco``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from torch import Tensor

from dcco.config import LossConfig
from dcco.core.losses import cco_loss
from dcco.core.stats import Moments, encoding_stats
from dcco.methods.base import MethodBase, Segments


@dataclass(frozen=True)
class CentralizedCCO(MethodBase):
    loss: LossConfig = field(default_factory=LossConfig)

    name: ClassVar[str] = "centralized_cco"
    federated: ClassVar[bool] = False
    min_client_samples: ClassVar[int] = 1
    default_projector: ClassVar[tuple[int, ...]] = (1024, 1024, 1024)
    loss_kind: ClassVar[str] = "CCO loss of the round's pooled batch"
    uses_eps: ClassVar[bool] = True

    def client_loss(self, f: Tensor, g: Tensor, shared: Moments | None) -> Tensor:
        """The CCO loss of a whole minibatch (the 'client' is the data centre)."""
        return cco_loss(encoding_stats(f, g).moments(), self.loss.lambd, self.loss.eps)

    def round_loss(self, f: Tensor, g: Tensor, segments: Segments,
                   shared: Moments | None) -> Tensor:
        return self.client_loss(f, g, shared)
