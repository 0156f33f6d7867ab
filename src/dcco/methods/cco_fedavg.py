"""CCO + FedAvg: each client minimises the CCO loss of its own samples (paper §4 baseline).

Its server's parameter groups come in dcco's form and Barlow Twins' (``optim.vector_lr_scale
= 0.024``), and its loss has Barlow Twins' code's ε: ``dcco.methods.dcco``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from torch import Tensor

from dcco.config import LossConfig
from dcco.core.losses import cco_loss, cco_loss_per_segment
from dcco.core.stats import Moments, encoding_stats
from dcco.methods.base import MethodBase, Segments


@dataclass(frozen=True)
class CCOFedAvg(MethodBase):
    loss: LossConfig = field(default_factory=LossConfig)

    name: ClassVar[str] = "cco_fedavg"
    federated: ClassVar[bool] = True
    min_client_samples: ClassVar[int] = 2
    default_projector: ClassVar[tuple[int, ...]] = (1024, 1024, 1024)
    loss_kind: ClassVar[str] = "CCO loss within each client (weighted mean)"
    uses_eps: ClassVar[bool] = True

    def client_loss(self, f: Tensor, g: Tensor, shared: Moments | None) -> Tensor:
        return cco_loss(encoding_stats(f, g).moments(), self.loss.lambd, self.loss.eps)

    def round_loss(self, f: Tensor, g: Tensor, segments: Segments,
                   shared: Moments | None) -> Tensor:
        per_client = cco_loss_per_segment(
            f, g, segments.ids, segments.num_clients, self.loss.lambd, self.loss.eps
        )
        return (segments.weights(device=per_client.device) * per_client).sum()
