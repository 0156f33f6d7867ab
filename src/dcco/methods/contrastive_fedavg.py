"""Contrastive + FedAvg: each client minimises NT-Xent over its own samples (paper §4 baseline)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from dcco.config import LossConfig
from dcco.core.losses import nt_xent, nt_xent_per_anchor
from dcco.core.stats import Moments
from dcco.methods.base import MethodBase, Segments


@dataclass(frozen=True)
class ContrastiveFedAvg(MethodBase):
    loss: LossConfig = field(default_factory=LossConfig)

    name: ClassVar[str] = "contrastive_fedavg"
    federated: ClassVar[bool] = True
    min_client_samples: ClassVar[int] = 2
    default_projector: ClassVar[tuple[int, ...]] = (256, 256, 128)
    loss_kind: ClassVar[str] = "NT-Xent loss within each client (weighted mean)"
    similarity: ClassVar[str] = "cosine"

    def client_loss(self, f: Tensor, g: Tensor, shared: Moments | None) -> Tensor:
        return nt_xent(f, g, self.loss.temperature)

    def round_loss(self, f: Tensor, g: Tensor, segments: Segments,
                   shared: Moments | None) -> Tensor:
        """Block-diagonal NT-Xent: every view is contrasted only within its own client.

        Each client's loss is the mean over its 2N_k views, weighted by N_k/N, so every view
        of the round carries the weight 1/(2N).
        """
        per_view = nt_xent_per_anchor(f, g, self.loss.temperature, groups=segments.ids)
        return per_view.sum(dtype=torch.float64) / per_view.shape[0]
