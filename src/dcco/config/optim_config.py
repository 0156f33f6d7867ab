"""The server's (or centralized) optimiser: section ``[optim]`` (``dcco.core.optim`` runs it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class OptimConfig:
    """Server (or centralized) optimiser.

    Defaults are the paper's CIFAR-100 federated pretraining: Adam with cosine decay, initial
    learning rate 5e-3 (appendix B). LARS is the paper's choice for DERM and linear probes.
    """

    optimizer: Literal["adam", "lars", "sgd"] = "adam"
    """"adam" (AdamW), "lars", or "sgd": plain SGD without momentum, FedAvg's server at
    lr 1 (θ ← θ + lr · the average update). The Flower strategy's ``optimizer=``; read from
    its old name, ``optim.name``, with a ``DeprecationWarning``."""
    lr: float = 5e-3
    """The peak learning rate (after warm-up)."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """After warm-up: "cosine" decay to zero over the run, or "constant"."""
    warmup_rounds: int = 0
    """Rounds of linear warm-up from lr / warmup_rounds (a centralized method's step is its
    round). Read from its old name, ``optim.warmup_steps``, with a ``DeprecationWarning``."""
    weight_decay: float = 0.0
    """Weight decay of the ≥2-D parameters (decoupled under Adam, as AdamW)."""
    momentum: float = 0.9
    """LARS momentum (paper: 0.9)."""
    trust_coefficient: float = 1e-3
    """LARS η in trust ratio η‖w‖/‖g + λw‖ (You et al. 2017)."""
    vector_lr_scale: float = 1.0
    """Learning rate of the 1-D parameters (biases, normalisation gains and shifts) relative
    to ``lr``. LARS leaves them unadapted, so at ``lr`` they move by the raw gradient times
    the base rate; Barlow Twins' LARS gives them 0.0048 against the weights' 0.2 (0.024)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam's β₁ and β₂."""
    eps: float = 1e-8
    """Adam's ε."""

    def __post_init__(self) -> None:
        if self.optimizer not in ("adam", "lars", "sgd"):
            raise ValueError(f"optim.optimizer must be 'adam', 'lars' or 'sgd', got "
                             f"{self.optimizer!r}")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"optim.schedule must be 'cosine' or 'constant', got "
                             f"{self.schedule!r}")
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if self.warmup_rounds < 0:
            raise ValueError(f"optim.warmup_rounds must be >= 0, got {self.warmup_rounds}")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"optim.momentum must be in [0, 1), got {self.momentum}")
        if not self.trust_coefficient > 0:
            raise ValueError(
                f"optim.trust_coefficient must be > 0, got {self.trust_coefficient}"
            )
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas must lie in [0, 1), got {self.betas}")
        if not self.eps > 0:
            raise ValueError(f"optim.eps must be > 0, got {self.eps}")
        if not 0 < self.vector_lr_scale <= 1:
            raise ValueError(f"optim.vector_lr_scale must be in (0, 1], got "
                             f"{self.vector_lr_scale}")

