"""The layers the encoders are built of: weight-standardised convolutions and linears (Qiao et
al. 2019), group norm with the paper's group counts, and the projector MLP (paper §4)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcco.config.model_config import PROJECTOR_MIN_GROUP, WS_EPS, Norm
from dcco.errors import ArgumentError


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
    if norm == "none":
        return nn.Identity()
    return group_norm(channels, groups) if norm == "gn" else nn.BatchNorm2d(channels)


def _conv(norm: Norm, c_in: int, c_out: int, kernel: int, stride: int, padding: int,
          eps: float) -> nn.Conv2d:
    """A bias-free convolution: weight-standardised with group norm, plain otherwise."""
    if norm == "gn":
        return WSConv2d(c_in, c_out, kernel, stride, padding=padding, bias=False, eps=eps)
    return nn.Conv2d(c_in, c_out, kernel, stride, padding=padding, bias=False)


def _hidden_linear(norm: Norm, d_in: int, d_out: int, groups: int, eps: float) -> list[nn.Module]:
    """A hidden MLP layer: WSLinear → GN → ReLU, Linear → BN → ReLU, or Linear → ReLU."""
    if norm == "gn":
        return [WSLinear(d_in, d_out, eps=eps), group_norm(d_out, groups, PROJECTOR_MIN_GROUP),
                nn.ReLU()]
    if norm == "none":
        return [nn.Linear(d_in, d_out), nn.ReLU()]
    return [nn.Linear(d_in, d_out), nn.BatchNorm1d(d_out), nn.ReLU()]


def has_batch_norm(model: nn.Module) -> bool:
    """Whether any layer of ``model`` normalises over the samples of its batch."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


class Projector(nn.Sequential):
    """The projection MLP (paper §4): (WSLinear → GN → ReLU) per hidden layer, (Linear → BN →
    ReLU) with batch norm or (Linear → ReLU) with none, then a plain linear layer.
    Hidden group norms keep at least ``PROJECTOR_MIN_GROUP`` channels per group. BYOL's and
    SimSiam's predictor is the same MLP.

    Args:
        in_dim: input features (the backbone's feature_dim).
        dims: output widths of the layers, e.g. (1024, 1024, 1024); the last is ``out_dim``.
        gn_groups: group-norm groups of the hidden layers.
        ws_eps: weight-standardisation eps.
        norm: "gn", "bn" or "none" (``ModelConfig.norm``).
    """

    def __init__(self, in_dim: int, dims: tuple[int, ...], gn_groups: int = 32,
                 ws_eps: float = WS_EPS, norm: Norm = "gn") -> None:
        if len(dims) == 0 or min(dims) < 1 or min(dims[:-1], default=2) < 2:
            raise ArgumentError(f"projector widths must be positive, hidden ones >= 2 (a 1-wide "
                             f"group norm outputs a constant), got {dims}")
        layers: list[nn.Module] = []
        width_in = in_dim
        for width in dims[:-1]:
            layers += _hidden_linear(norm, width_in, width, gn_groups, ws_eps)
            width_in = width
        layers.append(nn.Linear(width_in, dims[-1]))
        super().__init__(*layers)
        self.in_dim, self.out_dim = in_dim, dims[-1]
