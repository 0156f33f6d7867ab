"""Encoders of the paper (§4): ResNets with weight standardisation and group norm, a projector
MLP, and the dual encoder that pairs them.

Every convolution and every hidden projector layer is weight-standardised (Qiao et al. 2019)
and followed by group norm (Wu & He 2018) with 32 groups; the last projection layer is a plain
linear layer. Neither operation mixes samples, so a batch's outputs are exactly the outputs of
its samples run one by one — what lets the simulator run all of a round's clients in one batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcco.seeding import generator

DEFAULT_WIDTHS = {"resnet14": (64, 128, 256), "resnet50": (64, 128, 256, 512)}


@dataclass(frozen=True)
class ModelConfig:
    """The encoder architecture (paper §4)."""

    arch: Literal["resnet14", "resnet50"] = "resnet14"
    widths: tuple[int, ...] | None = None
    """Channels per stage; None → resnet14 (64, 128, 256), resnet50 (64, 128, 256, 512)."""
    projector: tuple[int, ...] | None = None
    """Projector widths; None → the method's paper default ([1024]*3 CCO, [256, 256, 128] NT-Xent)."""
    shared: bool = True
    """One network for both inputs (the paper's self-supervised setting) or two towers."""
    gn_groups: int = 32
    ws_eps: float = 1e-5
    """Added to the weight variance in weight standardisation."""

    def __post_init__(self) -> None:
        stages = len(DEFAULT_WIDTHS[self.arch])
        if self.widths is not None and (
            len(self.widths) != stages or any(w < 1 for w in self.widths)
        ):
            raise ValueError(
                f"model.widths must be {stages} positive integers for {self.arch}, "
                f"got {list(self.widths)}"
            )
        if self.projector is not None and (
            len(self.projector) == 0 or any(w < 1 for w in self.projector)
        ):
            raise ValueError(f"model.projector must be positive widths, got {self.projector}")
        if self.gn_groups < 1:
            raise ValueError(f"model.gn_groups must be >= 1, got {self.gn_groups}")
        if not self.ws_eps > 0:
            raise ValueError(f"model.ws_eps must be > 0, got {self.ws_eps}")

    @property
    def stage_widths(self) -> tuple[int, ...]:
        return self.widths or DEFAULT_WIDTHS[self.arch]


def _standardise(weight: Tensor, eps: float) -> Tensor:
    """(W − mean) / √(var + eps) over everything but the output unit."""
    dims = tuple(range(1, weight.ndim))
    mean = weight.mean(dim=dims, keepdim=True)
    var = weight.var(dim=dims, keepdim=True, unbiased=False)
    return (weight - mean) / torch.sqrt(var + eps)


class WSConv2d(nn.Conv2d):
    """A convolution with weight standardisation (Qiao et al. 2019)."""

    def __init__(self, *args, eps: float = 1e-5, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, _standardise(self.weight, self.eps), self.bias, self.stride,
                        self.padding, self.dilation, self.groups)


class WSLinear(nn.Linear):
    """A linear layer with weight standardisation per output unit."""

    def __init__(self, *args, eps: float = 1e-5, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, _standardise(self.weight, self.eps), self.bias)


def gn_groups(num_channels: int, groups: int = 32, min_group_size: int = 1) -> int:
    """The largest divisor of ``num_channels`` that is at most ``groups`` and leaves at least
    ``min_group_size`` channels per group (32 groups, fewer for narrow widths)."""
    return max(g for g in range(1, min(groups, num_channels) + 1)
               if num_channels % g == 0 and num_channels // g >= min(min_group_size, num_channels))


def group_norm(num_channels: int, groups: int = 32, min_group_size: int = 1) -> nn.GroupNorm:
    return nn.GroupNorm(gn_groups(num_channels, groups, min_group_size), num_channels)


PROJECTOR_MIN_GROUP = 8
"""Channels per group-norm group in the projector, at least. A projector's activations are
vectors, so a group of one channel would normalise every entry to zero; the paper's widths
(1024 and 256 with 32 groups) give 32 and 8 channels per group, and narrow test projectors
keep that floor of 8 by using fewer groups."""


class _Block(nn.Module):
    """Conv → GN (→ ReLU) units; the basic or bottleneck residual block."""

    def __init__(self, c_in: int, width: int, stride: int, bottleneck: bool, groups: int,
                 eps: float) -> None:
        super().__init__()
        c_out = 4 * width if bottleneck else width
        if bottleneck:
            shapes = [(c_in, width, 1, 1), (width, width, 3, stride), (width, c_out, 1, 1)]
        else:
            shapes = [(c_in, width, 3, stride), (width, c_out, 3, 1)]
        self.convs = nn.ModuleList(
            WSConv2d(a, b, k, s, padding=k // 2, bias=False, eps=eps) for a, b, k, s in shapes
        )
        self.norms = nn.ModuleList(group_norm(b, groups) for _, b, _, _ in shapes)
        self.shortcut = None
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                WSConv2d(c_in, c_out, 1, stride, bias=False, eps=eps), group_norm(c_out, groups)
            )

    def forward(self, x: Tensor) -> Tensor:
        h = x
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            h = norm(conv(h))
            if i < len(self.convs) - 1:
                h = F.relu(h)
        skip = x if self.shortcut is None else self.shortcut(x)
        return F.relu(h + skip)


class ResNet(nn.Module):
    """A GN+WS residual network returning pooled features (N, feature_dim)."""

    def __init__(self, in_channels: int, widths: tuple[int, ...], blocks: tuple[int, ...],
                 bottleneck: bool, imagenet_stem: bool, groups: int = 32,
                 eps: float = 1e-5) -> None:
        super().__init__()
        stem = widths[0]
        if imagenet_stem:
            self.stem = nn.Sequential(
                WSConv2d(in_channels, stem, 7, 2, padding=3, bias=False, eps=eps),
                group_norm(stem, groups), nn.ReLU(), nn.MaxPool2d(3, 2, padding=1))
        else:
            self.stem = nn.Sequential(
                WSConv2d(in_channels, stem, 3, 1, padding=1, bias=False, eps=eps),
                group_norm(stem, groups), nn.ReLU())
        layers, c_in = [], stem
        for i, (width, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                layers.append(_Block(c_in, width, stride, bottleneck, groups, eps))
                c_in = 4 * width if bottleneck else width
        self.layers = nn.Sequential(*layers)
        self.feature_dim = c_in

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(self.stem(x)).mean(dim=(2, 3))


def resnet14(in_channels: int, widths: tuple[int, ...] = DEFAULT_WIDTHS["resnet14"],
             groups: int = 32, eps: float = 1e-5) -> ResNet:
    """CIFAR-style ResNet (6n+2, n=2): 3×3 stem, three stages of two basic blocks, strides 1, 2, 2."""
    return ResNet(in_channels, widths, (2, 2, 2), False, False, groups, eps)


def resnet50(in_channels: int, widths: tuple[int, ...] = DEFAULT_WIDTHS["resnet50"],
             groups: int = 32, eps: float = 1e-5) -> ResNet:
    """ImageNet ResNet50: 7×7 stride-2 stem and max-pool, bottleneck stages [3, 4, 6, 3]."""
    return ResNet(in_channels, widths, (3, 4, 6, 3), True, True, groups, eps)


class Projector(nn.Sequential):
    """MLP: (WSLinear → GN → ReLU) per hidden layer, then a plain linear layer (paper §4)."""

    def __init__(self, in_dim: int, dims: tuple[int, ...], groups: int = 32,
                 eps: float = 1e-5) -> None:
        layers: list[nn.Module] = []
        for width in dims[:-1]:
            layers += [WSLinear(in_dim, width, eps=eps),
                       group_norm(width, groups, PROJECTOR_MIN_GROUP), nn.ReLU()]
            in_dim = width
        layers.append(nn.Linear(in_dim, dims[-1]))
        super().__init__(*layers)


class DualEncoder(nn.Module):
    """Encodes a pair of inputs into a pair of encodings (F, G).

    With ``shared`` towers both inputs go through one network, in one forward pass over the
    concatenated batch; otherwise each input has its own backbone and projector.
    """

    def __init__(self, backbone: nn.Module, projector: nn.Module,
                 second: tuple[nn.Module, nn.Module] | None = None) -> None:
        super().__init__()
        self.backbone, self.projector = backbone, projector
        self.backbone2 = second[0] if second else None
        self.projector2 = second[1] if second else None

    @property
    def shared(self) -> bool:
        return self.backbone2 is None

    @property
    def feature_dim(self) -> int:
        return self.backbone.feature_dim

    def forward(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor]:
        """Projections of both inputs: (N, d) each."""
        if self.shared:
            z = self.projector(self.backbone(torch.cat([x1, x2])))
            return z[: x1.shape[0]], z[x1.shape[0]:]
        return self.projector(self.backbone(x1)), self.projector2(self.backbone2(x2))

    def features(self, x: Tensor, tower: int = 0) -> Tensor:
        """Backbone features (N, feature_dim), the projector discarded (for evaluation)."""
        backbone = self.backbone if tower == 0 or self.shared else self.backbone2
        return backbone(x)


def _initialise(module: nn.Module, gen: torch.Generator) -> None:
    """Kaiming-normal convolutions, LeCun-uniform-like linears, GN scale 1 and shift 0.

    The last GN of each residual branch starts at zero (Goyal et al. 2017), so every block
    starts as the identity.
    """
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu", generator=gen)
        elif isinstance(m, nn.Linear):
            bound = 1 / math.sqrt(m.in_features)
            nn.init.uniform_(m.weight, -bound, bound, generator=gen)
            if m.bias is not None:
                nn.init.uniform_(m.bias, -bound, bound, generator=gen)
        elif isinstance(m, nn.GroupNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    for m in module.modules():
        if isinstance(m, _Block):
            nn.init.zeros_(m.norms[-1].weight)


def build_backbone(cfg: ModelConfig, in_channels: int, seed: int, tower: int = 0) -> ResNet:
    """The configured ResNet, initialised from ``(seed, "init", tower)``."""
    make = resnet14 if cfg.arch == "resnet14" else resnet50
    with torch.random.fork_rng(devices=[]):  # torch's own default init must not move the RNG
        net = make(in_channels, cfg.stage_widths, cfg.gn_groups, cfg.ws_eps)
    _initialise(net, generator(seed, "init", "backbone", tower))
    return net


def build_dual_encoder(cfg: ModelConfig, in_channels: int, projector_dims: tuple[int, ...],
                       seed: int) -> DualEncoder:
    """The dual encoder, initialised reproducibly from ``seed`` without the global RNG."""
    towers = []
    for tower in range(1 if cfg.shared else 2):
        backbone = build_backbone(cfg, in_channels, seed, tower)
        with torch.random.fork_rng(devices=[]):
            projector = Projector(backbone.feature_dim, tuple(projector_dims), cfg.gn_groups,
                                  cfg.ws_eps)
        _initialise(projector, generator(seed, "init", "projector", tower))
        towers.append((backbone, projector))
    return DualEncoder(*towers[0], second=towers[1] if len(towers) > 1 else None)
