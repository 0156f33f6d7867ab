"""Encoders of the paper (§4): ResNets with weight standardisation and group norm, a projector
MLP, and the dual encoder that pairs them; for the predictive baselines (BYOL, SimSiam) a
predictor head and BYOL's moving-average target network, and batch norm for appendix C's
ablation (``ModelConfig.norm``); and FedSC's Fixup ResNet-20 (Jing et al. 2024), which has no
normalisation at all (``fixup``).

"Weight standardization and group normalization with 32 groups are used at every layer except
the last projection layer" (paper §4): every convolution is a ``WSConv2d`` (Qiao et al. 2019)
followed by group norm (Wu & He 2018), every hidden projector layer a ``WSLinear`` followed by
group norm, and the last projection layer a plain ``nn.Linear``. Neither operation mixes
samples (there is no batch norm anywhere), so a batch's outputs and gradients are exactly those
of its samples run one by one: what lets the simulator run all of a round's clients in one
batch, and a shared dual encoder run both views in one forward pass.

The package by job: ``config`` (``ModelConfig``), ``layers`` (WS layers, group norm, the
projector), ``resnet`` (the paper's backbones), ``fixup`` (Fixup ResNet-20), ``dual`` (the dual
encoder) and ``build`` (checks and seeded initialisation).
"""

from dcco.config.model_config import (
    MLP_WIDTHS,
    PROJECTOR_MIN_GROUP,
    RESNET14_WIDTHS,
    RESNET20_FIXUP_WIDTHS,
    RESNET50_WIDTHS,
    WS_EPS,
    Arch,
    Norm,
)
from dcco.models.build import (
    InputShape,
    build_backbone,
    build_dual_encoder,
    build_projector,
    check_inputs,
    head_modules,
)
from dcco.models.dual import DualEncoder, Head
from dcco.models.fixup import FixupBlock, FixupResNet20
from dcco.models.layers import (
    Projector,
    WSConv2d,
    WSLinear,
    group_count,
    group_norm,
    has_batch_norm,
    standardised_weight,
)
from dcco.models.resnet import MLP, ResNet, ResNet14, ResNet50

__all__ = [
    "MLP", "MLP_WIDTHS", "PROJECTOR_MIN_GROUP", "RESNET14_WIDTHS", "RESNET20_FIXUP_WIDTHS",
    "RESNET50_WIDTHS", "WS_EPS", "Arch", "DualEncoder", "FixupBlock", "FixupResNet20", "Head",
    "InputShape", "Norm", "Projector", "ResNet", "ResNet14", "ResNet50",
    "WSConv2d", "WSLinear", "build_backbone", "build_dual_encoder", "build_projector",
    "check_inputs", "group_count", "group_norm", "has_batch_norm", "head_modules",
    "standardised_weight",
]
