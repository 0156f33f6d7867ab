"""Dual-encoder losses: CCO (Barlow Twins, paper eq. 1) from statistics, and NT-Xent.

Pure functions of tensors. Nothing here communicates: aggregation belongs to the round.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dcco.config.loss_config import BN_EPS, LAMBDA, MOCO_TEMPERATURE, TEMPERATURE, VICREG_COEFFS
from dcco.core.stats import STATS_DTYPE, Moments

VICREG_EPS = 1e-4
"""Added to each variance before the square root in VICReg's variance term."""
VICREG_GAMMA = 1.0
"""γ, the target standard deviation of VICReg's variance hinge."""


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
    """The CCO loss of paper eq. 1 from batch averages (float64 scalar)."""
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
    """The symmetric CLIP loss of a batch: the mean over its 2N anchors."""
    return clip_loss_per_anchor(f, g, temperature).mean()


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
    """
    def one_way(q: Tensor, k: Tensor) -> Tensor:
        q, k = F.normalize(q, dim=1), F.normalize(k.detach(), dim=1)
        logits = q @ k.T
        if queue is not None and queue.shape[0]:
            logits = torch.cat([logits, q @ queue.detach().T.to(q.dtype)], dim=1)
        labels = torch.arange(q.shape[0], device=q.device)
        return F.cross_entropy(logits / temperature, labels, reduction="none")

    return (one_way(q1, k2) + one_way(q2, k1)) / 2


def nt_xent(z1: Tensor, z2: Tensor, temperature: float = TEMPERATURE) -> Tensor:
    """The NT-Xent loss of a batch: the mean over its 2N views (SimCLR, Chen et al. 2020)."""
    return nt_xent_per_anchor(z1, z2, temperature).mean()


def vicreg_loss(m: Moments, coeffs: tuple[float, float, float] = VICREG_COEFFS,
                eps: float = VICREG_EPS, gamma: float = VICREG_GAMMA) -> Tensor:
    """VICReg (Bardes et al. 2022, eqs. 1–6) from batch averages and the batch size.

    With N = ``m.count`` samples and encodings of width d, every term follows from additive
    statistics (``stats.VICREG_STATS``):

    - invariance s = (1/(N d)) Σ_n ‖F_n − G_n‖² = (1/d) Σ_i (⟨F_i²⟩ + ⟨G_i²⟩ − 2⟨F_i G_i⟩),
      with ⟨F_i²⟩ the diagonal of ⟨F Fᵀ⟩;
    - the unbiased covariance Cov(F) = N/(N−1) (⟨F Fᵀ⟩ − ⟨F⟩⟨F⟩ᵀ), and likewise for G;
    - variance v = (1/d) Σ_j max(0, γ − √(Cov(F)_jj + eps)), averaged over F and G: the hinge
      on the standard deviation is exact, because the pooled variance is;
    - covariance c = (1/d) Σ_{i≠j} Cov(F)_ij² + (1/d) Σ_{i≠j} Cov(G)_ij².

    Loss = λ s + μ v + ν c with (λ, μ, ν) = ``coeffs``, as the reference implementation
    computes it on a batch (``F.mse_loss``, ``x.var(dim=0)``, ``off_diagonal(cov)``).

    Args:
        m: ``mean_f``, ``mean_g`` (d,), ``mean_fft``, ``mean_ggt`` (d, d), ``mean_fg_diag``
            (d,), and ``count`` N ≥ 2.
    """
    n = m.count
    d = m.mean_f.shape[0]
    cov_f = (m.mean_fft - torch.outer(m.mean_f, m.mean_f)) * (n / (n - 1))
    cov_g = (m.mean_ggt - torch.outer(m.mean_g, m.mean_g)) * (n / (n - 1))
    invariance = (torch.diagonal(m.mean_fft) + torch.diagonal(m.mean_ggt)
                  - 2 * m.mean_fg_diag).sum() / d
    variance = (torch.relu(gamma - torch.sqrt(torch.diagonal(cov_f) + eps)).mean()
                + torch.relu(gamma - torch.sqrt(torch.diagonal(cov_g) + eps)).mean()) / 2
    covariance = (_off_diagonal_sq(cov_f) + _off_diagonal_sq(cov_g)) / d
    lambd, mu, nu = coeffs
    return lambd * invariance + mu * variance + nu * covariance


def spectral_loss(m: Moments, form: str = "pooled") -> Tensor:
    """The spectral contrastive loss (HaoChen et al. 2021, eq. 5) from batch averages.

    With A = ⟨F Fᵀ⟩, B = ⟨G Gᵀ⟩ (uncentred second moments of the two views' encodings over the
    N samples) and ⟨F·G⟩ = Σ_j ⟨F_j G_j⟩:

    - ``form = "cross"``: −2⟨F·G⟩ + tr(A B) = −(2/N) Σ_i F_iᵀG_i + (1/N²) Σ_{i,j} (F_iᵀG_j)²,
      HaoChen's loss with the negative pairs over all N² pairs of the batch (their estimate
      averages the N(N−1) pairs i ≠ j: ``spectral_pairs``);
    - ``form = "pooled"``: −2⟨F·G⟩ + ‖R‖²_F with R = (A + B)/2, the second moment of both
      views pooled, as FedSC's code computes it (Jing et al. 2024): the negative pairs are
      drawn from both views alike.

    Every term is a function of additive statistics (``stats.SPECTRAL_STATS``), so a round of
    fresh statistics is one centralized step; unlike the CCO loss it is not scale-free, and a
    client that inflates its own encodings pays for it in the quartic term.

    Args:
        m: ``mean_fft``, ``mean_ggt`` (d, d) and ``mean_fg_diag`` (d,).
        form: "pooled" or "cross".
    """
    positive = -2 * m.mean_fg_diag.sum()
    if form == "cross":
        return positive + (m.mean_fft * m.mean_ggt.T).sum()
    if form == "pooled":
        r = (m.mean_fft + m.mean_ggt) / 2
        return positive + (r * r).sum()
    raise ValueError(f"loss.spectral_form must be 'pooled' or 'cross', got {form!r}")


def _off_diagonal_sq(c: Tensor) -> Tensor:
    """Σ_{i≠j} c_ij²."""
    return (c * c).sum() - (torch.diagonal(c) ** 2).sum()


def byol_loss_per_sample(q1: Tensor, q2: Tensor, y1: Tensor, y2: Tensor) -> Tensor:
    """BYOL's symmetrised regression loss of each sample (Grill et al. 2020, eq. 2 and its
    symmetrisation): ‖q̄₁ − ȳ₂‖² + ‖q̄₂ − ȳ₁‖² = (2 − 2 cos(q₁, y₂)) + (2 − 2 cos(q₂, y₁)),
    with x̄ = x/‖x‖. The targets y carry no gradient (the caller stops it).

    Args:
        q1, q2: the online predictions of both views, (N, d).
        y1, y2: the targets of both views, (N, d).

    Returns:
        (N,) losses, each in [0, 8].
    """
    return (4 - 2 * F.cosine_similarity(q1, y2, dim=1)
            - 2 * F.cosine_similarity(q2, y1, dim=1))


def simsiam_loss_per_sample(q1: Tensor, q2: Tensor, y1: Tensor, y2: Tensor) -> Tensor:
    """SimSiam's symmetrised loss of each sample (Chen & He 2021, eq. 4):
    ½ D(q₁, y₂) + ½ D(q₂, y₁) with D(q, y) = −cos(q, y) and y = stopgrad(z).

    Returns:
        (N,) losses, each in [−1, 1].
    """
    return -(F.cosine_similarity(q1, y2, dim=1) + F.cosine_similarity(q2, y1, dim=1)) / 2


def split_prediction(e: Tensor) -> tuple[Tensor, Tensor]:
    """A predictive dual encoder's encoding [q, y] (N, 2d) → the prediction q and target y
    (``dcco.models.DualEncoder``)."""
    d = e.shape[1] // 2
    return e[:, :d], e[:, d:]
