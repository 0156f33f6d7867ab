"""The predictive baselines of the paper's appendix C: BYOL (Grill et al. 2020) and SimSiam
(Chen & He 2021), centralized and with FedAvg.

Both regress a predictor's output q(z) of one view onto a target of the other view: SimSiam's
target is the online projection with its gradient stopped, BYOL's the projection of a target
network, a moving average of the online backbone and projector. The dual encoder computes
predictions and targets (``dcco.models.DualEncoder`` with a ``Head``); a method here only
scores them. Both losses are means over samples with no cross-sample term, so a round's loss
over the concatenated clients is exact as a plain mean (sample weights N_k/N × 1/N_k = 1/N).

In the federated form the server keeps BYOL's target network: after each round's server step
it moves the target toward the new global model (``Pretraining.apply``), and the target's
weights travel to the clients with the model, doubling the download but not the upload (the
target takes no gradient, so its update is not sent).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from torch import Tensor

from dcco.config import LossConfig
from dcco.core.losses import byol_loss_per_sample, simsiam_loss_per_sample, split_prediction
from dcco.core.stats import Moments
from dcco.methods.base import MethodBase, Segments

BYOL_PROJECTOR = (4096, 256)
"""BYOL's projector: one hidden layer of 4096, output 256 (Grill et al. 2020, §3.3)."""
SIMSIAM_PROJECTOR = (2048, 2048, 2048)
"""SimSiam's CIFAR projector: 2048 wide, three layers (Chen & He 2021, §4 and appendix)."""


@dataclass(frozen=True)
class PredictiveMethod(MethodBase):
    """Shared by BYOL and SimSiam. A subclass gives ``target``, ``per_sample`` (the loss of
    each sample from the predictions and targets of both views) and ``default_predictor``
    (the predictor's widths for a projector); the concrete methods below only name
    themselves and say whether they are federated."""

    loss: LossConfig = field(default_factory=LossConfig)

    min_client_samples: ClassVar[int] = 1
    has_predictor: ClassVar[bool] = True
    """Whether the method has a predictor head (``model.predictor``; MoCo has none)."""
    target: ClassVar[Literal["stopgrad", "ema"]]
    per_sample: ClassVar[Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]]
    default_predictor: ClassVar[Callable[[tuple[int, ...]], tuple[int, ...]]]

    def client_loss(self, f: Tensor, g: Tensor, shared: Moments | None) -> Tensor:
        """The mean loss over the client's samples; F = [q₁, y₁], G = [q₂, y₂]."""
        (q1, y1), (q2, y2) = split_prediction(f), split_prediction(g)
        return self.per_sample(q1, q2, y1, y2).mean()

    def round_loss(self, f: Tensor, g: Tensor, segments: Segments,
                   shared: Moments | None) -> Tensor:
        """Σ_k (N_k/N) mean_k = the mean over the round's samples (the loss is a sum over
        samples)."""
        return self.client_loss(f, g, shared)


def _byol_predictor(projector: tuple[int, ...]) -> tuple[int, ...]:
    """BYOL's predictor has the projector's hidden width: (4096, 256) for (4096, 256)."""
    return (projector[0], projector[-1])


def _simsiam_predictor(projector: tuple[int, ...]) -> tuple[int, ...]:
    """SimSiam's bottleneck predictor: hidden width d/4 (512 for d = 2048)."""
    return (max(2, projector[-1] // 4), projector[-1])


class BYOLBase(PredictiveMethod):
    target: ClassVar[Literal["stopgrad", "ema"]] = "ema"
    per_sample = staticmethod(byol_loss_per_sample)
    default_predictor = staticmethod(_byol_predictor)
    default_projector: ClassVar[tuple[int, ...]] = BYOL_PROJECTOR
    loss_kind: ClassVar[str] = "BYOL loss (2 − 2 cos, both directions; 0 to 8)"


class SimSiamBase(PredictiveMethod):
    target: ClassVar[Literal["stopgrad", "ema"]] = "stopgrad"
    per_sample = staticmethod(simsiam_loss_per_sample)
    default_predictor = staticmethod(_simsiam_predictor)
    default_projector: ClassVar[tuple[int, ...]] = SIMSIAM_PROJECTOR
    loss_kind: ClassVar[str] = "SimSiam loss (−cos, symmetrised; −1 to 1)"


def head_parts(method: object) -> tuple[bool, bool]:
    """Whether ``method`` trains with a predictor (BYOL's, SimSiam's), and whether with a
    target network (BYOL's; MoCo's key encoder); neither for the other methods."""
    if not isinstance(method, PredictiveMethod):
        return False, False
    return bool(method.default_predictor((2, 2))), method.target == "ema"


def head_mismatch(method: object, has_predictor: bool, has_target: bool
                  ) -> tuple[str, bool] | None:
    """The first part of a model's head that does not fit ``method`` (``head_parts``):
    ``("predictor" | "target network", needed)``, needed True where the model lacks it and
    False where it holds one the method does not train; None when the head fits."""
    for what, needed, has in zip(("predictor", "target network"), head_parts(method),
                                 (has_predictor, has_target), strict=True):
        if needed != has:
            return what, needed
    return None


def target_decay(base: float, round_index: int, rounds: int) -> float:
    """BYOL's τ for the target update after round ``round_index`` (0-based) of ``rounds``:
    1 − (1 − τ_base)(cos(π k/K) + 1)/2, rising from τ_base to 1 (Grill et al. 2020, §3.2)."""
    return 1 - (1 - base) * (math.cos(math.pi * round_index / rounds) + 1) / 2


class CentralizedBYOL(BYOLBase):
    name: ClassVar[str] = "centralized_byol"
    federated: ClassVar[bool] = False


class BYOLFedAvg(BYOLBase):
    name: ClassVar[str] = "byol_fedavg"
    federated: ClassVar[bool] = True


class CentralizedSimSiam(SimSiamBase):
    name: ClassVar[str] = "centralized_simsiam"
    federated: ClassVar[bool] = False


class SimSiamFedAvg(SimSiamBase):
    name: ClassVar[str] = "simsiam_fedavg"
    federated: ClassVar[bool] = True
