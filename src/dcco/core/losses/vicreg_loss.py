"""VICReg (Bardes et al. 2022) from additive statistics."""

from __future__ import annotations

import torch
from torch import Tensor

from dcco.config.loss_config import VICREG_COEFFS
from dcco.core.stats import Moments

VICREG_EPS = 1e-4
"""Added to each variance before the square root in VICReg's variance term."""
VICREG_GAMMA = 1.0
"""γ, the target standard deviation of VICReg's variance hinge."""


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

    Equal views whose dimensions are uncorrelated with a standard deviation over γ cost
    nothing:

    >>> import torch
    >>> from dcco.core.stats import VICREG_STATS, encoding_stats
    >>> f = torch.tensor([[1., 1.], [1., -1.], [-1., 1.], [-1., -1.]], dtype=torch.float64)
    >>> float(vicreg_loss(encoding_stats(f, f, VICREG_STATS).moments()))
    0.0
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


def _off_diagonal_sq(c: Tensor) -> Tensor:
    """Σ_{i≠j} c_ij²."""
    return (c * c).sum() - (torch.diagonal(c) ** 2).sum()
