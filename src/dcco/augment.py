"""BYOL-family augmentations (Grill et al. 2020, appendix B), batched over a whole round.

Every random parameter of a sample is a counter-based hash of (seed, round, sample id, view,
slot) rather than a draw from a stateful generator. So a sample gets bit-identical views
whether it is augmented alone (a real client holding three photos) or inside the round's batch
of a thousand (the simulator), and resuming a run needs no generator state. The random resized
crop and the flip are one bilinear resampling (``grid_sample``); colour, blur and solarisation use
kornia's batched ops with per-sample factors.

One-channel images (Fashion-MNIST) get crop, flip and brightness/contrast jitter only: saturation,
hue, grayscale and solarisation are colour operations. Colour jitter is applied in the fixed
order brightness → contrast → saturation → hue (BYOL randomises the order).

Outputs are float tensors normalised as (x − 0.5) / 0.5, in [−1, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import kornia
import torch
import torch.nn.functional as F
from torch import Tensor

_M32 = 0xFFFFFFFF


@dataclass(frozen=True)
class AugmentConfig:
    """Augmentation parameters, BYOL's by default (``byol()``); ``cifar()`` drops blur (paper)."""

    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    jitter_p: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.2
    hue: float = 0.1
    grayscale_p: float = 0.2
    blur_p: tuple[float, float] = (1.0, 0.1)
    """Probability of Gaussian blur for view 1 and view 2."""
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    solarize_p: tuple[float, float] = (0.0, 0.2)
    """Probability of solarisation (threshold 0.5) for view 1 and view 2."""

    def __post_init__(self) -> None:
        for name in ("flip_p", "jitter_p", "grayscale_p"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"augment.{name} must be a probability in [0, 1], "
                                 f"got {getattr(self, name)}")
        for name in ("blur_p", "solarize_p"):
            if not all(0 <= p <= 1 for p in getattr(self, name)):
                raise ValueError(f"augment.{name} must be two probabilities in [0, 1], "
                                 f"got {list(getattr(self, name))}")
        for name, low in (("crop_scale", 0.0), ("crop_ratio", 0.0), ("blur_sigma", 0.0)):
            a, b = getattr(self, name)
            if not low < a <= b:
                raise ValueError(f"augment.{name} must be an ordered pair of positive numbers "
                                 f"[low, high], got {[a, b]}")
        if self.crop_scale[1] > 1:
            raise ValueError(f"augment.crop_scale must lie in (0, 1], got {list(self.crop_scale)}")
        for name in ("brightness", "contrast", "saturation"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"augment.{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.hue <= 0.5:
            raise ValueError(f"augment.hue must be in [0, 0.5], got {self.hue}")

    @classmethod
    def byol(cls) -> AugmentConfig:
        """All of BYOL's augmentations."""
        return cls()

    @classmethod
    def cifar(cls) -> AugmentConfig:
        """The paper's CIFAR-100 pretraining: BYOL's augmentations except blur."""
        return cls(blur_p=(0.0, 0.0))


# ------------------------------------------------------------------ counter-based randomness


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x · c) mod 2³² for x < 2³², without overflowing signed 64-bit arithmetic."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _mix32(x: Tensor) -> Tensor:
    """lowbias32 (C. Wellons): a bijective 32-bit integer hash with good avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform(seed: int, round_index: int, sample_ids: Tensor, view: int, slot: int) -> Tensor:
    """Uniform [0, 1) float64 numbers, one per sample, a pure function of all arguments.

    Args:
        seed: up to 63 bits.
        round_index: the round (or step) number.
        sample_ids: int64 (B,), data-set indices.
        view: 0 or 1.
        slot: which random parameter (each op uses its own slots).
    """
    ids = sample_ids.to(torch.int64)
    h = _mix32((ids & _M32) ^ 0x9E3779B9)
    for word in ((ids >> 32) & _M32, (view << 16) | slot, round_index & _M32,
                 (round_index >> 32) & _M32, seed & _M32, (seed >> 32) & _M32):
        h = _mix32(h ^ word ^ 0x85EBCA6B)
    return h.to(torch.float64) / 2.0**32


# ------------------------------------------------------------------------------ the ops


def _crop_flip_grid(u: list[Tensor], flip: Tensor, cfg: AugmentConfig, h: int, w: int,
                    dtype: torch.dtype) -> Tensor:
    """Sampling grid of a random resized crop (torchvision's rule, 10 tries) plus a flip.

    Args:
        u: 30 uniform tensors (B,): area, log-ratio and unused pairs for 10 tries.
        flip: bool (B,).

    Returns:
        (B, h, w, 2) normalised coordinates for ``grid_sample`` (align_corners=False).
    """
    area = h * w
    lo_r, hi_r = math.log(cfg.crop_ratio[0]), math.log(cfg.crop_ratio[1])
    cw = torch.full_like(u[0], float(w))
    ch = torch.full_like(u[0], float(h))
    found = torch.zeros_like(u[0], dtype=torch.bool)
    for t in range(10):
        target = area * (cfg.crop_scale[0] + (cfg.crop_scale[1] - cfg.crop_scale[0]) * u[2 * t])
        ratio = torch.exp(lo_r + (hi_r - lo_r) * u[2 * t + 1])
        tw, th = torch.sqrt(target * ratio), torch.sqrt(target / ratio)
        ok = (~found) & (tw <= w) & (th <= h)
        cw, ch = torch.where(ok, tw, cw), torch.where(ok, th, ch)
        found = found | ok
    x0 = (w - cw) * u[20]
    y0 = (h - ch) * u[21]
    # output pixel centre j → source x0 + (j + 0.5)·cw/w; normalised to [−1, 1] of the input.
    grid_x = (torch.arange(w, dtype=torch.float64) + 0.5) / w  # (w,)
    grid_y = (torch.arange(h, dtype=torch.float64) + 0.5) / h
    grid_x = torch.where(flip[:, None], 1 - grid_x[None], grid_x[None])
    sx = (x0[:, None] + grid_x * cw[:, None]) / w * 2 - 1  # (B, w)
    sy = (y0[:, None] + grid_y[None] * ch[:, None]) / h * 2 - 1  # (B, h)
    b = sx.shape[0]
    grid = torch.stack([sx[:, None, :].expand(b, h, w), sy[:, :, None].expand(b, h, w)], -1)
    return grid.to(dtype)


def _blend(a: Tensor, b: Tensor, factor: Tensor) -> Tensor:
    """factor·a + (1 − factor)·b, clamped to [0, 1] (torchvision's colour blending)."""
    return (factor * a + (1 - factor) * b).clamp(0, 1)


def _gray(x: Tensor) -> Tensor:
    return kornia.color.rgb_to_grayscale(x) if x.shape[1] == 3 else x


def _jitter(x: Tensor, u: list[Tensor], cfg: AugmentConfig) -> Tensor:
    """Brightness, contrast (all images), saturation and hue (colour images) with factors in u."""
    def factor(v: Tensor, amount: float) -> Tensor:
        return (1 - amount + 2 * amount * v).to(x.dtype)[:, None, None, None]

    x = (x * factor(u[0], cfg.brightness)).clamp(0, 1)
    mean = _gray(x).mean(dim=(1, 2, 3), keepdim=True)
    x = _blend(x, mean, factor(u[1], cfg.contrast))
    if x.shape[1] == 3:
        x = _blend(x, _gray(x), factor(u[2], cfg.saturation))
        shift = ((2 * u[3] - 1) * cfg.hue * 2 * math.pi).to(x.dtype)
        x = kornia.enhance.adjust_hue(x, shift).clamp(0, 1)
    return x


def _blur(x: Tensor, sigma: Tensor) -> Tensor:
    """Gaussian blur with a kernel of about a tenth of the image side (BYOL: 23 px at 224)."""
    side = min(x.shape[-2:])
    k = max(3, round(0.1 * side) | 1)
    sig = sigma.to(x.dtype)[:, None].expand(-1, 2).contiguous()
    return kornia.filters.gaussian_blur2d(x, (k, k), sig, border_type="reflect")


def _where(mask: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return torch.where(mask[:, None, None, None], a, b)


def normalise(x: Tensor) -> Tensor:
    """[0, 1] → [−1, 1]."""
    return (x - 0.5) / 0.5


def augment_view(images: Tensor, sample_ids: Tensor, seed: int, round_index: int,
                 view: int, cfg: AugmentConfig, dtype: torch.dtype = torch.float32) -> Tensor:
    """One augmented view of each image; see ``augment_pair``."""
    if images.dtype != torch.uint8 or images.ndim != 4:
        raise ValueError(f"images must be uint8 (B, C, H, W), got {images.dtype} "
                         f"{tuple(images.shape)}")
    _b, c, h, w = images.shape
    u = [uniform(seed, round_index, sample_ids, view, s).to(images.device) for s in range(40)]
    x = images.to(dtype) / 255.0
    grid = _crop_flip_grid(u[:30], u[30] < cfg.flip_p, cfg, h, w, dtype)
    x = F.grid_sample(x, grid.to(images.device), mode="bilinear", padding_mode="border",
                      align_corners=False).clamp(0, 1)
    x = _where(u[31] < cfg.jitter_p, _jitter(x, u[32:36], cfg), x)
    if c == 3:
        x = _where(u[36] < cfg.grayscale_p, _gray(x).expand(-1, 3, -1, -1), x)
        if cfg.blur_p[view] > 0:
            sigma = cfg.blur_sigma[0] + (cfg.blur_sigma[1] - cfg.blur_sigma[0]) * u[37]
            x = _where(u[38] < cfg.blur_p[view], _blur(x, sigma), x)
        if cfg.solarize_p[view] > 0:
            x = _where(u[39] < cfg.solarize_p[view], torch.where(x >= 0.5, 1 - x, x), x)
    return normalise(x)


def augment_pair(images: Tensor, sample_ids: Tensor, seed: int, round_index: int,
                 cfg: AugmentConfig, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """The two augmented views of a batch of images.

    Args:
        images: uint8 (B, C, H, W), on any device.
        sample_ids: int64 (B,), each image's index in its data set (keys its randomness).
        seed: the augmentation stream's seed.
        round_index: the round; each round gets fresh views.
        cfg: the augmentation parameters.
        dtype: output dtype.

    Returns:
        Two (B, C, H, W) tensors in ``dtype``, normalised to [−1, 1].
    """
    return (augment_view(images, sample_ids, seed, round_index, 0, cfg, dtype),
            augment_view(images, sample_ids, seed, round_index, 1, cfg, dtype))


def eval_view(images: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """No augmentation: uint8 (B, C, H, W) → normalised float."""
    return normalise(images.to(dtype) / 255.0)


def flip_view(images: Tensor, sample_ids: Tensor, seed: int, round_index: int,
              dtype: torch.dtype = torch.float32) -> Tensor:
    """Random horizontal flip only (the paper's supervised finetuning augmentation)."""
    flip = uniform(seed, round_index, sample_ids, 0, 0).to(images.device) < 0.5
    x = eval_view(images, dtype)
    return _where(flip, x.flip(-1), x)
