"""SimSiam's symmetrised negative cosine (Chen & He 2021)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def simsiam_loss_per_sample(q1: Tensor, q2: Tensor, y1: Tensor, y2: Tensor) -> Tensor:
    """SimSiam's symmetrised loss of each sample (Chen & He 2021, eq. 4):
    ½ D(q₁, y₂) + ½ D(q₂, y₁) with D(q, y) = −cos(q, y) and y = stopgrad(z).

    Returns:
        (N,) losses, each in [−1, 1].

    >>> import torch
    >>> q = torch.tensor([[1., 0.], [0., 2.]])
    >>> simsiam_loss_per_sample(q, q, q, q).tolist()  # predictions on their targets
    [-1.0, -1.0]
    """
    return -(F.cosine_similarity(q1, y2, dim=1) + F.cosine_similarity(q2, y1, dim=1)) / 2
