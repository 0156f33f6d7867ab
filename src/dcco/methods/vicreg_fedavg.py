"""VICReg + FedAvg: each client minimises VICReg on its own samples (the FedAvg baseline of
DVICReg, as CCO + FedAvg is DCCO's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from torch import Tensor

from dcco.config import LossConfig
from dcco.core.losses import vicreg_loss
from dcco.core.stats import VICREG_STATS, Moments, encoding_stats
from dcco.methods.base import MethodBase


@dataclass(frozen=True)
class VICRegFedAvg(MethodBase):
    loss: LossConfig = field(default_factory=LossConfig)

    name: ClassVar[str] = "vicreg_fedavg"
    federated: ClassVar[bool] = True
    min_client_samples: ClassVar[int] = 2
    """The unbiased variance needs two samples."""
    default_projector: ClassVar[tuple[int, ...]] = (1024, 1024, 1024)
    loss_kind: ClassVar[str] = "VICReg loss within each client (weighted mean)"

    def client_loss(self, f: Tensor, g: Tensor, shared: Moments | None) -> Tensor:
        return vicreg_loss(encoding_stats(f, g, VICREG_STATS).moments(), self.loss.vicreg)
