"""DCCO: Distributed Cross Correlation Optimization (Vemulapalli et al. 2023, §3.3).

Round: clients send their encoding statistics S_k; the server returns the sample-weighted
aggregate S_A; each client takes one SGD step on L_CCO(S_k + stopgrad(S_A − S_k)), so the
loss sees the large-batch statistics while gradients flow only through its own samples
(``AnchoredMethod``; its ``round_loss`` is the exact batched form, paper appendix A).

The CCO family (DCCO, CCO + FedAvg, centralized CCO; DVICReg's server alike) comes in two
forms of its server optimiser's parameter groups, and one loss with an ε:

- **dcco's form** (the default, ``optim.vector_lr_scale = 1``): the 1-D parameters (biases,
  group-norm gains and shifts) step at the weights' rate, without LARS's adaptation and
  without weight decay.
- **Barlow Twins' form** (Zbontar et al. 2021, the authors' LARS: rate 0.2 for the weights,
  0.0048 for biases and normalisation parameters, a ratio of 0.024, those without adaptation
  or weight decay): ``optim.vector_lr_scale = 0.024``. The DCCO paper names Barlow Twins'
  loss, not its parameter groups, and its CIFAR runs use Adam (appendix B), whose 1-D group
  the same setting scales.
- **The loss's ε** (``loss.eps``, 1e-5) is not in the paper's eq. 1, which divides by the
  bare standard deviations; it is where Barlow Twins' code has it, in the batch norm
  (``affine=False``, ε = 1e-5) that standardises each encoding before C. At the paper's
  network the encodings vary on a scale where it is negligible; at the CPU scale under LARS
  they sit at it (docs/results/healthy-dcco.md), and ``loss.eps = 1e-12`` is eq. 1 as
  written.
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
