"""DCCO: Distributed Cross Correlation Optimization (Vemulapalli et al. 2023, §3.3).

Round: clients send their encoding statistics S_k; the server returns the sample-weighted
aggregate S_A; each client takes one SGD step on L_CCO(S_k + stopgrad(S_A − S_k)), so the
loss sees the large-batch statistics while gradients flow only through its own samples
(``AnchoredMethod``; its ``round_loss`` is the exact batched form, paper appendix A).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from torch import Tensor

from dcco.config import LossConfig
from dcco.core.losses import cco_loss
from dcco.core.stats import CCO_STATS, Moments, StatsSpec
from dcco.methods.base import AnchoredMethod


@dataclass(frozen=True)
class DCCO(AnchoredMethod):
    loss: LossConfig = field(default_factory=LossConfig)

    name: ClassVar[str] = "dcco"
    federated: ClassVar[bool] = True
    stats: ClassVar[StatsSpec | None] = CCO_STATS
    min_client_samples: ClassVar[int] = 1
    default_projector: ClassVar[tuple[int, ...]] = (1024, 1024, 1024)
    loss_kind: ClassVar[str] = "CCO loss of the round's pooled batch"
    uses_eps: ClassVar[bool] = True

    def statistics_loss(self, m: Moments) -> Tensor:
        return cco_loss(m, self.loss.lambd, self.loss.eps)
