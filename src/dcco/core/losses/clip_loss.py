"""The CLIP loss (Radford et al. 2021): cross-modal InfoNCE between a batch's pairs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dcco.config.loss_config import TEMPERATURE


def clip_loss_per_anchor(f: Tensor, g: Tensor, temperature: float = TEMPERATURE,
                         groups: Tensor | None = None) -> Tensor:
    """The CLIP loss (Radford et al. 2021) of each of the 2N anchors: cross-modal negatives
    only, contrasted within its group.

    Each X encoding f_i is scored against the Y encodings of its group by cosine similarity /
    τ, with g_i as its positive (cross-entropy over the row), and each g_j against the Xs of
    its group likewise (over the column). Unlike NT-Xent, an encoding is never contrasted with
    encodings of its own modality.

    Args:
        f, g: encodings of the two modalities, shape (N, d); they are L2-normalised here.
        temperature: τ.
        groups: optional int64 (N,) group (client) of each pair.

    Returns:
        (2N,) losses, first the N X anchors, then the N Y anchors.
    """
    logits = F.normalize(f, dim=1) @ F.normalize(g, dim=1).T / temperature
    if groups is not None:
        logits = logits.masked_fill(groups[:, None] != groups[None, :], float("-inf"))
    targets = torch.arange(f.shape[0], device=f.device)
    return torch.cat([F.cross_entropy(logits, targets, reduction="none"),
                      F.cross_entropy(logits.T, targets, reduction="none")])


def clip_loss(f: Tensor, g: Tensor, temperature: float = TEMPERATURE) -> Tensor:
    """The symmetric CLIP loss of a batch: the mean over its 2N anchors.

    Pairs that match and are orthogonal across pairs: each anchor's loss is
    log(1 + e^(−1/τ)):

    >>> import torch
    >>> round(float(clip_loss(torch.eye(2), torch.eye(2), temperature=0.5)), 4)
    0.1269
    """
    return clip_loss_per_anchor(f, g, temperature).mean()
