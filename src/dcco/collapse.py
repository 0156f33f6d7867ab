"""Collapse, read from the statistics a round already merges.

A CCO-family encoder can stop learning in two ways that its loss alone does not name:

- **dimensional collapse**: most encoding dimensions stop varying across samples. Once a
  dimension's variance falls below the loss's ε (``losses.BN_EPS``, added inside each
  variance as batch norm adds it), its correlations are divided by √ε instead of its spread,
  so its row of C shrinks towards 0: the dimension costs (1 − C_ii)² ≈ 1 and no redundancy, a
  cheap way out for the redundancy term, and its gradient (proportional to its own spread)
  fades with it. A loss near d (one per dimension) is this.
- **complete collapse**: every sample encodes to (nearly) one point, or to one line; C has
  rank about 1.

Three figures of S_A tell both apart from training, with no message beyond the round's own
statistics (they are functions of S_A, which every client already receives):

- ``dead_dims``: the fraction of the encodings' dimensions (F's and G's together) whose
  variance over the round's samples is below ``floor`` (the loss's ε by default);
- ``corr_diag``: the mean of C's diagonal, each dimension's correlation between the two views
  (1: the views agree; 0: they are unrelated, or the dimension is dead);
- ``eff_rank``: the effective rank of C, the participation ratio (Σσ²)²/Σσ⁴ of its singular
  values σ: from 1 (one direction) to d (all alike); 0 when C is 0.

For statistics with ⟨F Fᵀ⟩ instead of ⟨F Gᵀ⟩ (``stats.VICREG_STATS``, ``SPECTRAL_STATS``),
C's diagonal comes from ⟨F_i G_i⟩ and the rank is that of F's correlation matrix; without
means (the spectral loss's uncentred moments) the moments are taken about 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dcco.stats import STATS_DTYPE, Moments, encoding_stats

FIGURES = ("dead_dims", "corr_diag", "eff_rank")
"""The collapse figures, in the order records and progress lines show them."""
DEAD_FLOOR = 1e-6
"""A dimension is dead when its variance is at most this fraction of the largest: its
spread is under a thousandth of the liveliest dimension's."""


def effective_rank(matrix: Tensor) -> Tensor:
    """exp(−Σ_k p_k log p_k) with p = σ / Σσ the normalised singular values σ of ``matrix``
    (Roy & Vetterli 2007): from 1 (one direction) to min(shape) (all alike); 0 for a zero
    matrix. The singular values come from the eigenvalues of MᵀM (a symmetric
    decomposition, about twice as fast as an SVD). A 0-d float64 tensor on its device."""
    m = matrix.to(STATS_DTYPE)
    sigma = torch.linalg.eigvalsh(m.T @ m).clamp_min(0).sqrt()
    total = sigma.sum()
    p = sigma / total.clamp_min(torch.finfo(STATS_DTYPE).tiny)
    entropy = -torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros_like(p)).sum()
    return torch.where(total > 0, entropy.exp(), torch.zeros_like(total))


def collapse_figures(m: Moments, floor: float = DEAD_FLOOR) -> dict[str, Tensor]:
    """``dead_dims``, ``corr_diag`` and ``eff_rank`` (module docstring) of batch averages.

    Args:
        m: the averages of a statistics method (``stats.CCO_STATS``, ``VICREG_STATS`` or
            ``SPECTRAL_STATS``), e.g. S_A.
        floor: a dimension whose variance is at most ``floor`` times the largest variance of
            the encodings counts as dead.

    Returns:
        0-d float64 tensors on the averages' device (not read back: reading waits for it).
    """
    mean_f = m.mean_f if "mean_f" in m else None
    mean_g = m.mean_g if "mean_g" in m else None
    if "mean_fg" in m:
        ff, gg, fg_diag = m.mean_ff, m.mean_gg, torch.diagonal(m.mean_fg)
    else:
        ff, gg, fg_diag = (torch.diagonal(m.mean_fft), torch.diagonal(m.mean_ggt),
                           m.mean_fg_diag)
    var_f = ff - (mean_f * mean_f if mean_f is not None else 0)
    var_g = gg - (mean_g * mean_g if mean_g is not None else 0)
    cov_diag = fg_diag - (mean_f * mean_g if mean_f is not None else 0)
    threshold = floor * torch.maximum(var_f.max(), var_g.max())
    alive_f, alive_g = var_f > threshold, var_g > threshold
    inv_f = torch.where(alive_f, var_f.clamp_min(1e-300).rsqrt(), torch.zeros_like(var_f))
    inv_g = torch.where(alive_g, var_g.clamp_min(1e-300).rsqrt(), torch.zeros_like(var_g))
    dead = 1 - torch.cat([alive_f, alive_g]).to(STATS_DTYPE).mean()
    corr_diag = (cov_diag * inv_f * inv_g).mean()
    if "mean_fg" in m:
        cov = m.mean_fg - (torch.outer(mean_f, mean_g) if mean_f is not None else 0)
        c = cov * torch.outer(inv_f, inv_g)
    else:
        cov = m.mean_fft - (torch.outer(mean_f, mean_f) if mean_f is not None else 0)
        c = cov * torch.outer(inv_f, inv_f)
    return {"dead_dims": dead, "corr_diag": corr_diag, "eff_rank": effective_rank(c)}


def encoding_figures(f: Tensor, g: Tensor, floor: float = DEAD_FLOOR) -> dict[str, Tensor]:
    """The same figures of two views' encodings F, G (N, d): what a method that shares no
    statistics is read by (its CCO averages are computed here, in float64)."""
    return collapse_figures(encoding_stats(f.detach(), g.detach()).moments(), floor)


DEAD_LIMIT = 0.5
"""Dimensional collapse: at least this fraction of the dimensions below the floor."""
RANK_LIMIT = 1.5
"""Complete collapse: C's effective rank below this (about one direction left)."""
CORR_LIMIT = 0.1
"""The plateau: the views' mean correlation C_ii below this, at two readings in a row."""


def watch_start(warmup_rounds: int) -> int:
    """The first round a ``CollapseWatch`` judges: after twice the server's warm-up, and
    never before round 20 (an encoder early in training may read low)."""
    return max(20, 2 * warmup_rounds)


class CollapseWarning(UserWarning):
    """A run's encodings have collapsed (``CollapseWatch``)."""


class CollapseWatch:
    """Judges a run's collapse figures, reading after reading, and says so once.

    Nothing is judged before round ``after`` (the warm-up: an encoder at initialisation, or
    early in training, may read low). Then the first reading that shows one of these gives
    a one-line message naming it, its likely cause and what to try; later readings give
    none:

    - dimensional collapse, ``dead_dims`` ≥ ``DEAD_LIMIT``;
    - complete collapse, ``eff_rank`` < ``RANK_LIMIT`` (for d ≥ 4);
    - the plateau, ``corr_diag`` < ``CORR_LIMIT`` at two readings in a row: the two views'
      encodings unrelated, a CCO loss near d.

    Args:
        after: the first round judged (``watch_start``).
        floor: the variance floor ``dead_dims`` was read with (for the message).
    """

    def __init__(self, after: int, floor: float = DEAD_FLOOR) -> None:
        self.after, self.floor = after, floor
        self.message: str | None = None
        self._low_corr = 0

    def check(self, round_done: int, figures: dict[str, float], d: int) -> str | None:
        """The warning for this reading of encodings of width ``d``, once; None
        otherwise."""
        if self.message is not None or round_done < self.after or not figures:
            return None
        dead, corr, rank = (figures[k] for k in FIGURES)
        self._low_corr = self._low_corr + 1 if corr < CORR_LIMIT else 0
        if dead >= DEAD_LIMIT:
            what = (f"{dead:.0%} of the encodings' dimensions vary less than "
                    f"{self.floor:g} (the loss's ε) over a round's samples")
            cause = ("their scale fell under the loss's ε: dead units, or a server step too "
                     "large for the model")
        elif d >= 4 and rank < RANK_LIMIT:
            what = f"the encodings span about one direction (C's effective rank {rank:.2f})"
            cause = "every sample encodes alike: a server step too large for the model"
        elif self._low_corr >= 2:
            what = (f"the two views' encodings are unrelated (mean C_ii {corr:.2f}; the loss "
                    f"sits near d = {d})")
            cause = ("the server's steps are too large for this network (Adam moves every "
                     "weight by about its rate, however small the weight)")
        else:
            return None
        self.message = (f"collapse at round {round_done}: {what}. Likely cause: {cause}. Try "
                        f"a lower optim.lr (Adam 1e-3, or LARS: optim.name = \"lars\", "
                        f"optim.lr = 1.5), optim.warmup_steps, and normalisation layers in "
                        f"the model (docs/own_code.md, \"Collapse\")")
        return self.message


__all__ = ["FIGURES", "CollapseWarning", "CollapseWatch", "collapse_figures", "effective_rank",
           "encoding_figures", "watch_start"]
