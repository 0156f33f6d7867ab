"""FedSC's backbone: a CIFAR ResNet-20 with Fixup initialisation and no normalisation layer
(Zhang, Dauphin & Ma 2019, "Fixup Initialization: Residual Learning Without Normalization";
the network of Jing et al. 2024's code, ``fixup_models.py``, at widen factor 8).

Fixup replaces normalisation by an initialisation: each residual branch's last convolution
starts at zero (every block starts as its shortcut), its first is He-initialised and scaled by
L^(−1/2) for L residual blocks, and scalar biases before each convolution and activation and a
scalar multiplier per branch take normalisation's place. Nothing mixes samples, so a batch's
outputs are those of its samples one by one, as with the paper's GN+WS networks: the batched
simulator's rounds stay exact.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcco.config.model_config import RESNET20_FIXUP_WIDTHS

FIXUP_BLOCKS = (3, 3, 3)
"""Basic blocks per stage: ResNet-20 (6n + 2 layers, n = 3)."""


class FixupBlock(nn.Module):
    """A Fixup basic block: x + b1a → 3×3 conv → + b1b → ReLU → + b2a → 3×3 conv → × s + b2b,
    added to the shortcut, then ReLU. Where the resolution halves, the shortcut takes every
    second pixel of x + b1a and pads the new channels with zeros (He et al. 2016's option A,
    as Fixup's and FedSC's code).

    Args:
        c_in: input channels.
        width: output channels (at least ``c_in``).
        stride: 1, or 2 to halve the resolution.
    """

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        if width < c_in:
            raise ValueError(f"a Fixup block pads its shortcut with zero channels, so its width "
                             f"({width}) must be at least its input's ({c_in})")
        self.conv1 = nn.Conv2d(c_in, width, 3, stride, padding=1, bias=False)
        self.conv2 = nn.Conv2d(width, width, 3, 1, padding=1, bias=False)
        self.bias1a, self.bias1b, self.bias2a, self.bias2b = (
            nn.Parameter(torch.zeros(1)) for _ in range(4))
        self.scale = nn.Parameter(torch.ones(1))
        self.stride, self.pad = stride, width - c_in

    def forward(self, x: Tensor) -> Tensor:
        """(N, c_in, H, W) → (N, width, H / stride, W / stride)."""
        shifted = x + self.bias1a
        h = F.relu(self.conv1(shifted) + self.bias1b)
        h = self.conv2(h + self.bias2a) * self.scale + self.bias2b
        skip = x
        if self.stride != 1 or self.pad:
            skip = F.pad(shifted[:, :, ::self.stride, ::self.stride],
                         (0, 0, 0, 0, 0, self.pad))
        return F.relu(h + skip)


class FixupResNet20(nn.Module):
    """Fixup ResNet-20 (FedSC's backbone): a 3×3 stem conv, + bias, ReLU, three stages of three
    ``FixupBlock``s with strides 1, 2, 2, global average pooling, + bias. FedSC's classifier
    (``fc``) is replaced by the projector, as in FedSC's pretraining.

    Args:
        in_channels: image channels.
        widths: channels per stage, non-decreasing; the first is also the stem's. Default:
            FedSC's widen factor 8.

    Attributes:
        feature_dim: channels of the pooled output (``widths[-1]``).
        blocks: the residual blocks in order (for the initialisation).
    """

    def __init__(self, in_channels: int, widths: tuple[int, ...] = RESNET20_FIXUP_WIDTHS) -> None:
        super().__init__()
        if in_channels < 1 or len(widths) != len(FIXUP_BLOCKS) or min(widths, default=0) < 1:
            raise ValueError(f"FixupResNet20 needs in_channels >= 1 and 3 positive widths, got "
                             f"in_channels={in_channels}, widths={widths}")
        self.stem = nn.Conv2d(in_channels, widths[0], 3, 1, padding=1, bias=False)
        self.bias1, self.bias2 = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
        blocks, c_in = [], widths[0]
        for i, (width, n) in enumerate(zip(widths, FIXUP_BLOCKS)):
            for j in range(n):
                blocks.append(FixupBlock(c_in, width, 2 if (i > 0 and j == 0) else 1))
                c_in = width
        self.blocks = nn.Sequential(*blocks)
        self.feature_dim = c_in

    def forward(self, x: Tensor) -> Tensor:
        """Images (N, in_channels, H, W) → pooled features (N, feature_dim)."""
        h = F.relu(self.stem(x) + self.bias1)
        return self.blocks(h).mean(dim=(2, 3)) + self.bias2

    @torch.no_grad()
    def fixup_(self) -> None:
        """Fixup's rescaling, after every convolution has been He-initialised (fan-out, as
        ``dcco.models.build`` does): each block's first conv × L^(−1/2) for L blocks (FedSC's
        N(0, 2 / fan_out) · L^(−1/2)), its second conv zero."""
        scale = len(self.blocks) ** -0.5
        for block in self.blocks:
            block.conv1.weight.mul_(scale)
            block.conv2.weight.zero_()
