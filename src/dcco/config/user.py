"""What a user's own model trains with unless told otherwise: the defaults of ``dcco.fit``
and of the Flower strategy ``dcco.flower.DCCOStrategy``, in one place (docs/config.md prints them,
"Defaults for your own model").

A user's model is not the network a paper recipe was tuned on, so these were chosen by
measurement on models as users bring them (``experiments/learning_value.py``; docs/results.md,
"What training is worth"): against the earlier defaults (a projector of 128³ and the paper's
λ = 20), a projector of 512³ and λ = 5 raised the linear probe of every model tried, by 0.6
to 4 points at 500 rounds, and no server optimiser beat Adam at 1e-3.
"""

from __future__ import annotations

from dataclasses import dataclass

from dcco.config.optim import USER_RECIPE, OptimConfig


@dataclass(frozen=True)
class UserDefaults:
    """The defaults for a user's own model."""

    optim: OptimConfig
    """The server optimiser (``USER_RECIPE``): Adam at 1e-3 after 10 warm-up rounds, cosine."""
    lambd: float
    """λ of the CCO loss (``loss.lambd``; the paper's, 20, suits its 1024-wide projector)."""
    projector: tuple[int, ...]
    """The projector's widths (dcco's MLP with group norm, paper §4)."""
    clients_per_round: int
    """Clients a round (K)."""


USER = UserDefaults(optim=USER_RECIPE, lambd=5.0, projector=(512, 512, 512),
                    clients_per_round=32)
"""The defaults ``dcco.fit`` and ``dcco.flower.DCCOStrategy`` use (``UserDefaults``)."""


__all__ = ["USER", "UserDefaults"]
