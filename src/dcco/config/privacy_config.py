"""Client-level differential privacy: section ``[privacy]`` (``dcco.core.privacy`` applies
it)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PrivacyConfig:
    """Client-level differential privacy (off by default)."""

    noise_multiplier: float = 0.0
    """σ: each release's noise standard deviation over its sensitivity; 0 and no
    ``target_epsilon``: no differential privacy."""
    target_epsilon: float | None = None
    """Solve σ for this ε at ``delta`` over ``train.rounds`` (instead of giving σ)."""
    delta: float = 1e-5
    """δ of the reported (ε, δ)."""
    update_clip: float = 1.0
    """C_u: each client's update is clipped to this L2 norm (all parameters together)."""

    def __post_init__(self) -> None:
        if not (self.noise_multiplier >= 0 and math.isfinite(self.noise_multiplier)):
            raise ValueError(f"privacy.noise_multiplier must be a finite number >= 0, got "
                             f"{self.noise_multiplier}")
        if self.target_epsilon is not None and not (self.target_epsilon > 0
                                                    and math.isfinite(self.target_epsilon)):
            raise ValueError(f"privacy.target_epsilon must be a finite number > 0 (or none), "
                             f"got {self.target_epsilon}")
        if self.target_epsilon is not None and self.noise_multiplier > 0:
            raise ValueError("give privacy.noise_multiplier or privacy.target_epsilon, not both")
        if not 0 < self.delta < 1:
            raise ValueError(f"privacy.delta must be in (0, 1), got {self.delta}")
        if not (self.update_clip > 0 and math.isfinite(self.update_clip)):
            raise ValueError(f"privacy.update_clip must be a finite number > 0, got "
                             f"{self.update_clip}")

    @property
    def enabled(self) -> bool:
        return self.noise_multiplier > 0 or self.target_epsilon is not None
