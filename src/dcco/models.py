"""Encoders of the paper (§4): ResNets with weight standardisation and group norm, a projector
MLP, and the dual encoder that pairs them; for the predictive baselines (BYOL, SimSiam) a
predictor head and BYOL's moving-average target network, and batch norm for appendix C's
ablation (``ModelConfig.norm``).

"Weight standardization and group normalization with 32 groups are used at every layer except
the last projection layer" (paper §4): every convolution is a ``WSConv2d`` (Qiao et al. 2019)
followed by group norm (Wu & He 2018), every hidden projector layer a ``WSLinear`` followed by
group norm, and the last projection layer a plain ``nn.Linear``. Neither operation mixes
samples (there is no batch norm anywhere), so a batch's outputs and gradients are exactly those
of its samples run one by one: what lets the simulator run all of a round's clients in one
batch, and a shared dual encoder run both views in one forward pass.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcco.seeding import generator

Arch = Literal["resnet14", "resnet50", "mlp"]
Norm = Literal["gn", "bn"]

RESNET14_WIDTHS = (64, 128, 256)
RESNET50_WIDTHS = (64, 128, 256, 512)
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
    bottleneck network (paper, DERM); mlp: a multilayer perceptron on the flattened input,
    for modalities that are not images (``MLP``)."""
    widths: tuple[int, ...] | None = None
    """Channels per stage; None: resnet14 (64, 128, 256), resnet50 (64, 128, 256, 512). A
    resnet50 stage outputs 4× its width (bottleneck expansion). For mlp, the hidden layers'
    widths (any number; None: (512, 512))."""
    projector: tuple[int, ...] | None = None
    """Projector widths; None: the method's paper default ([1024]*3 CCO, [256, 256, 128]
    NT-Xent), resolved by ``dcco.config.RunConfig.projector``."""
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
    clients runs client by client, and each view of a pair is normalised on its own."""
    predictor: tuple[int, ...] | None = None
    """The predictor head's widths for BYOL and SimSiam (its last is the projection width d);
    None: the method's default (``dcco.methods.predictive``). Other methods have none."""
    y_arch: Arch | None = None
    """The second tower's architecture (two towers, ``shared = false``), for a second
    modality of another kind; None: ``arch``."""
    y_widths: tuple[int, ...] | None = None
    """The second tower's widths; None: ``widths`` when the towers share an architecture,
    else ``y_arch``'s default."""

    def __post_init__(self) -> None:
        for key in ("arch", "y_arch"):
            value = getattr(self, key)
            if value not in ("resnet14", "resnet50", "mlp") and not (key == "y_arch"
                                                                     and value is None):
                raise ValueError(f"model.{key} must be 'resnet14', 'resnet50' or 'mlp', got "
                                 f"{value!r}")
        if self.shared and (self.y_arch is not None or self.y_widths is not None):
            raise ValueError("model.y_arch and model.y_widths describe a second tower; set "
                             "model.shared = false (two towers) or leave them unset")
        if self.norm not in ("gn", "bn"):
            raise ValueError(f"model.norm must be 'gn' (group norm + weight standardisation) "
                             f"or 'bn' (batch norm), got {self.norm!r}")
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
    return {"resnet14": RESNET14_WIDTHS, "resnet50": RESNET50_WIDTHS, "mlp": MLP_WIDTHS}[arch]


def _positive(values: tuple[int, ...]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values)


def standardised_weight(weight: Tensor, eps: float = WS_EPS) -> Tensor:
    """Weight standardisation (Qiao et al. 2019): each output unit's weights shifted to mean 0
    and scaled to variance 1 (biased, over all its inputs and kernel positions).

    Args:
        weight: (out, in) or (out, in, kh, kw).
        eps: added to the variance.

    Returns:
        (W − mean) / √(var + eps), the shape of ``weight``.
    """
    dims = tuple(range(1, weight.ndim))
    var, mean = torch.var_mean(weight, dim=dims, keepdim=True, correction=0)
    return (weight - mean) * torch.rsqrt(var + eps)


class WSConv2d(nn.Conv2d):
    """A 2-D convolution whose weight is standardised per output channel in every forward."""

    def __init__(self, *args, eps: float = WS_EPS, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """(N, C_in, H, W) → (N, C_out, H', W')."""
        return self._conv_forward(x, standardised_weight(self.weight, self.eps), self.bias)


class WSLinear(nn.Linear):
    """A linear layer whose weight is standardised per output unit in every forward."""

    def __init__(self, *args, eps: float = WS_EPS, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """(N, in_features) → (N, out_features)."""
        return F.linear(x, standardised_weight(self.weight, self.eps), self.bias)


def group_count(num_channels: int, groups: int = 32, min_group_size: int = 1) -> int:
    """Group-norm groups for a width: the largest divisor of ``num_channels`` that is at most
    ``groups`` and leaves at least ``min_group_size`` channels per group (1 if none does).

    The paper uses 32 groups; a narrow width not divisible by 32 gets the largest divisor below
    it instead (16 → 16, 24 → 24, 48 → 24, 1024 → 32), so narrow demo networks keep the
    paper's normalisation as closely as their widths allow.
    """
    fits = [g for g in range(1, min(groups, num_channels) + 1)
            if num_channels % g == 0 and num_channels // g >= min_group_size]
    return max(fits, default=1)


def group_norm(num_channels: int, groups: int = 32, min_group_size: int = 1) -> nn.GroupNorm:
    """``nn.GroupNorm`` over ``num_channels`` with ``group_count(...)`` groups (see there)."""
    return nn.GroupNorm(group_count(num_channels, groups, min_group_size), num_channels)


def _norm2d(norm: Norm, channels: int, groups: int) -> nn.Module:
    return group_norm(channels, groups) if norm == "gn" else nn.BatchNorm2d(channels)


def _conv(norm: Norm, c_in: int, c_out: int, kernel: int, stride: int, padding: int,
          eps: float) -> nn.Conv2d:
    """A bias-free convolution: weight-standardised with group norm, plain with batch norm."""
    if norm == "gn":
        return WSConv2d(c_in, c_out, kernel, stride, padding=padding, bias=False, eps=eps)
    return nn.Conv2d(c_in, c_out, kernel, stride, padding=padding, bias=False)


def _hidden_linear(norm: Norm, d_in: int, d_out: int, groups: int, eps: float) -> list[nn.Module]:
    """A hidden MLP layer: WSLinear → GN → ReLU, or Linear → BN → ReLU."""
    if norm == "gn":
        return [WSLinear(d_in, d_out, eps=eps), group_norm(d_out, groups, PROJECTOR_MIN_GROUP),
                nn.ReLU()]
    return [nn.Linear(d_in, d_out), nn.BatchNorm1d(d_out), nn.ReLU()]


def has_batch_norm(model: nn.Module) -> bool:
    """Whether any layer of ``model`` normalises over the samples of its batch."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


class _Block(nn.Module):
    """A residual block of WSConv → GN units (Conv → BN with batch norm): basic (3×3, 3×3) or bottleneck (1×1, 3×3, 1×1,
    expansion 4, stride on the 3×3 as in torchvision). The shortcut is the identity, or a
    1×1 WSConv → GN where the shape changes."""

    def __init__(self, c_in: int, width: int, stride: int, bottleneck: bool, groups: int,
                 eps: float, norm: Norm = "gn") -> None:
        super().__init__()
        c_out = 4 * width if bottleneck else width
        if bottleneck:
            shapes = [(c_in, width, 1, 1), (width, width, 3, stride), (width, c_out, 1, 1)]
        else:
            shapes = [(c_in, width, 3, stride), (width, c_out, 3, 1)]
        self.convs = nn.ModuleList(
            _conv(norm, a, b, k, s, k // 2, eps) for a, b, k, s in shapes
        )
        self.norms = nn.ModuleList(_norm2d(norm, b, groups) for _, b, _, _ in shapes)
        self.shortcut = None
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                _conv(norm, c_in, c_out, 1, stride, 0, eps), _norm2d(norm, c_out, groups)
            )
        self.out_channels = c_out

    def forward(self, x: Tensor) -> Tensor:
        """(N, c_in, H, W) → (N, c_out, H / stride, W / stride)."""
        h = x
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            h = norm(conv(h))
            if i < len(self.convs) - 1:
                h = F.relu(h)
        skip = x if self.shortcut is None else self.shortcut(x)
        return F.relu(h + skip)


class ResNet(nn.Module):
    """A GN+WS residual network (He et al. 2016) that returns globally average-pooled features.

    Args:
        in_channels: image channels (1 for Fashion-MNIST, 3 for CIFAR).
        widths: channels per stage; the first is also the stem's.
        blocks: residual blocks per stage; each stage after the first halves the resolution.
        bottleneck: bottleneck blocks (expansion 4) instead of basic ones.
        imagenet_stem: 7×7 stride-2 conv and 3×3 stride-2 max-pool instead of one 3×3 conv.
        gn_groups: group-norm groups (``group_count``).
        ws_eps: weight-standardisation eps.
        norm: "gn" (WS + group norm, the paper's) or "bn" (plain convolutions, batch norm).

    Attributes:
        feature_dim: channels of the pooled output.
    """

    def __init__(self, in_channels: int, widths: tuple[int, ...], blocks: tuple[int, ...],
                 bottleneck: bool, imagenet_stem: bool, gn_groups: int = 32,
                 ws_eps: float = WS_EPS, norm: Norm = "gn") -> None:
        super().__init__()
        if in_channels < 1 or len(widths) != len(blocks) or min(widths, default=0) < 1:
            raise ValueError(f"ResNet needs in_channels >= 1 and {len(blocks)} positive widths, "
                             f"got in_channels={in_channels}, widths={widths}")
        stem = widths[0]
        kernel, stride = (7, 2) if imagenet_stem else (3, 1)
        units: list[nn.Module] = [
            _conv(norm, in_channels, stem, kernel, stride, kernel // 2, ws_eps),
            _norm2d(norm, stem, gn_groups), nn.ReLU()]
        if imagenet_stem:
            units.append(nn.MaxPool2d(3, 2, padding=1))
        self.stem = nn.Sequential(*units)
        layers, c_in = [], stem
        for i, (width, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                layers.append(_Block(c_in, width, stride, bottleneck, gn_groups, ws_eps, norm))
                c_in = layers[-1].out_channels
        self.layers = nn.Sequential(*layers)
        self.feature_dim = c_in

    def forward(self, x: Tensor) -> Tensor:
        """Images (N, in_channels, H, W) → pooled features (N, feature_dim)."""
        return self.layers(self.stem(x)).mean(dim=(2, 3))


class ResNet14(ResNet):
    """CIFAR-style ResNet with 6n+2 layers, n=2 (He et al. 2016 §4.2): a 3×3 stem conv, three
    stages of two basic blocks with strides 1, 2, 2, global average pooling. The 14th layer is
    the head (projector or classifier) on top. 28×28 inputs end at 7×7, 32×32 at 8×8."""

    def __init__(self, in_channels: int, widths: tuple[int, ...] = RESNET14_WIDTHS,
                 gn_groups: int = 32, ws_eps: float = WS_EPS, norm: Norm = "gn") -> None:
        super().__init__(in_channels, tuple(widths), (2, 2, 2), bottleneck=False,
                         imagenet_stem=False, gn_groups=gn_groups, ws_eps=ws_eps, norm=norm)


class ResNet50(ResNet):
    """ImageNet ResNet50: a 7×7 stride-2 stem conv and max-pool, bottleneck stages [3, 4, 6, 3]
    with expansion 4 (feature_dim = 4 × widths[-1]). 32×32 inputs end at 1×1 maps: group norm
    there normalises over channels alone, which needs several channels per group (64 at the
    paper's widths)."""

    def __init__(self, in_channels: int, widths: tuple[int, ...] = RESNET50_WIDTHS,
                 gn_groups: int = 32, ws_eps: float = WS_EPS, norm: Norm = "gn") -> None:
        super().__init__(in_channels, tuple(widths), (3, 4, 6, 3), bottleneck=True,
                         imagenet_stem=True, gn_groups=gn_groups, ws_eps=ws_eps, norm=norm)


class MLP(nn.Module):
    """A backbone for inputs that are not images: the input flattened, then (WSLinear → GN →
    ReLU) per width ((Linear → BN → ReLU) with batch norm), as the projector's hidden layers.

    Args:
        in_features: the flattened input's size.
        widths: the layers' output widths; the last is ``feature_dim``.
        gn_groups, ws_eps, norm: as for ``ResNet``.
    """

    def __init__(self, in_features: int, widths: tuple[int, ...], gn_groups: int = 32,
                 ws_eps: float = WS_EPS, norm: Norm = "gn") -> None:
        super().__init__()
        if in_features < 1 or not widths or min(widths) < 2:
            raise ValueError(f"MLP needs in_features >= 1 and widths >= 2, got "
                             f"in_features={in_features}, widths={widths}")
        layers: list[nn.Module] = [nn.Flatten()]
        width_in = in_features
        for width in widths:
            layers += _hidden_linear(norm, width_in, width, gn_groups, ws_eps)
            width_in = width
        self.layers = nn.Sequential(*layers)
        self.in_features, self.feature_dim = in_features, widths[-1]

    def forward(self, x: Tensor) -> Tensor:
        """(N, ...) with ``in_features`` values per sample (integers are cast to the weights'
        dtype) → (N, feature_dim)."""
        if not x.is_floating_point():
            x = x.to(self.layers[1].weight.dtype)
        return self.layers(x)


class Projector(nn.Sequential):
    """The projection MLP (paper §4): (WSLinear → GN → ReLU) per hidden layer, or
    (Linear → BN → ReLU) with batch norm, then a plain linear layer without normalisation.
    Hidden group norms keep at least ``PROJECTOR_MIN_GROUP`` channels per group. BYOL's and
    SimSiam's predictor is the same MLP.

    Args:
        in_dim: input features (the backbone's feature_dim).
        dims: output widths of the layers, e.g. (1024, 1024, 1024); the last is ``out_dim``.
        gn_groups: group-norm groups of the hidden layers.
        ws_eps: weight-standardisation eps.
        norm: "gn" or "bn" (``ModelConfig.norm``).
    """

    def __init__(self, in_dim: int, dims: tuple[int, ...], gn_groups: int = 32,
                 ws_eps: float = WS_EPS, norm: Norm = "gn") -> None:
        if len(dims) == 0 or min(dims) < 1 or min(dims[:-1], default=2) < 2:
            raise ValueError(f"Projector dims must be positive, hidden ones >= 2 (a 1-wide "
                             f"group norm outputs a constant), got {dims}")
        layers: list[nn.Module] = []
        width_in = in_dim
        for width in dims[:-1]:
            layers += _hidden_linear(norm, width_in, width, gn_groups, ws_eps)
            width_in = width
        layers.append(nn.Linear(width_in, dims[-1]))
        super().__init__(*layers)
        self.in_dim, self.out_dim = in_dim, dims[-1]


@dataclass(frozen=True)
class Head:
    """What BYOL and SimSiam add to a shared dual encoder (``dcco.methods.predictive``).

    Attributes:
        predictor: the predictor MLP's widths; the last is the projection width d.
        target: where the regression targets come from: "stopgrad", the online projections
            with their gradient stopped (SimSiam); "ema", a moving-average copy of the online
            backbone and projector (BYOL's target network, ``DualEncoder.update_target``).
    """

    predictor: tuple[int, ...]
    target: Literal["stopgrad", "ema"]


class DualEncoder(nn.Module):
    """Encodes a pair of inputs (X, Y) into a pair of encodings (F, G) (paper §3).

    With one tower (``second`` None) both inputs go through the same backbone and projector, in
    one forward pass over the concatenated batch (each view on its own with batch norm, which
    would otherwise normalise the two views together); otherwise Y has its own backbone and
    projector (``backbone2``, ``projector2``).

    With a predictor (BYOL, SimSiam) the encodings are predictions and their targets side by
    side: F = [q(z₁), y₁] and G = [q(z₂), y₂], each (N, 2d), where z are the online
    projections, q the predictor and y the targets: z with its gradient stopped (SimSiam), or
    the target network's projections (BYOL), which take no gradient either. The loss pairs
    q(z₁) with y₂ and q(z₂) with y₁.

    Args:
        backbone, projector: the first tower (the only one when shared). A backbone is any
            module mapping a batch of inputs to (N, feature_dim) features, with a
            ``feature_dim`` attribute (``ResNet``, ``MLP``, or the user's own, e.g. a text
            encoder: docs/multimodal.md).
        second: the second tower's (backbone, projector), or None for a shared network; its
            input may have another shape and kind than the first's.
        predictor: the predictor head, or None.
        target: BYOL's target network, (backbone, projector) copies whose parameters take no
            gradient, or None.
    """

    autocast_dtype: torch.dtype | None = None
    """Training forwards run the backbones under autocast to this dtype (bf16 precision,
    ``dcco.precision``); the projectors, and ``encode``/``features``, stay in the weights'
    dtype."""
    channels_last: bool = False
    """Training forwards feed the backbones NHWC (channels-last) inputs."""
    unit_encodings: bool = False
    """Training forwards return F and G scaled to unit L2 norm per sample: what bounds a
    client's statistics under differential privacy (``dcco.privacy``)."""

    def __init__(self, backbone: nn.Module, projector: Projector,
                 second: tuple[nn.Module, Projector] | None = None,
                 predictor: Projector | None = None,
                 target: tuple[ResNet, Projector] | None = None) -> None:
        super().__init__()
        self.backbone, self.projector = backbone, projector
        self.backbone2 = second[0] if second else None
        self.projector2 = second[1] if second else None
        if second and second[1].out_dim != projector.out_dim:
            raise ValueError(f"DualEncoder towers must project to one dimension, got "
                             f"{projector.out_dim} and {second[1].out_dim}")
        if (predictor is not None or target is not None) and second is not None:
            raise ValueError("a predictor or target network needs a shared dual encoder "
                             "(model.shared = true)")
        if target is not None and predictor is None:
            raise ValueError("a target network comes with a predictor (BYOL)")
        if predictor is not None and (predictor.in_dim, predictor.out_dim) != (
                projector.out_dim, projector.out_dim):
            raise ValueError(f"the predictor must map the projection width "
                             f"{projector.out_dim} to itself, got {predictor.in_dim} → "
                             f"{predictor.out_dim}")
        self.predictor = predictor
        self.target = None
        if target is not None:
            self.target = nn.Sequential(*target)
            self.target.requires_grad_(False)
        self.batch_norm = has_batch_norm(self)
        """Whether a forward normalises over its batch (``ModelConfig.norm = "bn"``)."""

    @property
    def shared(self) -> bool:
        """Whether both inputs go through one network."""
        return self.backbone2 is None

    @property
    def feature_dim(self) -> int:
        """Backbone output width (of the first tower)."""
        return self.backbone.feature_dim

    @property
    def projection_dim(self) -> int:
        """d, the width of the projections (F and G are 2d wide with a predictor)."""
        return self.projector.out_dim

    def _tower(self, tower: int) -> tuple[nn.Module, nn.Module]:
        if tower not in (0, 1):
            raise ValueError(f"DualEncoder tower must be 0 or 1, got {tower!r}")
        if tower == 0 or self.shared:
            return self.backbone, self.projector
        return self.backbone2, self.projector2

    def forward(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor]:
        """Projections of both inputs (with a predictor, predictions and targets).

        Args:
            x1, x2: images (N1, C, H, W) and (N2, C, H, W); with two towers, each its own
                tower's input (shapes and kinds may differ).

        Returns:
            F (N1, d) and G (N2, d); (N1, 2d) and (N2, 2d) with a predictor.
        """
        if not self.shared:
            return (self._unit(self.projector(self._backbone_features(self.backbone, x1))),
                    self._unit(self.projector2(self._backbone_features(self.backbone2, x2))))
        z1, z2 = self._pair(lambda x: self.projector(self._backbone_features(self.backbone, x)),
                            x1, x2)
        if self.predictor is None:
            return self._unit(z1), self._unit(z2)
        q1, q2 = self._pair(self.predictor, z1, z2)
        if self.target is None:
            y1, y2 = z1.detach(), z2.detach()
        else:
            backbone, projector = self.target
            with torch.no_grad():
                y1, y2 = self._pair(lambda x: projector(self._backbone_features(backbone, x)),
                                    x1, x2)
        return (self._unit(torch.cat([q1, y1], dim=1)),
                self._unit(torch.cat([q2, y2], dim=1)))

    def _pair(self, fn, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        """``fn`` of both views: one call on the concatenated batch, or one call per view
        with batch norm (each view normalised on its own, as BYOL and SimSiam do)."""
        if self.batch_norm:
            return fn(a), fn(b)
        out = fn(torch.cat([a, b]))
        return out[: a.shape[0]], out[a.shape[0]:]

    @torch.no_grad()
    def update_target(self, tau: float) -> None:
        """BYOL's target update: ξ ← τ ξ + (1 − τ) θ for every target parameter ξ and its
        online parameter θ (backbone and projector; the target's batch-norm statistics are
        its own)."""
        if self.target is None:
            raise ValueError("this dual encoder has no target network")
        online = [*self.backbone.parameters(), *self.projector.parameters()]
        for xi, theta in zip(self.target.parameters(), online, strict=True):
            xi.lerp_(theta, 1.0 - tau)

    def _unit(self, z: Tensor) -> Tensor:
        return F.normalize(z, dim=1) if self.unit_encodings else z

    def _backbone_features(self, backbone: nn.Module, x: Tensor) -> Tensor:
        """A training forward's backbone features: under autocast to ``autocast_dtype`` if
        set, returned in the weights' dtype for the projector."""
        if self.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.autocast_dtype is None:
            return backbone(x)
        with torch.autocast(x.device.type, dtype=self.autocast_dtype):
            h = backbone(x)
        return h.to(self.projector[-1].weight.dtype)

    def encode(self, x: Tensor, tower: int = 0) -> Tensor:
        """Projections of one input through one tower: (N, C, H, W) → (N, d)."""
        backbone, projector = self._tower(tower)
        return projector(backbone(x))

    def features(self, x: Tensor, tower: int = 0) -> Tensor:
        """Backbone features, the projector discarded (for evaluation): (N, C, H, W) →
        (N, feature_dim)."""
        return self._tower(tower)[0](x)


def check_inputs(cfg: ModelConfig, x_shape: InputShape, y_shape: InputShape | None) -> None:
    """Refuse towers that cannot read their inputs: one shared network for inputs of two
    shapes, or a ResNet tower for inputs that are not (C, H, W).

    Raises:
        ValueError: naming the key to change.
    """
    if cfg.shared and y_shape is not None and _dims(y_shape) != _dims(x_shape):
        raise ValueError(f"one shared network cannot read inputs of shapes {_dims(x_shape)} "
                         f"and {_dims(y_shape)}; set model.shared = false (two towers)")
    for tower, shape in enumerate((x_shape, y_shape)):
        if shape is not None and not (tower == 1 and cfg.shared):
            _check_tower_input(cfg, tower, shape)


def _check_tower_input(cfg: ModelConfig, tower: int, shape: InputShape) -> None:
    """Refuse an input tower ``tower`` cannot read: features (not (C, H, W)) for a ResNet, or
    a channel count alone for an mlp, which needs the whole shape."""
    arch = cfg.tower_arch(tower)
    if arch == "mlp" and isinstance(shape, int):
        raise ValueError("an mlp tower needs its input's full shape, not a channel count")
    if arch != "mlp" and not isinstance(shape, int) and len(_dims(shape)) != 3:
        raise ValueError(f"a {arch} tower reads images (C, H, W), but "
                         f"{'Y' if tower else 'X'} has shape {_dims(shape)}; use "
                         f"model.{'y_' if tower else ''}arch = 'mlp' for features")


def _dims(shape: InputShape) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(shape)


def _initialise(module: nn.Module, gen: torch.Generator) -> None:
    """Initialise every parameter of ``module`` from ``gen``, in module order.

    Convolutions: Kaiming normal, fan-out (He et al. 2015, torchvision's choice). Linears:
    weights and biases uniform in ±1/√fan_in (PyTorch's default scale; weight standardisation
    makes the scale irrelevant for hidden layers, and it keeps the last layer's outputs O(1)).
    Group (or batch) norm: scale 1, shift 0, except the last norm of each residual branch, whose
    scale starts at 0 (Goyal et al. 2017) so every block starts as its shortcut.
    """
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu", generator=gen)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            bound = 1 / math.sqrt(m.in_features)
            nn.init.uniform_(m.weight, -bound, bound, generator=gen)
            if m.bias is not None:
                nn.init.uniform_(m.bias, -bound, bound, generator=gen)
        elif isinstance(m, (nn.GroupNorm, nn.modules.batchnorm._BatchNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    for m in module.modules():  # after the loop above, which visits a block before its norms
        if isinstance(m, _Block):
            nn.init.zeros_(m.norms[-1].weight)


InputShape = int | tuple[int, ...]
"""A tower's input: the shape of one sample (C, H, W) for images or (D, ...) for features,
or, for images, the channel count alone."""


def _resnet(cfg: ModelConfig, shape: InputShape, tower: int = 0) -> ResNet | MLP:
    _check_tower_input(cfg, tower, shape)
    arch, widths, dims = cfg.tower_arch(tower), cfg.tower_widths(tower), _dims(shape)
    # torch's default init draws from the global RNG; ours replaces it, so leave the RNG as found
    with torch.random.fork_rng(devices=[]):
        if arch == "mlp":
            return MLP(math.prod(dims), widths, cfg.gn_groups, cfg.ws_eps, cfg.norm)
        make = ResNet14 if arch == "resnet14" else ResNet50
        return make(dims[0], widths, cfg.gn_groups, cfg.ws_eps, cfg.norm)


def build_backbone(cfg: ModelConfig, in_channels: InputShape, seed: int,
                   tower: int = 0) -> ResNet | MLP:
    """Tower ``tower``'s configured backbone for inputs of ``in_channels`` (a channel count
    or a sample's shape), initialised from the stream ``(seed, "init", "backbone", tower)``.

    The global torch RNG is neither used nor advanced. The dual encoder's tower built from the
    same seed is this network, parameter for parameter.
    """
    net = _resnet(cfg, in_channels, tower)
    _initialise(net, generator(seed, "init", "backbone", tower))
    return net


def build_projector(cfg: ModelConfig, in_dim: int, dims: tuple[int, ...], seed: int,
                    tower: int = 0, name: str = "projector") -> Projector:
    """A projector (or predictor, ``name``) initialised from the stream
    ``(seed, "init", name, tower)``."""
    with torch.random.fork_rng(devices=[]):
        projector = Projector(in_dim, tuple(dims), cfg.gn_groups, cfg.ws_eps, cfg.norm)
    _initialise(projector, generator(seed, "init", name, tower))
    return projector


def build_dual_encoder(cfg: ModelConfig, in_channels: InputShape,
                       projector_dims: tuple[int, ...], seed: int, head: Head | None = None,
                       y_shape: InputShape | None = None) -> DualEncoder:
    """The dual encoder of ``cfg``, initialised reproducibly from ``seed``.

    Each tower's backbone and projector draw from their own stream
    (``(seed, "init", "backbone" | "projector", tower)``), so changing the projector leaves the
    backbone's initialisation unchanged; the global torch RNG is neither used nor advanced.

    Args:
        cfg: the architecture; ``cfg.projector`` is ignored in favour of ``projector_dims``.
        in_channels: the first input's channels, or one sample's shape (``InputShape``).
        projector_dims: the projector widths (the caller resolves the method's default).
        seed: the run seed.
        head: BYOL's or SimSiam's predictor (from ``(seed, "init", "predictor", 0)``) and
            target (BYOL's starts as a copy of the online network), or None.
        y_shape: the second input's, when it differs from the first (paired data, two
            towers); None: ``in_channels``.
    """
    check_inputs(cfg, in_channels, y_shape)
    towers = []
    for tower in range(1 if cfg.shared else 2):
        shape = y_shape if tower == 1 and y_shape is not None else in_channels
        backbone = build_backbone(cfg, shape, seed, tower)
        projector = build_projector(cfg, backbone.feature_dim, projector_dims, seed, tower)
        towers.append((backbone, projector))
    predictor = target = None
    if head is not None:
        predictor = build_projector(cfg, projector_dims[-1], head.predictor, seed, 0,
                                    name="predictor")
        if head.target == "ema":
            target = (copy.deepcopy(towers[0][0]), copy.deepcopy(towers[0][1]))
    return DualEncoder(*towers[0], second=towers[1] if len(towers) > 1 else None,
                       predictor=predictor, target=target)
