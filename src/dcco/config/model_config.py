"""The encoder's configuration (``ModelConfig``) and the architectures' default widths."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Arch = Literal["resnet14", "resnet50", "resnet20_fixup", "mlp"]
Norm = Literal["gn", "bn", "none"]
ARCHS = ("resnet14", "resnet50", "resnet20_fixup", "mlp")

RESNET14_WIDTHS = (64, 128, 256)
RESNET50_WIDTHS = (64, 128, 256, 512)
RESNET20_FIXUP_WIDTHS = (128, 256, 512)
"""FedSC's Fixup ResNet-20 at widen factor 8: (16, 32, 64) × 8."""
MLP_WIDTHS = (512, 512)
WS_EPS = 1e-5
"""Added to each output unit's weight variance in weight standardisation (Qiao et al.'s code adds
1e-5 to the standard deviation). At initialisation it is about 1% of a 256-wide 3×3 conv's
weight variance and 3% of a 1024-input projector layer's, shrinking the standardised weight by
0.6% and 1.5%; every standardised layer is followed by group norm, which undoes such a
near-uniform shrink, so eps in effect only guards a unit whose weights are all equal."""
PROJECTOR_MIN_GROUP = 8
"""Channels per group-norm group in the projector, at least. A projector's activations are
vectors, so a group of one channel would normalise every entry to zero; the paper's widths
(1024 and 256 with 32 groups) give 32 and 8 channels per group, and narrower projectors keep
that floor of 8 by using fewer groups."""


@dataclass(frozen=True)
class ModelConfig:
    """The encoder architecture (paper §4)."""

    arch: Arch = "resnet14"
    """resnet14: CIFAR-style 6n+2 network, n=2 (paper, CIFAR-100); resnet50: ImageNet
    bottleneck network (paper, DERM); resnet20_fixup: FedSC's CIFAR ResNet-20 with Fixup
    initialisation and no normalisation (``FixupResNet20``; needs ``norm = "none"``); mlp: a
    multilayer perceptron on the flattened input, for modalities that are not images
    (``MLP``)."""
    widths: tuple[int, ...] | None = None
    """Channels per stage; None: resnet14 (64, 128, 256), resnet50 (64, 128, 256, 512),
    resnet20_fixup (128, 256, 512), FedSC's widen factor 8 (its widths may not shrink from
    stage to stage: its shortcuts pad with zero channels). A resnet50 stage outputs 4× its
    width (bottleneck expansion). For mlp, the hidden layers'
    widths (any number; None: (512, 512))."""
    projector: tuple[int, ...] | None = None
    """Projector widths; None: the method's paper default ([1024]*3 CCO, [256, 256, 128]
    NT-Xent), resolved by ``dcco.run.setup.projector``."""
    shared: bool = True
    """One network for both inputs (the paper's self-supervised setting) or two towers."""
    gn_groups: int = 32
    """Group-norm groups: 32 (paper), fewer where a width is not divisible (``group_count``)."""
    ws_eps: float = WS_EPS
    """Added to the weight variance in weight standardisation (see ``WS_EPS``)."""
    norm: Norm = "gn"
    """gn: weight-standardised convolutions and linears with group norm (the paper's encoder,
    no cross-sample terms); bn: plain convolutions and linears with batch norm (the paper's
    appendix C ablation). Batch norm normalises each forward's batch, so a round of several
    clients runs client by client, and each view of a pair is normalised on its own; none:
    plain convolutions and linears and no normalisation (FedSC's Fixup ResNet-20 and its
    Linear → ReLU → Linear projector; a resnet14 or resnet50 without normalisation trains
    badly from its initialisation)."""
    predictor: tuple[int, ...] | None = None
    """The predictor head's widths for BYOL and SimSiam (its last is the projection width d);
    None: the method's default (``dcco.methods.predictive``). Other methods have none."""
    y_arch: Arch | None = None
    """The second tower's architecture (two towers, ``shared = false``), for a second
    modality of another kind; None: ``arch``."""
    y_widths: tuple[int, ...] | None = None
    """The second tower's widths; None: ``widths`` when the towers share an architecture,
    else ``y_arch``'s default."""
    clip_encodings: float | None = None
    """Training forwards scale every encoding (each sample's F and G) down to at most this L2
    norm, and leave shorter ones as they are: FedSC's √μ (μ = 4 in Jing et al. 2024's code, so
    2.0), which bounds each sample's share of the shared second moments. None: no clipping.
    Per sample, so rounds stay exact."""

    def __post_init__(self) -> None:
        for key in ("arch", "y_arch"):
            value = getattr(self, key)
            if value not in ARCHS and not (key == "y_arch" and value is None):
                raise ValueError(f"model.{key} must be one of {', '.join(map(repr, ARCHS))}, "
                                 f"got {value!r}")
        if self.shared and (self.y_arch is not None or self.y_widths is not None):
            raise ValueError("model.y_arch and model.y_widths describe a second tower; set "
                             "model.shared = false (two towers) or leave them unset")
        if self.norm not in ("gn", "bn", "none"):
            raise ValueError(f"model.norm must be 'gn' (group norm + weight standardisation), "
                             f"'bn' (batch norm) or 'none', got {self.norm!r}")
        if "resnet20_fixup" in (self.arch, self.tower_arch(1)) and self.norm != "none":
            raise ValueError(f"model.arch = 'resnet20_fixup' has no normalisation (Fixup "
                             f"initialisation instead); set model.norm = 'none', got "
                             f"{self.norm!r}")
        if self.clip_encodings is not None and not (self.clip_encodings > 0
                                                    and math.isfinite(self.clip_encodings)):
            raise ValueError(f"model.clip_encodings must be a finite number > 0 (FedSC: 2.0) "
                             f"or none, got {self.clip_encodings!r}")
        if self.predictor is not None and (len(self.predictor) < 2
                                           or not _positive(self.predictor)):
            raise ValueError(f"model.predictor must be two or more positive integers (hidden "
                             f"widths, then d), or none; got {self.predictor!r}")
        for key, arch, widths in (("widths", self.arch, self.widths),
                                  ("y_widths", self.tower_arch(1), self.y_widths)):
            stages = len(_default_widths(arch))
            if widths is not None and (not _positive(widths) or (
                    arch != "mlp" and len(widths) != stages) or len(widths) == 0):
                count = "one or more" if arch == "mlp" else str(stages)
                raise ValueError(f"model.{key} must be {count} positive integers for {arch} "
                                 f"(or none), got {widths!r}")
            if (arch == "resnet20_fixup" and widths is not None
                    and list(widths) != sorted(widths)):
                raise ValueError(f"model.{key} of resnet20_fixup may not shrink from stage to "
                                 f"stage (its shortcuts pad with zero channels), got "
                                 f"{widths!r}")
        if self.projector is not None and (len(self.projector) == 0
                                           or not _positive(self.projector)):
            raise ValueError(
                f"model.projector must be one or more positive integers (or none), "
                f"got {self.projector!r}"
            )
        if not _positive((self.gn_groups,)):
            raise ValueError(f"model.gn_groups must be an integer >= 1, got {self.gn_groups!r}")
        if not (self.ws_eps > 0 and math.isfinite(self.ws_eps)):
            raise ValueError(f"model.ws_eps must be a finite number > 0, got {self.ws_eps!r}")

    @property
    def stage_widths(self) -> tuple[int, ...]:
        """The widths, or the architecture's default."""
        return self.widths if self.widths is not None else _default_widths(self.arch)

    def tower_arch(self, tower: int) -> str:
        """The architecture of tower ``tower`` (0 or 1)."""
        return self.arch if tower == 0 or self.y_arch is None else self.y_arch

    def tower_widths(self, tower: int) -> tuple[int, ...]:
        """The widths of tower ``tower`` (see ``y_widths``)."""
        if tower == 0:
            return self.stage_widths
        if self.y_widths is not None:
            return self.y_widths
        if self.tower_arch(1) == self.arch:
            return self.stage_widths
        return _default_widths(self.tower_arch(1))


def _default_widths(arch: str) -> tuple[int, ...]:
    return {"resnet14": RESNET14_WIDTHS, "resnet50": RESNET50_WIDTHS,
            "resnet20_fixup": RESNET20_FIXUP_WIDTHS, "mlp": MLP_WIDTHS}[arch]


def _positive(values: tuple[int, ...]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values)
