"""FedSC (Jing et al., ICML 2024): the spectral contrastive loss from shared statistics, and
its FedAvg baseline.

The spectral contrastive loss (HaoChen et al. 2021) is a function of uncentred second moments
(``dcco.core.losses.spectral_loss``: ⟨F·G⟩ and ⟨F Fᵀ⟩, ⟨G Gᵀ⟩), which are additive over clients
(``stats.SPECTRAL_STATS``). So ``fedsc``'s round is DCCO's: clients send their sums, the
server returns the aggregate S_A, each client steps on L(S_k + stopgrad(S_A − S_k))
(``AnchoredMethod``), and one round of fresh statistics is one centralized step on the
pooled batch. With several local steps and ``train.local_statistics = "own"``, each step
takes the loss at S_A + (N_k/N)(S_k − S_k⁰): the client's own statistics live with the exact
weight α = N_k/N, the other clients' frozen, which is FedSC's local objective with that α. The
CCO loss is scale-free there and has no bounded local minimiser; this one's quartic term
bounds it (docs/results/future-work.md measures what that buys).

``spectral_fedavg`` is FedAvg on the spectral loss of each client's own samples (FedSC's code
with ``share_cov: False``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from torch import Tensor

from dcco.config import LossConfig
from dcco.core.losses import spectral_loss
from dcco.core.stats import SPECTRAL_STATS, Moments, StatsSpec, encoding_stats
from dcco.methods.base import AnchoredMethod, MethodBase


@dataclass(frozen=True)
class FedSC(AnchoredMethod):
    loss: LossConfig = field(default_factory=LossConfig)

    name: ClassVar[str] = "fedsc"
    federated: ClassVar[bool] = True
    stats: ClassVar[StatsSpec | None] = SPECTRAL_STATS
    min_client_samples: ClassVar[int] = 1
    default_projector: ClassVar[tuple[int, ...]] = (1024, 512)  # FedSC's 512-1024-512 head
    loss_kind: ClassVar[str] = "spectral contrastive loss of the round's pooled batch"
    similarity: ClassVar[str] = "cosine"

    def statistics_loss(self, m: Moments) -> Tensor:
        return spectral_loss(m, self.loss.spectral_form)


@dataclass(frozen=True)
class SpectralFedAvg(MethodBase):
    loss: LossConfig = field(default_factory=LossConfig)

    name: ClassVar[str] = "spectral_fedavg"
    federated: ClassVar[bool] = True
    min_client_samples: ClassVar[int] = 2
    default_projector: ClassVar[tuple[int, ...]] = (1024, 512)
    loss_kind: ClassVar[str] = "spectral contrastive loss within each client (weighted mean)"
    similarity: ClassVar[str] = "cosine"

    def client_loss(self, f: Tensor, g: Tensor, shared: Moments | None) -> Tensor:
        return spectral_loss(encoding_stats(f, g, SPECTRAL_STATS).moments(),
                             self.loss.spectral_form)
