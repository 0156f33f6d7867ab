"""Where a round's gradients cancel: the sum of the loss's gradients over each client's own
encodings, Σ_{n∈k} ∂L/∂z_n (issue: do DCCO's clients cancel because its loss is centred?).

A loss of centred statistics (the CCO loss: means subtracted, variances divided out) is
unchanged when every encoding moves by the same vector, so its gradients over all N encodings
sum to zero exactly: Σ_n ∂L/∂f_n = 0, and the same for g. Per client the sum need not vanish,
but a client whose encodings sit together (one class) sees most of its gradient's common part
taken out. The spectral contrastive loss (uncentred second moments) has no such invariance.

``encoding_gradient_sums`` measures this for any statistics method on one round's encodings:
each client's ‖Σ_{n∈k} ∂L/∂z_n‖ over Σ_{n∈k} ‖∂L/∂z_n‖ (1: its samples' gradients point one
way; 0: they cancel), and the same ratio over the whole round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dcco.core.stats import encoding_stats
from dcco.methods.base import AnchoredMethod, Segments


@dataclass(frozen=True)
class GradientSums:
    """Per-client and whole-round coherence of a loss's gradients over the encodings.

    Attributes:
        client_sums: (K, 2d), Σ_{n∈k} [∂L/∂f_n, ∂L/∂g_n] for every client k.
        coherence: (K,), ‖Σ_{n∈k} ∂L/∂z_n‖ / Σ_{n∈k} ‖∂L/∂z_n‖, in [0, 1] (z = [f, g]).
        round_coherence: the same over all N samples of the round.
    """

    client_sums: Tensor
    coherence: Tensor
    round_coherence: float


def encoding_gradient_sums(method: AnchoredMethod, f: Tensor, g: Tensor,
                           segments: Segments) -> GradientSums:
    """The coherence of the round loss's encoding gradients, client by client, in float64.

    Args:
        method: a statistics method (``dcco``, ``fedsc``, ``dvicreg``); its loss of the pooled
            statistics of all N samples is the round's loss.
        f, g: the round's encodings, (N, d), grouped by client in the order of ``segments``.
        segments: the client of each sample.
    """
    f = f.detach().to(torch.float64).requires_grad_(True)
    g = g.detach().to(torch.float64).requires_grad_(True)
    loss = method.statistics_loss(encoding_stats(f, g, method.stats).moments())
    df, dg = torch.autograd.grad(loss, [f, g])
    rows = torch.cat([df, dg], dim=1)
    sizes = segments.counts.tolist()
    parts = rows.split(sizes)
    sums = torch.stack([p.sum(0) for p in parts])
    norms = torch.stack([p.norm(dim=1).sum() for p in parts])
    coherence = sums.norm(dim=1) / norms.clamp_min(torch.finfo(torch.float64).tiny)
    whole = float(rows.sum(0).norm() / rows.norm(dim=1).sum().clamp_min(1e-300))
    return GradientSums(sums, coherence, whole)
