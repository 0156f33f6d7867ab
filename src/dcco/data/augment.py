"""BYOL-family augmentations (Grill et al. 2020, appendix B), batched over a whole round.

The pipeline of one view, in BYOL's order (paper appendix B: CIFAR pretraining uses "all the data
augmentations from BYOL except blur"):

1. random resized crop (area fraction in ``crop_scale``, aspect ratio log-uniform in
   ``crop_ratio``, torchvision's ten tries then a centre crop), resized bilinearly back to the
   output size, and a horizontal flip with probability ``flip_p``; with ``rotate_degrees``, a
   random rotation about the crop's centre in the same resampling (the DERM recipe's);
2. colour jitter with probability ``jitter_p``: brightness → contrast → saturation → hue, each
   factor uniform in ``[1 − a, 1 + a]`` (hue: a shift uniform in ``[−hue, hue]`` turns). BYOL
   draws the order of the four at random; here it is fixed;
3. grayscale with probability ``grayscale_p``;
4. Gaussian blur with probability ``blur_p[view]``, σ uniform in ``blur_sigma`` pixels, kernel
   about a tenth of the image side (BYOL: 23 px at 224 px), odd and at least 3;
5. solarisation (``x → 1 − x`` where ``x ≥ 0.5``) with probability ``solarize_p[view]``.

Values are clamped to [0, 1] after every step, as torchvision does. One-channel images
(Fashion-MNIST) get steps 1 and 2's brightness and contrast only: saturation, hue, grayscale
and solarisation are colour operations, and blur is left out with them (BYOL's colour-image
recipe has no one-channel counterpart). Outputs are normalised as ``(x − 0.5) / 0.5`` per
channel, i.e. to [−1, 1]; ``eval_view`` applies the same normalisation.

Randomness. Every random parameter of a sample is ``uniform(seed, round, sample id, view,
slot)``, a counter-based hash (no generator state). A sample therefore gets the same views
whether it is augmented alone (a real client holding three photos) or among a thousand (the
simulator), in any order, and resuming a run needs nothing but the round number. On the CPU
they are bit-identical: every op is per sample and elementwise or a short per-row reduction, so
the batch is also processed in cache-sized chunks. On CUDA the only reduction (the contrast's
image mean) may round differently with the batch size.

Implementation. Each op is checked against its kornia counterpart in the tests, with these
substitutions for speed or for batch invariance: the crop is one ``grid_sample`` whose grid also
does the flip (the sample points of ``kornia.geometry.transform.crop_and_resize``, without its
per-sample 8 × 8 solves); hue is a fused HSV rotation (``kornia.enhance.adjust_hue``, 2-3×
faster); contrast takes its mean row by row (``adjust_contrast_with_mean_subtraction``); the
blur is a sum of shifted copies with kornia's per-sample kernels (``gaussian_blur2d`` with a
(B, 2) σ is a grouped convolution, 2-5× slower at 32 px). An op with probability below one runs
on the samples that drew it only.

Cost: about 0.11 s of one CPU core for both views of 1024 CIFAR images (3 × 32 × 32), 0.02 s
for 1024 Fashion-MNIST images (1 × 28 × 28).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import IntEnum

import kornia
import torch
import torch.nn.functional as F
from torch import Tensor

from dcco.config import AugmentConfig
from dcco.data.counters import uniform, uniforms
from dcco.moved import moved_names

_CPU_CHUNK = 128
"""Samples per chunk on the CPU: keeps each intermediate image tensor inside the cache."""
_FLIP_VIEW = 2
"""The ``view`` index of ``flip_view``'s stream, apart from the two pretraining views."""
CROP_TRIES = 10
"""Crop boxes tried per sample before falling back to a centre crop (torchvision's rule)."""


class Slot(IntEnum):
    """Which random parameter a uniform feeds: the ``slot`` argument of ``uniform``.

    Crop try ``t`` (0 ≤ t < ``CROP_TRIES``) uses slots ``CROP_AREA + t`` and ``CROP_RATIO + t``.
    """

    CROP_AREA = 0
    CROP_RATIO = CROP_TRIES
    CROP_X = 2 * CROP_TRIES
    CROP_Y = 2 * CROP_TRIES + 1
    FLIP = 2 * CROP_TRIES + 2
    JITTER = 2 * CROP_TRIES + 3
    BRIGHTNESS = 2 * CROP_TRIES + 4
    CONTRAST = 2 * CROP_TRIES + 5
    SATURATION = 2 * CROP_TRIES + 6
    HUE = 2 * CROP_TRIES + 7
    GRAYSCALE = 2 * CROP_TRIES + 8
    BLUR = 2 * CROP_TRIES + 9
    BLUR_SIGMA = 2 * CROP_TRIES + 10
    SOLARIZE = 2 * CROP_TRIES + 11
    ROTATION = 2 * CROP_TRIES + 12


_N_SLOTS = Slot.ROTATION + 1


def _crop_boxes(u: Tensor, cfg: AugmentConfig, h: int, w: int) -> Tensor:
    """Random resized crop boxes, torchvision's ``RandomResizedCrop.get_params`` vectorised.

    Sizes are continuous (torchvision rounds them to whole pixels).

    Args:
        u: float64 (``_N_SLOTS``, B) uniforms indexed by ``Slot``.
        cfg: the crop's scale and ratio ranges.
        h, w: the input's height and width, in pixels.

    Returns:
        float64 (B, 4): left, top, width, height in pixels (edges, not pixel centres).
    """
    lo_r, hi_r = math.log(cfg.crop_ratio[0]), math.log(cfg.crop_ratio[1])
    tries = slice(Slot.CROP_AREA, Slot.CROP_AREA + CROP_TRIES)
    area = h * w * (cfg.crop_scale[0] + (cfg.crop_scale[1] - cfg.crop_scale[0]) * u[tries])
    ratio = torch.exp(lo_r + (hi_r - lo_r) * u[Slot.CROP_RATIO:Slot.CROP_RATIO + CROP_TRIES])
    tw, th = torch.sqrt(area * ratio), torch.sqrt(area / ratio)  # (tries, B)
    ok = (tw <= w) & (th <= h)
    first = torch.argmax(ok.to(torch.int8), dim=0, keepdim=True)  # the first valid try
    cw, ch = tw.gather(0, first)[0], th.gather(0, first)[0]
    # No try fits: a centre crop, the whole image with its ratio clamped into crop_ratio.
    fw, fh = float(w), float(h)
    if w / h < cfg.crop_ratio[0]:
        fh = w / cfg.crop_ratio[0]
    elif w / h > cfg.crop_ratio[1]:
        fw = h * cfg.crop_ratio[1]
    found = ok.any(dim=0)
    cw, ch = torch.where(found, cw, fw), torch.where(found, ch, fh)
    x0 = torch.where(found, (w - cw) * u[Slot.CROP_X], (w - cw) / 2)
    y0 = torch.where(found, (h - ch) * u[Slot.CROP_Y], (h - ch) / 2)
    return torch.stack([x0, y0, cw, ch], dim=1)


def _crop_grid(boxes: Tensor, flip: Tensor, h: int, w: int, out_h: int, out_w: int,
               dtype: torch.dtype, angle: Tensor | None = None) -> Tensor:
    """The ``grid_sample`` grid (align_corners=False) that resizes each box to the output.

    Output pixel centre ``j + 0.5`` samples the input at ``left + (j + 0.5) · width / out_w``
    (the same points as ``kornia.geometry.transform.crop_and_resize`` with the box's outermost
    sample points as corners); a flipped sample reads its columns in reverse order. With
    ``angle``, the sample points are rotated about the box's centre (in pixels), so the output
    shows the crop rotated by −angle.

    Args:
        boxes: float64 (B, 4) from ``_crop_boxes``.
        flip: bool (B,).
        h, w: the input's height and width; out_h, out_w: the output's, in pixels.
        dtype: the grid's dtype (coordinates are computed in float64, then rounded).
        angle: float64 (B,) radians, or None for no rotation.

    Returns:
        (B, out_h, out_w, 2) in ``dtype``, coordinates in [−1, 1] of the input.
    """
    cols = torch.arange(out_w, device=boxes.device)
    cols = torch.where(flip[:, None], out_w - 1 - cols, cols).to(torch.float64)  # (B, out_w)
    rows = torch.arange(out_h, device=boxes.device, dtype=torch.float64)
    x0, y0, cw, ch = boxes.unbind(1)
    b = boxes.shape[0]
    if angle is not None:
        px = x0[:, None] + (cols + 0.5) * (cw / out_w)[:, None]  # (B, out_w) pixels
        py = y0[:, None] + (rows + 0.5) * (ch / out_h)[:, None]  # (B, out_h)
        dx = (px - (x0 + cw / 2)[:, None])[:, None, :]  # (B, 1, out_w)
        dy = (py - (y0 + ch / 2)[:, None])[:, :, None]  # (B, out_h, 1)
        cos, sin = torch.cos(angle)[:, None, None], torch.sin(angle)[:, None, None]
        gx = (x0 + cw / 2)[:, None, None] + cos * dx - sin * dy
        gy = (y0 + ch / 2)[:, None, None] + sin * dx + cos * dy
        return torch.stack([gx * (2 / w) - 1, gy * (2 / h) - 1], dim=-1).to(dtype)
    sx = (x0[:, None] + (cols + 0.5) * (cw / out_w)[:, None]) * (2 / w) - 1  # (B, out_w)
    sy = (y0[:, None] + (rows + 0.5) * (ch / out_h)[:, None]) * (2 / h) - 1  # (B, out_h)
    sx, sy = sx.to(dtype), sy.to(dtype)
    return torch.stack([sx[:, None, :].expand(b, out_h, out_w),
                        sy[:, :, None].expand(b, out_h, out_w)], dim=-1)


# ------------------------------------------------------------------------------ colour


def _shift_hue(x: Tensor, turns: Tensor) -> Tensor:
    """Rotate the HSV hue of RGB images, ``kornia.enhance.adjust_hue`` fused (2-3× faster).

    RGB → (hue, max, chroma) → RGB with the hue moved; value and HSV saturation are kept, so
    ``max`` and ``min`` of each pixel are too. With hue ``H`` in sextants and chroma
    ``C = max − min``, channel n ∈ {R: 5, G: 3, B: 1} is ``max − C · clamp(min(k, 4 − k), 0, 1)``
    with ``k = (n + H) mod 6``.

    Args:
        x: (B, 3, H, W) in [0, 1].
        turns: (B,) shifts in turns of the colour wheel (kornia's radians / 2π).

    Returns:
        (B, 3, H, W) in [0, 1].
    """
    r, g, b = x.unbind(1)
    hi = torch.maximum(torch.maximum(r, g), b)
    chroma = hi - torch.minimum(torch.minimum(r, g), b)
    # Which channel is the maximum, as 0/1 weights (kornia's tie-breaking: r, then g, then b);
    # multiply-adds, because torch.where is several times slower than arithmetic on the CPU.
    r_max = ((r >= g) & (r >= b)).to(x.dtype)
    b_max = (b > g).to(x.dtype).mul_(1 - r_max)
    g_max = 1 - r_max - b_max
    # hue · chroma in sextants: g − b, b − r + 2C or r − g + 4C by the maximal channel
    num = (g - b).mul_(r_max)
    num.addcmul_(torch.add(b - r, chroma, alpha=2), g_max)
    num.addcmul_(torch.add(r - g, chroma, alpha=4), b_max)
    sextant = num.div_(chroma.clamp(min=torch.finfo(x.dtype).tiny))  # grey pixels: num = 0
    sextant += (6 * turns).to(x.dtype)[:, None, None]
    n = torch.arange(5, 0, -2, dtype=x.dtype, device=x.device)[None, :, None, None]  # 5, 3, 1
    k = sextant[:, None] + n  # (B, 3, H, W)
    k.sub_(torch.floor_(k / 6).mul_(6))  # mod 6; 3× faster than torch.remainder on the CPU
    weight = torch.minimum(k, 4 - k).clamp_(0, 1)
    return weight.mul_(-chroma[:, None]).add_(hi[:, None])


def _factor(u: Tensor, amount: float) -> Tensor:
    """Jitter factors uniform in [1 − amount, 1 + amount]: float64 (B,) from uniforms (B,)."""
    return 1 - amount + 2 * amount * u


def _adjust_contrast(x: Tensor, factor: Tensor) -> Tensor:
    """``kornia.enhance.adjust_contrast_with_mean_subtraction``, with the image mean taken row
    by row so that no reduction is split across threads (a split sum rounds differently for a
    lone large image than inside a batch)."""
    gray = kornia.color.rgb_to_grayscale(x) if x.shape[1] == 3 else x
    mean = gray.mean(dim=-1, keepdim=True).mean(dim=-2, keepdim=True)  # (B, 1, 1, 1)
    f = factor[:, None, None, None]
    return (x * f + mean * (1 - f)).clamp_(0, 1)


def _jitter(x: Tensor, brightness: Tensor, contrast: Tensor, saturation: Tensor,
            hue: Tensor) -> Tensor:
    """Colour jitter with torchvision's definitions, in the order brightness → contrast →
    saturation → hue: brightness scales, contrast blends with the grayscale mean, saturation
    with the grayscale image, hue rotates in HSV. One-channel images skip saturation and hue.

    Args:
        x: (B, C, H, W) in [0, 1].
        brightness, contrast, saturation: float64 (B,) factors (1 = unchanged).
        hue: float64 (B,) shifts in turns (0 = unchanged).

    Returns:
        (B, C, H, W) in [0, 1].
    """
    x = kornia.enhance.adjust_brightness_accumulative(x, brightness.to(x.dtype))
    x = _adjust_contrast(x, contrast.to(x.dtype))
    if x.shape[1] == 3:
        x = kornia.enhance.adjust_saturation_with_gray_subtraction(x, saturation.to(x.dtype))
        x = _shift_hue(x, hue).clamp_(0, 1)
    return x


def blur_kernel_size(height: int, width: int) -> int:
    """Gaussian kernel size for an image: about a tenth of its shorter side, odd, at least 3.

    BYOL uses 23 pixels at 224 × 224; this gives 23 there and 3 at 32 × 32.
    """
    return max(3, round(0.1 * min(height, width)) | 1)


def _blur(x: Tensor, sigma: Tensor) -> Tensor:
    """Gaussian blur of each image with its own σ: ``kornia.filters.gaussian_blur2d`` with a
    (B, 2) σ and reflect padding, as per-sample multiply-adds of shifted copies.

    Grouped convolution with one group per image (kornia's way) is 2-5× slower at 32 px, and
    its algorithm, hence its rounding, may depend on the batch size; this is elementwise.

    Args:
        x: (B, C, H, W) in [0, 1].
        sigma: (B,) standard deviations in pixels.

    Returns:
        (B, C, H, W) in [0, 1].
    """
    h, w = x.shape[-2:]
    k = blur_kernel_size(h, w)
    weights = kornia.filters.get_gaussian_kernel1d(k, sigma.to(x.dtype)[:, None])  # (B, k)
    weights = weights[:, :, None, None, None]
    for dim, size in ((-1, w), (-2, h)):
        pad = (k // 2, k // 2, 0, 0) if dim == -1 else (0, 0, k // 2, k // 2)
        padded = F.pad(x, pad, mode="reflect")
        x = padded.narrow(dim, 0, size) * weights[:, 0]
        for t in range(1, k):
            x.addcmul_(padded.narrow(dim, t, size), weights[:, t])
    return x.clamp_(0, 1)


def _grayscale(x: Tensor) -> Tensor:
    """RGB → grayscale (ITU-R 601 luma, as torchvision), kept as three equal channels."""
    return kornia.color.rgb_to_grayscale(x).repeat(1, 3, 1, 1)


def _solarize(x: Tensor) -> Tensor:
    """BYOL's solarisation: ``x`` below 0.5, ``1 − x`` from 0.5 up (``kornia.enhance.solarize``)."""
    return torch.where(x < 0.5, x, 1 - x)


# ---------------------------------------------------------------------------- the views


def _apply(mask: Tensor, op: Callable[..., Tensor], x: Tensor, *params: Tensor) -> Tensor:
    """``op(x, *params)`` on the samples where ``mask`` (B,) holds, computed on those only.

    Every op here is per sample, so computing it on a subset changes no bit of the result.
    ``x`` is overwritten: it must be an intermediate of the pipeline.

    Off the CPU, the op runs on every sample and ``mask`` selects (``_apply_all``): finding
    the subset (``nonzero``, ``mask.all()``) would make the host wait for the device at
    every op, and a GPU gains nothing from the smaller batch.
    """
    if x.device.type != "cpu":
        return _apply_all(mask, op, x, *params)
    if bool(mask.all()):
        return op(x, *params)
    idx = mask.nonzero()[:, 0]
    if idx.numel() == 0:
        return x
    return x.index_copy_(0, idx, op(x[idx], *(p[idx] for p in params)))


def _apply_all(mask: Tensor, op: Callable[..., Tensor], x: Tensor, *params: Tensor) -> Tensor:
    """``_apply`` without a host synchronisation: ``op`` on every sample, kept where ``mask``
    holds. The same values as ``_apply``, since every op is per sample."""
    out = op(x, *params)  # no op here writes to its input
    return torch.where(mask.view(-1, *([1] * (x.ndim - 1))), out, x)


def _render(images: Tensor, grid: Tensor, u: Tensor, view: int, cfg: AugmentConfig) -> Tensor:
    """Steps 1-5 of the module docs for a chunk of images.

    Args:
        images: uint8 (B, C, H, W), or floating in [0, 1] (``drawn_view``'s).
        grid: (B, out_h, out_w, 2) from ``_crop_grid`` in the output dtype.
        u: float64 (``_N_SLOTS``, B) uniforms indexed by ``Slot``.
        view: 0 or 1 (selects ``blur_p`` and ``solarize_p``).
        cfg: the augmentation parameters.

    Returns:
        (B, C, out_h, out_w) in [0, 1], in ``grid``'s dtype.
    """
    x = images.to(grid.dtype) / 255 if images.dtype == torch.uint8 else images.to(grid.dtype)
    x = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    x = x.clamp_(0, 1)
    factors = (_factor(u[Slot.BRIGHTNESS], cfg.brightness), _factor(u[Slot.CONTRAST], cfg.contrast),
               _factor(u[Slot.SATURATION], cfg.saturation), (2 * u[Slot.HUE] - 1) * cfg.hue)
    x = _apply(u[Slot.JITTER] < cfg.jitter_p, _jitter, x, *factors)
    if x.shape[1] == 3:
        x = _apply(u[Slot.GRAYSCALE] < cfg.grayscale_p, _grayscale, x)
        sigma = cfg.blur_sigma[0] + (cfg.blur_sigma[1] - cfg.blur_sigma[0]) * u[Slot.BLUR_SIGMA]
        x = _apply(u[Slot.BLUR] < cfg.blur_p[view], _blur, x, sigma)
        x = _apply(u[Slot.SOLARIZE] < cfg.solarize_p[view], _solarize, x)
    return x


def _check_batch(images: Tensor, sample_ids: Tensor | None, dtype: torch.dtype) -> None:
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(
            f"images must be uint8 (B, C, H, W) with C = 1 or 3, got {images.dtype} "
            f"{tuple(images.shape)}"
        )
    if sample_ids is not None and (sample_ids.shape != images.shape[:1]
                                   or sample_ids.is_floating_point()):
        raise ValueError(
            f"sample_ids must be integers of shape ({images.shape[0]},), one per image, got "
            f"{sample_ids.dtype} {tuple(sample_ids.shape)}"
        )
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")


def augment_view(images: Tensor, sample_ids: Tensor, seed: int, round_index: int, view: int,
                 cfg: AugmentConfig, dtype: torch.dtype = torch.float32, *,
                 size: tuple[int, int] | None = None) -> Tensor:
    """One augmented view of each image: ``augment_pair``'s view ``view`` (0 or 1) alone."""
    _check_batch(images, sample_ids, dtype)
    if view not in (0, 1):
        raise ValueError(f"view must be 0 or 1, got {view}")
    h, w = images.shape[2:]
    if size is not None and (len(size) != 2 or min(size) < 1):
        raise ValueError(f"size must be (height, width) in positive pixels, got {size}")
    out_h, out_w = (h, w) if size is None else size
    u = uniforms(seed, round_index, sample_ids.to(images.device), view, range(_N_SLOTS))
    return _view(images, u, view, cfg, dtype, out_h, out_w).sub_(0.5).div_(0.5)


def drawn_view(images: Tensor, cfg: AugmentConfig, dtype: torch.dtype = torch.float32,
               generator: torch.Generator | None = None) -> Tensor:
    """One augmented view of each image, its random parameters drawn from torch's random
    state (or ``generator``) instead of the counters: the same batched pipeline for code that
    seeds torch itself (``dcco.ImageViews``).

    Args:
        images: (B, C, H, W), C = 1 or 3: uint8, or floating in [0, 1].
        cfg: the augmentation parameters (view 0's blur and solarisation).

    Returns:
        (B, C, H, W) in [0, 1], in ``dtype``.
    """
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"images must be (B, C, H, W) with C = 1 or 3, got "
                         f"{tuple(images.shape)}")
    u = torch.rand((_N_SLOTS, images.shape[0]), dtype=torch.float64, generator=generator,
                   device=images.device)
    return _view(images, u, 0, cfg, dtype, *images.shape[2:])


def _view(images: Tensor, u: Tensor, view: int, cfg: AugmentConfig, dtype: torch.dtype,
          out_h: int, out_w: int) -> Tensor:
    """Steps 1-5 for a batch from its uniforms ``u`` (``_N_SLOTS``, B), chunked on the CPU:
    (B, C, out_h, out_w) in [0, 1]."""
    b, c, h, w = images.shape
    flip = u[Slot.FLIP] < cfg.flip_p
    angle = (math.radians(cfg.rotate_degrees) * (2 * u[Slot.ROTATION] - 1)
             if cfg.rotate_degrees else None)
    grid = _crop_grid(_crop_boxes(u, cfg, h, w), flip, h, w, out_h, out_w, dtype, angle)
    out = torch.empty((b, c, out_h, out_w), dtype=dtype, device=images.device)
    step = _CPU_CHUNK if images.device.type == "cpu" else max(b, 1)
    for i in range(0, b, step):
        j = min(i + step, b)
        out[i:j] = _render(images[i:j], grid[i:j], u[:, i:j], view, cfg)
    return out


def augment_pair(images: Tensor, sample_ids: Tensor, seed: int, round_index: int,
                 cfg: AugmentConfig, dtype: torch.dtype = torch.float32, *,
                 size: tuple[int, int] | None = None) -> tuple[Tensor, Tensor]:
    """The two augmented views of a batch of images (BYOL's pipeline; see the module docs).

    Each sample's views depend only on (seed, round_index, its sample id, view), never on the
    rest of the batch.

    Args:
        images: uint8 (B, C, H, W), C = 1 or 3, on any device.
        sample_ids: integer (B,), each image's index in its data set (keys its randomness).
        seed: the augmentation stream's seed, in [0, 2⁶⁴).
        round_index: the round, in [0, 2⁶⁴); each round gets fresh views.
        cfg: the augmentation parameters.
        dtype: the output's floating dtype.
        size: output (height, width) in pixels; default the input's.

    Returns:
        Views 0 and 1, each (B, C, *size) in ``dtype`` on ``images``' device, normalised as
        ``(x − 0.5) / 0.5`` to [−1, 1].
    """
    return (augment_view(images, sample_ids, seed, round_index, 0, cfg, dtype, size=size),
            augment_view(images, sample_ids, seed, round_index, 1, cfg, dtype, size=size))


def is_image(samples: Tensor) -> bool:
    """Whether stored samples are images that dcco augments and normalises: uint8
    (B, C, H, W) with C = 1 or 3. Anything else is features."""
    return samples.dtype == torch.uint8 and samples.ndim == 4 and samples.shape[1] in (1, 3)


def model_input(samples: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Stored samples as a tower's input, without augmentation: images (``is_image``)
    normalised as ``eval_view`` does, floating features cast to ``dtype``, integer features
    (token ids, counts) as they are: the ``mlp`` backbone casts them to its weights' dtype."""
    if is_image(samples):
        return eval_view(samples, dtype)
    return samples.to(dtype) if samples.is_floating_point() else samples


def modality_view(samples: Tensor, sample_ids: Tensor, seed: int, round_index: int, view: int,
                  cfg: AugmentConfig, dtype: torch.dtype = torch.float32,
                  section: str = "augment") -> Tensor:
    """One modality's training input: its view ``view`` augmented by ``cfg`` (images), or
    ``model_input`` when ``cfg.enabled`` is false.

    Raises:
        ValueError: augmentation asked of samples that are not uint8 images (names
            ``section``, the config section that asked).
    """
    if not cfg.enabled:
        return model_input(samples, dtype)
    if not is_image(samples):
        raise ValueError(f"{section}.enabled = true augments images, but this modality holds "
                         f"{samples.dtype} samples of shape {tuple(samples.shape[1:])}; set "
                         f"{section}.enabled = false")
    return augment_view(samples, sample_ids, seed, round_index, view, cfg, dtype)


def training_views(x: Tensor, y: Tensor | None, sample_ids: Tensor, seed: int, round_index: int,
                   cfg: AugmentConfig, cfg_y: AugmentConfig,
                   dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """The two inputs of a round's samples: with ``y`` None, two augmented views of the
    images ``x`` (``augment_pair``; ``cfg_y`` unused); with pairs, X's view 0 by ``cfg`` and
    Y's view 1 by ``cfg_y`` (``modality_view``).

    Args:
        x, y: the data set's samples (all of them), on one device; y None for images.
        sample_ids: the round's sample ids, on that device.
        seed, round_index: as for ``augment_pair``.
    """
    if y is None:
        if not cfg.enabled:
            view = model_input(x[sample_ids], dtype)
            return view, view.clone()
        return augment_pair(x[sample_ids], sample_ids, seed, round_index, cfg, dtype)
    return (modality_view(x[sample_ids], sample_ids, seed, round_index, 0, cfg, dtype),
            modality_view(y[sample_ids], sample_ids, seed, round_index, 1, cfg_y, dtype,
                          "augment_y"))


def eval_view(images: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """No augmentation: uint8 (B, C, H, W) → (B, C, H, W) in ``dtype``, normalised to [−1, 1]."""
    _check_batch(images, None, dtype)
    return (images.to(dtype) / 255 - 0.5) / 0.5


def flip_view(images: Tensor, sample_ids: Tensor, seed: int, round_index: int,
              dtype: torch.dtype = torch.float32) -> Tensor:
    """A random horizontal flip (probability 0.5) and nothing else, normalised like ``eval_view``.

    The paper's supervised-finetuning augmentation (appendix B: "during supervised finetuning we
    only used flip"). Its coin is ``uniform(seed, round_index, id, 2, Slot.FLIP)``: a stream of its
    own, apart from ``augment_pair``'s views 0 and 1.

    Args:
        images: uint8 (B, C, H, W).
        sample_ids: integer (B,).
        seed, round_index: as for ``augment_pair``.
        dtype: the output's floating dtype.

    Returns:
        (B, C, H, W) in ``dtype``.
    """
    _check_batch(images, sample_ids, dtype)
    flip = uniform(seed, round_index, sample_ids.to(images.device), _FLIP_VIEW, Slot.FLIP) < 0.5
    x = eval_view(images, dtype)
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


__getattr__ = moved_names(__name__)  # old names of dcco.config's classes, warned
