"""The two views' augmentation: sections ``[augment]`` and ``[augment_y]``
(``dcco.data.augment`` draws them)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class AugmentConfig:
    """Augmentation parameters; BYOL's (Grill et al. 2020, table 6) by default.

    Use ``AugmentConfig.byol()`` for all of BYOL and ``AugmentConfig.cifar()`` for the paper's
    CIFAR pretraining (BYOL without blur).
    """

    crop_scale: tuple[float, float] = (0.08, 1.0)
    """Range of the crop's area as a fraction of the image's, in (0, 1]."""
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    """Range of the crop's aspect ratio width / height (sampled log-uniformly)."""
    flip_p: float = 0.5
    """Probability of a horizontal flip."""
    jitter_p: float = 0.8
    """Probability of colour jitter (brightness, contrast, saturation, hue)."""
    brightness: float = 0.4
    """Brightness factor spread: a factor uniform in [1 − a, 1 + a]."""
    contrast: float = 0.4
    """Contrast factor spread: a factor uniform in [1 − a, 1 + a]."""
    saturation: float = 0.2
    """Saturation factor spread (colour images): a factor uniform in [1 − a, 1 + a]."""
    hue: float = 0.1
    """Maximal hue shift in turns (0.5 = half the colour wheel)."""
    grayscale_p: float = 0.2
    """Probability of grayscale (colour images)."""
    blur_p: tuple[float, float] = (1.0, 0.1)
    """Probability of Gaussian blur for view 0 and view 1."""
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    """Range of the blur's standard deviation, in pixels."""
    solarize_p: tuple[float, float] = (0.0, 0.2)
    """Probability of solarisation (threshold 0.5) for view 0 and view 1."""
    rotate_degrees: float = 0.0
    """Random rotation about the crop's centre by an angle uniform in ±this many degrees
    (the paper's DERM pretraining adds one to BYOL's augmentations; 0: none). The corners it
    uncovers repeat the image's border pixels."""
    enabled: bool = True
    """False: no augmentation, the images only normalised (``eval_view``). Paired data
    (``dcco.data.paired``) configures each modality on its own: ``[augment]`` X with its view-0
    values, ``[augment_y]`` Y with its view-1 values; a modality that is not images takes
    none."""

    def __post_init__(self) -> None:
        for name in ("flip_p", "jitter_p", "grayscale_p"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(
                    f"augment.{name} must be a probability in [0, 1], got {getattr(self, name)}"
                )
        for name in ("blur_p", "solarize_p"):
            value = getattr(self, name)
            if len(value) != 2 or not all(0 <= p <= 1 for p in value):
                raise ValueError(
                    f"augment.{name} must be two probabilities in [0, 1] (view 0, view 1), "
                    f"got {list(value)}"
                )
        for name in ("crop_scale", "crop_ratio", "blur_sigma"):
            value = getattr(self, name)
            if len(value) != 2 or not (0 < value[0] <= value[1] and math.isfinite(value[1])):
                raise ValueError(
                    f"augment.{name} must be an ordered pair [low, high] with 0 < low <= high, "
                    f"got {list(value)}"
                )
        if self.crop_scale[1] > 1:
            raise ValueError(
                f"augment.crop_scale must lie in (0, 1], got {list(self.crop_scale)}"
            )
        for name in ("brightness", "contrast", "saturation"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"augment.{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0 <= self.hue <= 0.5:
            raise ValueError(f"augment.hue must be in [0, 0.5] turns, got {self.hue}")
        if not 0 <= self.rotate_degrees <= 180:
            raise ValueError(f"augment.rotate_degrees must be in [0, 180], got "
                             f"{self.rotate_degrees}")

    @classmethod
    def byol(cls) -> AugmentConfig:
        """All of BYOL's augmentations (Grill et al. 2020, appendix B)."""
        return cls()

    @classmethod
    def cifar(cls) -> AugmentConfig:
        """The paper's CIFAR-100 pretraining: BYOL's augmentations except blur (appendix B)."""
        return cls(blur_p=(0.0, 0.0))
