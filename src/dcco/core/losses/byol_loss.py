"""BYOL's symmetrised regression loss (Grill et al. 2020), and how a predictive dual encoder's
encoding splits into its prediction and target."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def byol_loss_per_sample(q1: Tensor, q2: Tensor, y1: Tensor, y2: Tensor) -> Tensor:
    """BYOL's symmetrised regression loss of each sample (Grill et al. 2020, eq. 2 and its
    symmetrisation): ‖q̄₁ − ȳ₂‖² + ‖q̄₂ − ȳ₁‖² = (2 − 2 cos(q₁, y₂)) + (2 − 2 cos(q₂, y₁)),
    with x̄ = x/‖x‖. The targets y carry no gradient (the caller stops it).

    Args:
        q1, q2: the online predictions of both views, (N, d).
        y1, y2: the targets of both views, (N, d).

    Returns:
        (N,) losses, each in [0, 8].

    >>> import torch
    >>> q = torch.tensor([[1., 0.], [0., 2.]])
    >>> byol_loss_per_sample(q, q, q, q).tolist(), byol_loss_per_sample(q, q, -q, -q).tolist()
    ([0.0, 0.0], [8.0, 8.0])
    """
    return (4 - 2 * F.cosine_similarity(q1, y2, dim=1)
            - 2 * F.cosine_similarity(q2, y1, dim=1))


def split_prediction(e: Tensor) -> tuple[Tensor, Tensor]:
    """A predictive dual encoder's encoding [q, y] (N, 2d) → the prediction q and target y
    (``dcco.models.DualEncoder``).

    >>> import torch
    >>> [t.tolist() for t in split_prediction(torch.arange(4.).reshape(1, 4))]
    [[[0.0, 1.0]], [[2.0, 3.0]]]
    """
    d = e.shape[1] // 2
    return e[:, :d], e[:, d:]
