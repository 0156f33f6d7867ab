"""The CCO loss (paper eq. 1, Barlow Twins with λ/(d−1) scaling) from batch averages, and
its per-client form over a round's concatenated encodings.

Pure functions of tensors; nothing here communicates (aggregation belongs to the round).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dcco.config.loss_config import BN_EPS, LAMBDA
from dcco.core.stats import STATS_DTYPE, Moments


def cross_correlation(m: Moments, eps: float = BN_EPS) -> Tensor:
    """C_ij of paper eq. 1 from batch averages, with eps placed as BatchNorm places it.

    C_ij = (⟨F_i G_j⟩ − ⟨F_i⟩⟨G_j⟩) / (√(⟨F_i²⟩ − ⟨F_i⟩² + eps) · √(⟨G_j²⟩ − ⟨G_j⟩² + eps)),
    which equals (1/N) Σ_n ẑ1_ni ẑ2_nj for BatchNorm-normalised (biased variance) encodings.

    Returns:
        C, shape (d_f, d_g).
    """
    var_f = m.mean_ff - m.mean_f * m.mean_f
    var_g = m.mean_gg - m.mean_g * m.mean_g
    cov = m.mean_fg - torch.outer(m.mean_f, m.mean_g)
    return cov / torch.outer(torch.sqrt(var_f + eps), torch.sqrt(var_g + eps))


def cco_from_correlation(c: Tensor, lambd: float = LAMBDA) -> Tensor:
    """Paper eq. 1: Σ_i (1 − C_ii)² + λ Σ_i 1/(d−1) Σ_{j≠i} C_ij²."""
    d = c.shape[0]
    on_diag = torch.diagonal(c)
    off_diag_sq = (c * c).sum() - (on_diag * on_diag).sum()
    return ((1 - on_diag) ** 2).sum() + lambd / (d - 1) * off_diag_sq


def cco_loss(m: Moments, lambd: float = LAMBDA, eps: float = BN_EPS) -> Tensor:
    """The CCO loss of paper eq. 1 from batch averages (float64 scalar).

    Two dimensions of unit variance, uncorrelated: the same encodings on both sides give C = I
    and a loss of 0; swapped, C is off-diagonal and costs 2 + λ · 2 (λ = 20):

    >>> import torch
    >>> from dcco.core.stats import encoding_stats
    >>> f = torch.tensor([[1., 1.], [1., -1.], [-1., 1.], [-1., -1.]], dtype=torch.float64)
    >>> round(float(cco_loss(encoding_stats(f, f).moments())), 6)
    0.0
    >>> round(float(cco_loss(encoding_stats(f, f.flip(1)).moments())), 3)  # ε = 1e-5 inside
    41.999
    """
    return cco_from_correlation(cross_correlation(m, eps), lambd)


def cco_loss_per_segment(
    f: Tensor,
    g: Tensor,
    segment_ids: Tensor,
    num_segments: int,
    lambd: float = LAMBDA,
    eps: float = BN_EPS,
) -> Tensor:
    """The CCO loss of each segment (client) computed on its own samples only.

    Equal to ``cco_loss`` of each segment's moments, but never forms a d×d matrix per segment:
    with ẑ the segment-normalised encodings, Σ_ij C_ij² = (1/N_k²) Σ_{n,m∈k} (ẑ1_n·ẑ1_m)(ẑ2_n·ẑ2_m),
    so two block-masked N×N Gram matrices serve all segments at once.

    Args:
        f, g: encodings, shape (N, d), with d ≥ 2.
        segment_ids: int64 (N,), the segment of each sample, in [0, num_segments).
        num_segments: K.

    Returns:
        float64 (K,), the loss of each segment.
    """
    f64, g64 = f.to(STATS_DTYPE), g.to(STATS_DTYPE)
    d = f64.shape[1]
    count = torch.zeros(num_segments, dtype=STATS_DTYPE, device=f.device)
    count = count.index_add(0, segment_ids, torch.ones_like(segment_ids, dtype=STATS_DTYPE))
    z1 = _segment_normalise(f64, segment_ids, count, eps)
    z2 = _segment_normalise(g64, segment_ids, count, eps)
    diag = _segment_sum(z1 * z2, segment_ids, num_segments) / count[:, None]  # (K, d): C_ii
    same = segment_ids[:, None] == segment_ids[None, :]
    gram = torch.where(same, (z1 @ z1.T) * (z2 @ z2.T), torch.zeros((), dtype=STATS_DTYPE))
    frob = _segment_sum(gram.sum(1), segment_ids, num_segments) / count**2  # Σ_ij C_ij²
    off_diag_sq = frob - (diag * diag).sum(1)
    return ((1 - diag) ** 2).sum(1) + lambd / (d - 1) * off_diag_sq


def _segment_sum(x: Tensor, segment_ids: Tensor, num_segments: int) -> Tensor:
    out = torch.zeros((num_segments, *x.shape[1:]), dtype=x.dtype, device=x.device)
    return out.index_add(0, segment_ids, x)


def _segment_normalise(x: Tensor, segment_ids: Tensor, count: Tensor, eps: float) -> Tensor:
    """(x − segment mean) / √(segment biased variance + eps), per feature."""
    k = count.shape[0]
    centred = x - (_segment_sum(x, segment_ids, k) / count[:, None])[segment_ids]
    var = _segment_sum(centred * centred, segment_ids, k) / count[:, None]
    return centred / torch.sqrt(var + eps)[segment_ids]
