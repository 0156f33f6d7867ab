"""The spectral contrastive loss (HaoChen et al. 2021) from additive statistics, in its cross
and FedSC's pooled forms."""

from __future__ import annotations

from torch import Tensor

from dcco.core.stats import Moments


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

    With ⟨F Fᵀ⟩ = ⟨G Gᵀ⟩ = I and F = G (two dimensions): −2 · 2 + 2 in either form:

    >>> import torch
    >>> from dcco.core.stats import SPECTRAL_STATS, encoding_stats
    >>> f = torch.tensor([[1., 1.], [1., -1.], [-1., 1.], [-1., -1.]], dtype=torch.float64)
    >>> m = encoding_stats(f, f, SPECTRAL_STATS).moments()
    >>> float(spectral_loss(m)), float(spectral_loss(m, "cross"))
    (-2.0, -2.0)
    """
    positive = -2 * m.mean_fg_diag.sum()
    if form == "cross":
        return positive + (m.mean_fft * m.mean_ggt.T).sum()
    if form == "pooled":
        r = (m.mean_fft + m.mean_ggt) / 2
        return positive + (r * r).sum()
    raise ValueError(f"loss.spectral_form must be 'pooled' or 'cross', got {form!r}")
