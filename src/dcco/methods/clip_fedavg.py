"""CLIP + FedAvg: each client minimises the CLIP loss of its own pairs, with cross-modal
negatives only (Radford et al. 2021): the contrastive baseline for two modalities."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from dcco.config import LossConfig
from dcco.core.losses import clip_loss, clip_loss_per_anchor
from dcco.core.stats import Moments
from dcco.methods.base import MethodBase, Segments


@dataclass(frozen=True)
class ClipFedAvg(MethodBase):
    loss: LossConfig = field(default_factory=LossConfig)

    name: ClassVar[str] = "clip_fedavg"
    federated: ClassVar[bool] = True
    min_client_samples: ClassVar[int] = 2
    default_projector: ClassVar[tuple[int, ...]] = (256, 256, 128)
    loss_kind: ClassVar[str] = "CLIP loss within each client (weighted mean)"
    similarity: ClassVar[str] = "cosine"

    def client_loss(self, f: Tensor, g: Tensor, shared: Moments | None) -> Tensor:
        return clip_loss(f, g, self.loss.temperature)

    def round_loss(self, f: Tensor, g: Tensor, segments: Segments,
                   shared: Moments | None) -> Tensor:
        """Block-diagonal CLIP: every encoding is contrasted only with the other modality's
        encodings of its own client.

        A client's loss is the mean over its 2N_k anchors, weighted by N_k/N, so every anchor
        of the round carries the weight 1/(2N).
        """
        per_anchor = clip_loss_per_anchor(f, g, self.loss.temperature, groups=segments.ids)
        return per_anchor.sum(dtype=torch.float64) / per_anchor.shape[0]
