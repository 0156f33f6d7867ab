"""A ready image augmentation for your own code: ``ImageViews`` makes one augmented view of
each image of a batch (BYOL's crop, flip and colour jitter), for images as your data loader
gives them. ``dcco.fit(..., augment=ImageViews())`` and
``dcco.flower.answer(..., augment=ImageViews())`` take it; ``answer`` uses it by default for
image tensors.

It runs dcco's own batched pipeline (``dcco.data.augment``: one ``grid_sample`` for the crop
and flip of the whole batch, a fused hue rotation), whose ops the tests check against kornia's.
dcco's own runs draw that pipeline's random parameters from counters (a pure function of the
seed, round and sample); this one draws them from torch's random state, which ``dcco.fit`` and
``answer`` seed from the round.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dcco.config import AugmentConfig
from dcco.data.augment import drawn_view


def looks_like_images(x: Tensor) -> bool:
    """Whether ``x`` is a batch of images (N, C, H, W) with 1 or 3 channels, uint8 or
    floating."""
    return (x.ndim == 4 and x.shape[1] in (1, 3) and min(x.shape[2:]) >= 8
            and (x.dtype == torch.uint8 or x.is_floating_point()))


def looks_channels_last(x: Tensor) -> bool:
    """Whether ``x`` looks like a batch of channels-last images (N, H, W, C), 1 or 3
    channels last and not first."""
    return x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3)


class ImageViews(nn.Module):
    """One augmented view of each image of a batch: a random resized crop (area fraction in
    ``crop_scale``) back to the image's size, a horizontal flip, colour jitter with
    probability ``jitter_p`` (brightness and contrast ``jitter``; with 3 channels also
    saturation, and hue 0.1 turns) and, with 3 channels, grayscale with probability 0.2. The
    crop's aspect ratio is log-uniform in [3/4, 4/3], torchvision's.

    Inputs are uint8 (N, C, H, W) images, or floating ones in [0, 1] or normalised to
    [−1, 1] (told apart by their smallest value, or fixed by ``value_range``). A view comes
    back as floats in the input's range, uint8 images as dcco normalises them, (x/255 −
    0.5)/0.5 in [−1, 1].

    Parameters
    ----------
    crop_scale : tuple[float, float] (default: (0.2, 1.0))
        The crop's area fraction, low and high.
    jitter : float (default: 0.4)
        The brightness, contrast (and saturation) factors' spread.
    jitter_p : float (default: 0.8)
        The probability of colour jitter.
    value_range : tuple[float, float] | None (default: None)
        (low, high) of floating inputs; None: [−1, 1] when a batch holds a
        negative value, else [0, 1].
    """

    def __init__(self, crop_scale: tuple[float, float] = (0.2, 1.0), jitter: float = 0.4,
                 jitter_p: float = 0.8, value_range: tuple[float, float] | None = None
                 ) -> None:
        super().__init__()
        if not 0 < crop_scale[0] <= crop_scale[1] <= 1:
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {crop_scale}")
        if not 0 <= jitter <= 1 or not 0 <= jitter_p <= 1:
            raise ValueError(f"jitter and jitter_p must lie in [0, 1], got jitter = {jitter}, "
                             f"jitter_p = {jitter_p}")
        self.crop_scale, self.jitter, self.jitter_p = tuple(crop_scale), jitter, jitter_p
        self.value_range = value_range

    def forward(self, images: Tensor) -> Tensor:
        """(N, C, H, W) → one view of each image, (N, C, H, W) floats."""
        if not looks_like_images(images):
            raise ValueError(f"ImageViews takes images (N, C, H, W) with 1 or 3 channels, "
                             f"got {images.dtype} {tuple(images.shape)}")
        if images.dtype == torch.uint8:
            low, high, out = 0.0, 255.0, (-1.0, 1.0)
        else:
            low, high = self.value_range or ((-1.0, 1.0) if bool(images.min() < 0)
                                             else (0.0, 1.0))
            out = (low, high)
        x = images if images.dtype == torch.uint8 else (images.float() - low) / (high - low)
        colour = images.shape[1] == 3
        config = AugmentConfig(
            crop_scale=self.crop_scale, jitter_p=self.jitter_p, brightness=self.jitter,
            contrast=self.jitter, saturation=self.jitter if colour else 0.0,
            hue=0.1 if colour else 0.0, grayscale_p=0.2 if colour else 0.0,
            blur_p=(0.0, 0.0), solarize_p=(0.0, 0.0))
        x = drawn_view(x, config)
        return x.mul_(out[1] - out[0]).add_(out[0]).to(images.dtype if images.is_floating_point()
                                                   else torch.float32)


__all__ = ["ImageViews", "looks_like_images"]
