"""The losses' hyper-parameters and the paper's values: section ``[loss]`` (``dcco.core.losses``
computes them)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, get_args, get_origin, get_type_hints

LAMBDA = 20.0
"""λ, the trade-off between the invariance and redundancy terms (paper appendix B)."""
BN_EPS = 1e-5
"""Added to each variance before the square root, as ``torch.nn.BatchNorm1d`` does."""
TEMPERATURE = 0.1
"""NT-Xent temperature (paper appendix B, following SimCLR)."""
MOCO_TEMPERATURE = 0.2
"""MoCo v2's InfoNCE temperature (Chen, Fan, Girshick & He 2020)."""
VICREG_COEFFS = (25.0, 25.0, 1.0)
"""VICReg's invariance, variance and covariance coefficients (Bardes et al. 2022, §4)."""


@dataclass(frozen=True)
class LossConfig:
    """Loss hyper-parameters, the paper's values by default (appendix B)."""

    lambd: float = LAMBDA
    """λ of the CCO loss (paper eq. 1)."""
    eps: float = BN_EPS
    """ε added inside each variance of the CCO loss, as BatchNorm adds it: C_ij = cov_ij /
    (√(var_i + ε) √(var_j + ε)). Paper eq. 1 has none; a tiny ε (1e-12) is eq. 1 as written,
    which collapses the CPU recipe (docs/results/collapse.md). Below a variance of ε a
    dimension's correlations shrink towards 0."""
    temperature: float = TEMPERATURE
    """NT-Xent temperature τ."""
    vicreg: tuple[float, float, float] = VICREG_COEFFS
    """VICReg's invariance, variance and covariance coefficients (Bardes et al. 2022: 25, 25,
    1)."""
    spectral_form: str = "pooled"
    """The spectral contrastive loss's negative-pair term (``dcco.core.losses.spectral_loss``):
    "pooled", FedSC's ‖(A + B)/2‖²_F, or "cross", HaoChen's tr(A B)."""
    target_decay: float = 0.99
    """BYOL's τ_base: the target network's moving-average rate, raised to 1 on a cosine over
    the run (``dcco.methods.predictive.target_decay``). Grill et al. use 0.996 for 1000
    epochs; 0.99 suits runs of a few hundred rounds."""

    fedema_tau: float = 0.7
    """FedEMA's τ, μ at a client's first mix: its λ is set to τ / ‖W_g − W_k‖ then
    (``dcco.methods.divergence``; Zhuang et al. 2022's autoscaler, 0.7 as its authors run it)."""
    fedu_threshold: float = 0.4
    """FedU's divergence threshold: a returning client takes the global predictor when
    its divergence (``loss.divergence``) is below it, else keeps its own (Zhuang et al.
    2021). 0.4 is its authors' code's default, on their measure (``loss.divergence =
    "travelled"``, a mean per-layer distance); on the default "receipt" measure (one vector
    over the whole online network) set it for your network (``dcco.methods.divergence``)."""

    divergence: Literal["receipt", "travelled"] = "receipt"
    """How FedU and FedEMA measure a returning client's divergence (``dcco.methods.divergence``):
    "receipt", ‖W_g − W_k‖ of the online networks as one vector when the client receives W_g,
    as the papers' formulas read (dcco's default); "travelled", as the authors' code (EasyFL's
    ``fedssl``) measures it: the mean over the online network's convolution weights of each
    one's L2 distance travelled in the client's last local training, kept in its state. On
    that scale FedU's threshold is the authors' 0.4."""
    fedema_mix: Literal["always", "selective"] = "always"
    """When a returning FedEMA client mixes its model with the global one
    (``dcco.methods.divergence``): "always", at every return, as the paper reads; "selective",
    as its authors' code runs it (EasyFL's ``fedssl``, ``selective_ema``): only when it trained
    in the round just before, else it starts afresh from the global model as a new client
    does (keeping its λ)."""
    moco_queue: int = 0
    """The keys a MoCo client keeps in its queue as extra negatives, its own keys of earlier
    rounds (``dcco.methods.moco``). 0 by default: a client of a few photos would queue the
    keys of the very photos it sees again, negatives that are its positives. For clients
    of tens to hundreds of samples that return every round (cross-silo), one round's keys,
    twice the client's samples (128 for 64 photos in experiments/fedssl_cross_silo_fmnist.toml)."""
    moco_temperature: float = MOCO_TEMPERATURE
    """MoCo's InfoNCE temperature (v2: 0.2)."""
    moco_directions: Literal["mean", "sum"] = "mean"
    """How a MoCo client's loss joins its two directions, ℓ(q₁, k₂) and ℓ(q₂, k₁): "mean",
    their average (dcco's default, the scale of one direction, as the MoCo v1/v2 papers' loss
    has); "sum", their sum, as the FedU and FedEMA authors' federated code (EasyFL's
    ``fedssl``) and MoCo v3 compute it: twice the gradient at the same rates."""

    def __post_init__(self) -> None:
        if not self.lambd >= 0:
            raise ValueError(f"loss.lambd must be >= 0, got {self.lambd}")
        if not self.eps > 0:
            raise ValueError(f"loss.eps must be > 0, got {self.eps}")
        if not self.temperature > 0:
            raise ValueError(f"loss.temperature must be > 0, got {self.temperature}")
        if not all(c >= 0 for c in self.vicreg):
            raise ValueError(f"loss.vicreg coefficients must be >= 0, got {self.vicreg}")
        if self.spectral_form not in ("pooled", "cross"):
            raise ValueError(f"loss.spectral_form must be 'pooled' or 'cross', got "
                             f"{self.spectral_form!r}")
        if not 0 <= self.target_decay < 1:
            raise ValueError(f"loss.target_decay must be in [0, 1), got {self.target_decay}")
        if not 0 < self.fedema_tau <= 1:
            raise ValueError(f"loss.fedema_tau must be in (0, 1], got {self.fedema_tau}")
        for name, allowed in _choices().items():  # a config built in code skips TOML's check
            if getattr(self, name) not in allowed:
                raise ValueError(f"loss.{name} must be {' or '.join(map(repr, allowed))}, "
                                 f"got {getattr(self, name)!r}")
        if self.moco_queue < 0:
            raise ValueError(f"loss.moco_queue must be >= 0, got {self.moco_queue}")
        if not self.moco_temperature > 0:
            raise ValueError(f"loss.moco_temperature must be > 0, got {self.moco_temperature}")
        if not self.fedu_threshold >= 0:
            raise ValueError(f"loss.fedu_threshold must be >= 0, got {self.fedu_threshold}")


@functools.cache
def _choices() -> dict[str, tuple[str, ...]]:
    """Each of ``LossConfig``'s fields whose type is a ``Literal``, and its allowed values."""
    return {name: get_args(kind) for name, kind in get_type_hints(LossConfig).items()
            if get_origin(kind) is Literal}
