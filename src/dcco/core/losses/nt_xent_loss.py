"""NT-Xent, SimCLR's contrastive loss (Chen et al. 2020), of a batch or of each view within its
group (client)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dcco.config.loss_config import TEMPERATURE


def nt_xent_per_anchor(
    z1: Tensor, z2: Tensor, temperature: float = TEMPERATURE, groups: Tensor | None = None
) -> Tensor:
    """NT-Xent (SimCLR) loss of each of the 2N views, contrasted within its group.

    Each view's positive is the other view of its sample; its negatives are the other views of
    its group (all 2N − 2 when ``groups`` is None). A client's FedAvg loss is the mean over its
    views; ``groups`` lets one call serve all clients of a round.

    Args:
        z1, z2: projections of the two views, shape (N, d); they are L2-normalised here.
        temperature: τ.
        groups: optional int64 (N,) group (client) of each sample.

    Returns:
        (2N,) losses, first the N anchors of view 1 then those of view 2.
    """
    n = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    logits = (z @ z.T) / temperature
    mask = torch.eye(2 * n, dtype=torch.bool, device=z.device)
    if groups is not None:
        g2 = torch.cat([groups, groups])
        mask = mask | (g2[:, None] != g2[None, :])
    logits = logits.masked_fill(mask, float("-inf"))
    positives = torch.arange(n, 3 * n, device=z.device) % (2 * n)  # view 1 ↔ view 2
    return F.cross_entropy(logits, positives, reduction="none")


def nt_xent(z1: Tensor, z2: Tensor, temperature: float = TEMPERATURE) -> Tensor:
    """The NT-Xent loss of a batch: the mean over its 2N views (SimCLR, Chen et al. 2020).

    Two samples, each view equal to its pair and orthogonal to the other sample's: every
    view's loss is log(1 + 2 e^(−1/τ)):

    >>> import torch
    >>> round(float(nt_xent(torch.eye(2), torch.eye(2), temperature=0.5)), 4)
    0.2395
    """
    return nt_xent_per_anchor(z1, z2, temperature).mean()
