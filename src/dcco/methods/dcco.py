"""DCCO: Distributed Cross Correlation Optimization (Vemulapalli et al. 2023, §3.3).

Round: clients send their encoding statistics S_k; the server returns the sample-weighted
aggregate S_A; each client takes one SGD step on L_CCO(S_k + stopgrad(S_A − S_k)), so the
loss sees the large-batch statistics while gradients flow only through its own samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from torch import Tensor

from dcco.losses import cco_loss
from dcco.methods.base import LossConfig, Segments
from dcco.stats import Moments, anchored, encoding_stats


@dataclass(frozen=True)
class DCCO:
    loss: LossConfig = field(default_factory=LossConfig)

    name: ClassVar[str] = "dcco"
    federated: ClassVar[bool] = True
    needs_statistics: ClassVar[bool] = True
    min_client_samples: ClassVar[int] = 1
    default_projector: ClassVar[tuple[int, ...]] = (1024, 1024, 1024)
    loss_kind: ClassVar[str] = "CCO loss of the round's pooled batch"

    def client_loss(self, f: Tensor, g: Tensor, shared: Moments | None) -> Tensor:
        if shared is None:
            raise ValueError("dcco needs the aggregated statistics S_A of the round")
        local = encoding_stats(f, g).moments()
        return cco_loss(anchored(local, shared), self.loss.lambd, self.loss.eps)

    def round_loss(self, f: Tensor, g: Tensor, segments: Segments,
                   shared: Moments | None) -> Tensor:
        """Σ_k w_k L(S_k + sg(S_A − S_k)) for all clients at once, exactly in value and gradient.

        Every client's combined statistics equal S_A, so its gradient with respect to its own
        moments is the same ∇L(S_A), and Σ_k w_k ⟨∇L(S_A), ∂S_k⟩ = ⟨∇L(S_A), ∂(Σ_k w_k S_k)⟩.
        With w_k = N_k/N, Σ_k w_k S_k is the pooled moments of the concatenated batch, so one
        anchored loss on the pooled moments has the round's aggregate gradient — the paper's
        appendix A argument, used here as an implementation. (``segments`` only fixes the
        weights, which the pooled average already carries.)
        """
        if shared is None:
            raise ValueError("dcco needs the aggregated statistics S_A of the round")
        pooled = encoding_stats(f, g).moments()
        return cco_loss(anchored(pooled, shared), self.loss.lambd, self.loss.eps)
