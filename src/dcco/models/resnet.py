"""The paper's backbones: GN+WS residual networks (ResNet14 for CIFAR-size images, ResNet50 for
DERM) and an MLP for inputs that are not images."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from dcco.config.model_config import RESNET14_WIDTHS, RESNET50_WIDTHS, WS_EPS, Norm
from dcco.models.layers import _conv, _hidden_linear, _norm2d


class _Block(nn.Module):
    """A residual block of WSConv → GN units (Conv → BN with batch norm, plain Conv with none):
    basic (3×3, 3×3) or bottleneck (1×1, 3×3, 1×1, expansion 4, stride on the 3×3 as in
    torchvision). The shortcut is the identity, or a 1×1 WSConv → GN where the shape
    changes."""

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
        norm: "gn" (WS + group norm, the paper's), "bn" (plain convolutions, batch norm) or
            "none" (plain convolutions).

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
