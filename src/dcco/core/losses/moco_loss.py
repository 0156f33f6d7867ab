"""MoCo's InfoNCE (He et al. 2020; v2, Chen et al. 2020), symmetrised, with a queue."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dcco.config.loss_config import MOCO_TEMPERATURE


def moco_loss_per_sample(q1: Tensor, q2: Tensor, k1: Tensor, k2: Tensor,
                         queue: Tensor | None = None,
                         temperature: float = MOCO_TEMPERATURE) -> Tensor:
    """MoCo's InfoNCE (He et al. 2020, eq. 1; v2's τ = 0.2, Chen et al. 2020), symmetrised,
    of each sample: ½ (ℓ(q₁, k₂) + ℓ(q₂, k₁)), with

        ℓ(q, k)_n = −log exp(q̄_n·k̄_n/τ) / (Σ_m exp(q̄_n·k̄_m/τ) + Σ_j exp(q̄_n·u_j/τ)),

    x̄ = x/‖x‖: a query's positive is the key of its sample's other view; its negatives are
    the keys of the batch's other samples (that view) and the queue's keys u_j.

    Args:
        q1, q2: the queries of both views, (N, d), with gradients.
        k1, k2: the keys of both views, (N, d), from the key encoder (no gradient).
        queue: (Q, d) unit keys of earlier batches, or None.
        temperature: τ.

    Returns:
        (N,) losses.

    Keys equal to their queries and orthogonal across samples; a queue adds negatives:

    >>> import torch
    >>> e = torch.eye(2)
    >>> [round(v, 4) for v in moco_loss_per_sample(e, e, e, e, temperature=0.5).tolist()]
    [0.1269, 0.1269]
    >>> bool(moco_loss_per_sample(e, e, e, e, queue=e, temperature=0.5)[0] > 0.1269)
    True
    """
    def one_way(q: Tensor, k: Tensor) -> Tensor:
        q, k = F.normalize(q, dim=1), F.normalize(k.detach(), dim=1)
        logits = q @ k.T
        if queue is not None and queue.shape[0]:
            logits = torch.cat([logits, q @ queue.detach().T.to(q.dtype)], dim=1)
        labels = torch.arange(q.shape[0], device=q.device)
        return F.cross_entropy(logits / temperature, labels, reduction="none")

    return (one_way(q1, k2) + one_way(q2, k1)) / 2
