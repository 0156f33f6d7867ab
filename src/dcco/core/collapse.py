"""Collapse, read from the statistics a round already merges.

A CCO-family encoder can stop learning while its loss still moves a little. Three ways are
common (docs/results/collapse.md, measures them):

- **dead dimensions**: encoding dimensions stop varying across samples (a model without
  normalisation whose outputs went constant);
- **one direction**: every sample encodes to (nearly) one line, all dimensions the same
  feature: C has rank about 1 (a plain CNN under LARS 1.5);
- **unrelated views**: the two views' encodings share little, C_ii near 0 and a loss near d,
  one per dimension (the paper's network under Adam 5e-3, for its first ~1,500 rounds).

A fourth is a scale the loss cannot see: **encodings smaller than the loss's ε**. The CCO
loss divides each covariance by √(Var + ε) (``loss.eps``, 1e-5); a dimension whose variance
is far under ε reads to the loss as a constant, its C entries near 0 whatever the encoder
does, and its gradient nearly vanishes (an encoder whose output is scaled by 1e-4 keeps the
loss at d for as long as it runs). A variance v shows the loss √(v / (v + ε)) of the
dimension's spread; a dimension counts as dead by ε when that is under one half, v < ε / 3
(``EPS_DEAD``). A variance near ε is not: DCCO's recipe at the CPU scale trains its
encodings to 0.3–2 × ε, where the loss reads 0.5–0.8 of their spread, and it probes best of
every method there (``experiments/eps_regime.py``; docs/results/collapse.md).

Four figures of S_A tell them apart from training, with no message beyond the round's own
(they are functions of S_A, which every client already receives). Each dimension is
standardised by its own spread, so C's figures do not move when the encodings' scale does;
only the count of dead dimensions knows the loss's ε:

- ``dead_dims``: the fraction of the encodings' dimensions (F's and G's together) whose
  variance over the round's samples is at most ``DEAD_FLOOR`` times the largest, or at most
  ``EPS_DEAD`` times the loss's ε (``eps``; 0 for a loss without one);
- ``corr_diag``: the mean of C's diagonal, each dimension's correlation between the two views
  (1: the views agree; 0: they are unrelated; a dead dimension counts 0);
- ``eff_rank``: C's effective rank (Roy & Vetterli 2007), exp of the entropy of its
  normalised singular values: from 1 (one direction) to d (all alike); 0 when C is 0;
- ``max_var``: the largest variance of any dimension, which says whether dead dimensions
  are dead by the floor (a few dimensions still vary) or by ε (none varies on ε's scale);
- ``median_var``: the median variance of the dimensions (F's and G's together), which says
  whether the loss is eq. 1 in effect (a median of 10 ε or more: every typical dimension's
  spread reads within 5 % of itself, √(v / (v + ε)) ≥ 0.95) or leans on ε (a median near ε).

For statistics with ⟨F Fᵀ⟩ instead of ⟨F Gᵀ⟩ (``stats.VICREG_STATS``, ``SPECTRAL_STATS``),
C's diagonal comes from ⟨F_i G_i⟩ and the rank is that of F's correlation matrix; without
means (the spectral loss's uncentred moments) the moments are taken about 0.

``CollapseWatch`` judges them reading after reading and gives one warning line.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dcco.core.stats import STATS_DTYPE, Moments, encoding_stats

FIGURES = ("dead_dims", "corr_diag", "eff_rank", "max_var", "median_var")
"""The collapse figures, in the order records and progress lines show them."""
DEAD_FLOOR = 1e-6
"""A dimension is dead when its variance is at most this fraction of the largest: its
spread is under a thousandth of the liveliest dimension's."""
EPS_DEAD = 1 / 3
"""A dimension is dead by the loss's ε when its variance is at most this fraction of ε: the
loss, which divides by √(Var + ε), then sees under half of its spread (√(v / (v + ε)) ≤ ½).
Measured (``experiments/eps_regime.py``, docs/results/collapse.md): the median variance of
DCCO's healthy CPU-scale run is 0.5–1.1 × ε from round 40 on (under 25 % of its dimensions
below ε / 3), the demo's cco_fedavg, whose 4-sample clients cannot train a 128-wide loss,
0.04–0.15 × ε (over 85 % below)."""


def effective_rank(matrix: Tensor) -> Tensor:
    """exp(−Σ_k p_k log p_k) with p = σ / Σσ the normalised singular values σ of ``matrix``
    (Roy & Vetterli 2007): from 1 (one direction) to min(shape) (all alike); 0 for a zero
    matrix. The singular values come from the eigenvalues of MᵀM (a symmetric
    decomposition, about twice as fast as an SVD); an eigenvalue within the decomposition's
    round-off of zero (d · ε_float64 · the largest) is zero, since its square root would turn
    that round-off, ±1e-16 of a zero singular value's square, into a singular value of 1e-8
    whose size depends on the CPU. A 0-d float64 tensor on its device."""
    m = matrix.to(STATS_DTYPE)
    lam = torch.linalg.eigvalsh(m.T @ m)
    noise = lam.abs().max() * lam.shape[-1] * torch.finfo(STATS_DTYPE).eps
    sigma = torch.where(lam > noise, lam, torch.zeros_like(lam)).sqrt()
    total = sigma.sum()
    p = sigma / total.clamp_min(torch.finfo(STATS_DTYPE).tiny)
    entropy = -torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros_like(p)).sum()
    return torch.where(total > 0, entropy.exp(), torch.zeros_like(total))


def collapse_figures(m: Moments, floor: float = DEAD_FLOOR, eps: float = 0.0
                     ) -> dict[str, Tensor]:
    """``dead_dims``, ``corr_diag``, ``eff_rank``, ``max_var`` and ``median_var`` (module
    docstring) of batch averages.

    Args:
        m: the averages of a statistics method (``stats.CCO_STATS``, ``VICREG_STATS`` or
            ``SPECTRAL_STATS``), e.g. S_A.
        floor: a dimension whose variance is at most ``floor`` times the largest variance of
            the encodings counts as dead.
        eps: the ε the method's loss adds inside each variance (``Method.variance_eps``); a
            dimension whose variance is at most ``EPS_DEAD`` × ε counts as dead too.

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
    largest = torch.maximum(var_f.max(), var_g.max())
    threshold = torch.clamp_min(floor * largest, EPS_DEAD * eps)
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
    return {"dead_dims": dead, "corr_diag": corr_diag, "eff_rank": effective_rank(c),
            "max_var": largest.to(STATS_DTYPE),
            "median_var": torch.cat([var_f, var_g]).to(STATS_DTYPE).median()}


def encoding_figures(f: Tensor, g: Tensor, floor: float = DEAD_FLOOR, eps: float = 0.0
                     ) -> dict[str, Tensor]:
    """The same figures of two views' encodings F, G (N, d): what a method that shares no
    statistics is read by (its CCO averages are computed here, in float64)."""
    return collapse_figures(encoding_stats(f.detach(), g.detach()).moments(), floor, eps)


DEAD_LIMIT = 0.5
"""Dead dimensions: at least this fraction of them under the floor."""
RANK_LIMIT = 1.5
"""One direction: C's effective rank below this."""
CORR_LIMIT = 0.15
"""The plateau: the views' mean correlation C_ii below this, at ``CORR_READINGS`` readings in a
row (healthy runs read 0.17 to 0.5 and rising by round 20; the paper's network under Adam 5e-3
reads 0.10 to 0.13 on its plateau: docs/results/collapse.md)."""
CORR_READINGS = 3
EPS_SCALE = 100.0
"""Encodings under ε: the largest variance at most this many times the loss's ε (an encoder
whose outputs are scaled by 1e-4 reads 1e-9 against ε = 1e-5)."""


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

    - encodings under the loss's ε: ``dead_dims`` ≥ ``DEAD_LIMIT`` and even the largest
      variance at most ``EPS_SCALE`` times ε (``eps`` > 0), yet more than ``DEAD_FLOOR``
      times ε: the encodings vary, on ε's scale, so ε is what they are dead by (encodings
      that do not vary at all are dead dimensions, next);
    - dead dimensions, ``dead_dims`` ≥ ``DEAD_LIMIT``;
    - one direction, ``eff_rank`` < ``RANK_LIMIT`` (for d ≥ 4);
    - the plateau, ``corr_diag`` < ``CORR_LIMIT`` at ``CORR_READINGS`` readings in a row: the
      two views' encodings unrelated, a CCO loss near d.

    Args:
        after: the first round judged (``watch_start``).
        eps: the ε of the run's loss (``Method.variance_eps``; 0: a loss without one).
        client_samples: for a method whose CCO loss each client computes from its own
            samples alone (``cco_fedavg``), the most samples a client holds; None for the
            others. Collapse with clients of fewer samples than the encodings' width is then
            blamed on the clients' size, not on the rate or the encodings' scale: n samples
            cannot estimate a d × d correlation, so each client's loss sits at its floor
            whatever the model does (docs/results/demo.md).
        server: the run's server optimiser and peak rate (``optim.optimizer``,
            ``optim.lr``), so that the advice names the setting and its value; None: a
            run whose optimiser is not known here.
        has_projector: whether the model ends in dcco's projector (whose group norm sets
            the encodings' scale), so that the advice does not offer it to a run that has it.
        offer_rewind: whether the advice offers ``train.on_collapse = "rewind"``: not to a
            run that rewinds already, nor where the setting does not exist (a user's Flower
            app under ``DCCOStrategy``).
    """

    def __init__(self, after: int, eps: float = 0.0, client_samples: int | None = None,
                 server: tuple[str, float] | None = None, has_projector: bool = False,
                 offer_rewind: bool = True) -> None:
        self.after = after
        self.eps = eps
        self.client_samples = client_samples
        self.server = server
        self.has_projector = has_projector
        self.offer_rewind = offer_rewind
        self.message: str | None = None
        self._low_corr = 0

    def _rate_advice(self) -> str:
        """What to try against server steps that are too large, naming this run's setting."""
        if self.server is None:
            lower = ("Try a lower server rate (optim.lr; dcco.fit and dcco.flower.DCCOStrategy "
                     "default to Adam 1e-3)")
        else:
            name, lr = self.server
            lower = f"Try a lower server rate: optim.lr = {lr / 2:g} (now {lr:g} under {name})"
        if not self.offer_rewind:
            return f"{lower}, or a longer warm-up (optim.warmup_rounds)"
        return (f"{lower}, a longer warm-up (optim.warmup_rounds), or train.on_collapse = "
                f"\"rewind\", which halves the rate from a checkpoint before the collapse")

    def _steps_cause(self) -> str:
        """Why the server's steps hurt, in this run's optimiser's terms."""
        name = self.server[0] if self.server is not None else None
        if name == "adam":
            return ("server steps too large for this network (Adam moves every weight by "
                    "about its rate, however small the weight; wide layers suffer most)")
        if name == "lars":
            return ("server steps too large for this network (LARS moves each layer by a "
                    "share of its own norm, so a high rate turns every layer at once)")
        return "server steps too large for this network"

    def check(self, round_done: int, figures: dict[str, float], d: int) -> str | None:
        """The warning for this reading of encodings of width ``d``, once; None
        otherwise."""
        if self.message is not None or round_done < self.after or not figures:
            return None
        dead, corr, rank = (figures[k] for k in ("dead_dims", "corr_diag", "eff_rank"))
        largest = figures.get("max_var")
        self._low_corr = self._low_corr + 1 if corr < CORR_LIMIT else 0
        rate = self._rate_advice() + ("" if self.has_projector
                                      else ", and normalisation layers in the model")
        if dead >= DEAD_LIMIT and self.eps > 0 and largest is not None \
                and DEAD_FLOOR * self.eps < largest <= EPS_SCALE * self.eps:
            what = (f"{dead:.0%} of the encodings' dimensions vary less than a third of the "
                    f"loss's ε = {self.eps:g} (the largest variance is {largest:.2g}): the "
                    f"loss sees under half of their spread, or reads them as constants")
            if self.has_projector:
                cause = ("encodings shrunk onto ε's scale: the loss, which divides by √(Var + "
                         "ε), gains by shrinking them once their correlations are mostly "
                         "redundancy (docs/results/collapse.md)")
                fix = (f"{self._rate_advice()}; or lower loss.eps below the variances (now "
                       f"{self.eps:g})")
            else:
                cause = "encodings too small for ε: an output scaled down, or initialised tiny"
                fix = ("Scale the encoder's outputs up, give it dcco's projector (its group "
                       "norm sets the scale), or lower loss.eps below the variances")
        elif dead >= DEAD_LIMIT:
            what = (f"{dead:.0%} of the encodings' dimensions no longer vary over a round's "
                    f"samples")
            cause = ("dead units: server steps too large for the model" if self.has_projector
                     else "dead units: a model without normalisation, or server steps too "
                          "large for it")
            fix = rate
        elif d >= 4 and rank < RANK_LIMIT:
            what = f"the encodings lie on about one line (C's effective rank {rank:.2f})"
            cause = "server steps too large for the model"
            fix = rate
        elif self._low_corr >= CORR_READINGS:
            what = (f"the two views' encodings stay unrelated (mean C_ii {corr:.2f} at "
                    f"{CORR_READINGS} readings in a row; the loss sits near d = {d})")
            cause = self._steps_cause()
            fix = rate
        else:
            return None
        if self.client_samples is not None and self.client_samples < d:
            n = self.client_samples
            cause = (f"clients too small for a loss of their own: each client's CCO loss "
                     f"estimates a {d} × {d} correlation from its {n} samples, which cannot "
                     f"be done, so it sits at its floor (about d) whatever the model does")
            fix = ("This is the FedAvg baseline's limit at small clients, which neither a "
                   "lower rate nor the encodings' scale will lift: give clients more samples, "
                   "or share the round's statistics (dcco)")
        self.message = (f"collapse at round {round_done}: {what}. Likely cause: {cause}. "
                        f"{fix} (docs/own_code.md, \"Collapse\")")
        return self.message


__all__ = ["FIGURES", "CollapseWarning", "CollapseWatch", "collapse_figures", "effective_rank",
           "encoding_figures", "watch_start"]
