"""DVICReg: VICReg (Bardes et al. 2022) from shared statistics, in the DCCO manner.

The paper's conclusion names other statistics-based losses as DCCO's next step. VICReg's three
terms follow from additive statistics (``stats.VICREG_STATS``: Σ F, Σ G, Σ F Fᵀ, Σ G Gᵀ,
Σ F_i G_i, and the count), so a round is DCCO's: clients send their statistics, the server
returns the aggregate S_A, and each client steps on VICReg(S_k + stopgrad(S_A − S_k)), with the
aggregate's count as the batch size of the unbiased covariance (``AnchoredMethod``). One round
equals one centralized VICReg step on the pooled batch (``tests/test_algorithm.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from torch import Tensor

from dcco.config import LossConfig
from dcco.core.losses import vicreg_loss
from dcco.core.stats import VICREG_STATS, Moments, StatsSpec
from dcco.methods.base import AnchoredMethod


@dataclass(frozen=True)
class DVICReg(AnchoredMethod):
    loss: LossConfig = field(default_factory=LossConfig)

    name: ClassVar[str] = "dvicreg"
    federated: ClassVar[bool] = True
    stats: ClassVar[StatsSpec | None] = VICREG_STATS
    min_client_samples: ClassVar[int] = 1
    default_projector: ClassVar[tuple[int, ...]] = (1024, 1024, 1024)
    loss_kind: ClassVar[str] = "VICReg loss of the round's pooled batch"

    def statistics_loss(self, m: Moments) -> Tensor:
        return vicreg_loss(m, self.loss.vicreg)
