"""Augmentations: a per-sample kornia reference, batch invariance, the hash, each op's switch."""

from __future__ import annotations

import math

import kornia
import numpy as np
import pytest
import torch

from dcco.config import AugmentConfig
from dcco.data.augment import (
    CROP_TRIES,
    Slot,
    _blur,
    _crop_boxes,
    _shift_hue,
    augment_pair,
    augment_view,
    blur_kernel_size,
    eval_view,
    flip_view,
    uniform,
    uniforms,
)

HALF = AugmentConfig(flip_p=0.5, jitter_p=0.5, grayscale_p=0.5, blur_p=(0.5, 0.5),
                     solarize_p=(0.5, 0.5))
"""Every op on about half of the samples, so batches mix samples with and without each op."""
OFF = {"crop_scale": (1.0, 1.0), "crop_ratio": (1.0, 1.0), "flip_p": 0.0, "jitter_p": 0.0,
       "grayscale_p": 0.0, "blur_p": (0.0, 0.0), "solarize_p": (0.0, 0.0)}
"""Keyword arguments of an AugmentConfig that does nothing."""


def _images(n: int = 8, c: int = 3, size: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, c, size, size), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))


def _reference_view(image: torch.Tensor, sample_id: int, seed: int, round_index: int,
                    view: int, cfg: AugmentConfig) -> torch.Tensor:
    """One sample's view, transcribed from the module docs with kornia's ops, in float64."""
    ids = torch.tensor([sample_id])

    def u(slot: int) -> float:
        return float(uniform(seed, round_index, ids, view, slot)[0])

    c, h, w = image.shape
    x = image[None].double() / 255
    # 1. random resized crop (torchvision's rule with continuous sizes) and flip
    log_r = [math.log(r) for r in cfg.crop_ratio]
    for t in range(CROP_TRIES):
        area = h * w * (cfg.crop_scale[0] + (cfg.crop_scale[1] - cfg.crop_scale[0])
                        * u(Slot.CROP_AREA + t))
        ratio = math.exp(log_r[0] + (log_r[1] - log_r[0]) * u(Slot.CROP_RATIO + t))
        cw, ch = math.sqrt(area * ratio), math.sqrt(area / ratio)
        if cw <= w and ch <= h:
            x0, y0 = (w - cw) * u(Slot.CROP_X), (h - ch) * u(Slot.CROP_Y)
            break
    else:
        cw = min(w, h * cfg.crop_ratio[1])
        ch = min(h, cw / cfg.crop_ratio[0])
        x0, y0 = (w - cw) / 2, (h - ch) / 2
    # the outermost sample points, in pixel-index coordinates
    left, right = x0 + 0.5 * cw / w - 0.5, x0 + (w - 0.5) * cw / w - 0.5
    top, bottom = y0 + 0.5 * ch / h - 0.5, y0 + (h - 0.5) * ch / h - 0.5
    box = torch.tensor([[[left, top], [right, top], [right, bottom], [left, bottom]]],
                       dtype=torch.float64)
    x = kornia.geometry.transform.crop_and_resize(x, box, (h, w), mode="bilinear",
                                                  padding_mode="border", align_corners=True)
    if u(Slot.FLIP) < cfg.flip_p:
        x = x.flip(-1)
    # 2. colour jitter
    if u(Slot.JITTER) < cfg.jitter_p:
        def factor(slot: int, amount: float) -> torch.Tensor:
            return torch.tensor([1 - amount + 2 * amount * u(slot)], dtype=torch.float64)

        x = kornia.enhance.adjust_brightness_accumulative(x, factor(Slot.BRIGHTNESS,
                                                                    cfg.brightness))
        x = kornia.enhance.adjust_contrast_with_mean_subtraction(
            x, factor(Slot.CONTRAST, cfg.contrast))
        if c == 3:
            x = kornia.enhance.adjust_saturation_with_gray_subtraction(
                x, factor(Slot.SATURATION, cfg.saturation))
            shift = (2 * u(Slot.HUE) - 1) * cfg.hue * 2 * math.pi
            x = kornia.enhance.adjust_hue(x, torch.tensor([shift], dtype=torch.float64))
    if c == 3:
        # 3-5. grayscale, blur, solarisation
        if u(Slot.GRAYSCALE) < cfg.grayscale_p:
            x = kornia.color.rgb_to_grayscale(x).expand(-1, 3, -1, -1)
        if u(Slot.BLUR) < cfg.blur_p[view]:
            sigma = cfg.blur_sigma[0] + (cfg.blur_sigma[1] - cfg.blur_sigma[0]) * u(Slot.BLUR_SIGMA)
            k = blur_kernel_size(h, w)
            x = kornia.filters.gaussian_blur2d(x, (k, k), torch.tensor([[sigma, sigma]]),
                                               border_type="reflect")
        if u(Slot.SOLARIZE) < cfg.solarize_p[view]:
            x = kornia.enhance.solarize(x, 0.5)
    return ((x - 0.5) / 0.5)[0]


# ------------------------------------------------------------------------ golden reference


@pytest.mark.parametrize("channels,size,cfg", [
    (3, 16, HALF),
    (3, 40, HALF),  # a 5-tap blur kernel
    (3, 16, AugmentConfig.byol()),
    (1, 16, HALF),
    (3, 16, AugmentConfig(crop_scale=(0.9, 1.0), crop_ratio=(2.5, 3.0))),  # centre fallback
])
def test_augment_pair__equals_per_sample_kornia_reference(channels, size, cfg):
    imgs, ids = _images(n=8, c=channels, size=size), torch.arange(100, 108)
    views = augment_pair(imgs, ids, 5, 11, cfg, torch.float64)
    for view in (0, 1):
        for i in range(8):
            ref = _reference_view(imgs[i], int(ids[i]), 5, 11, view, cfg)
            torch.testing.assert_close(views[view][i], ref, atol=1e-6, rtol=0)


def test_augment_pair__reference_fixture_exercises_every_op():
    """The HALF fixture above switches every op on for some samples and off for others."""
    ids = torch.arange(100, 108)
    for slot in (Slot.FLIP, Slot.JITTER, Slot.GRAYSCALE, Slot.BLUR, Slot.SOLARIZE):
        coins = torch.cat([uniform(5, 11, ids, view, slot) for view in (0, 1)]) < 0.5
        assert 0 < int(coins.sum()) < 16, slot.name


# --------------------------------------------------------------------- batch invariance


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cfg", [AugmentConfig.byol(), HALF], ids=["byol", "half"])
def test_augment_pair__batch_invariant(channels, dtype, cfg):
    """Alone, in a shuffled sub-batch or in a batch spanning several CPU chunks: same bits."""
    imgs = _images(n=300, c=channels, size=12)
    ids = torch.randperm(10_000, generator=torch.Generator().manual_seed(1))[:300]
    a, b = augment_pair(imgs, ids, 7, 3, cfg, dtype)
    pick = torch.tensor([299, 5, 128, 127, 0, 200])
    a2, b2 = augment_pair(imgs[pick], ids[pick], 7, 3, cfg, dtype)
    assert torch.equal(a2, a[pick]) and torch.equal(b2, b[pick])
    for i in (0, 127, 128, 299):
        one_a, one_b = augment_pair(imgs[i:i + 1], ids[i:i + 1], 7, 3, cfg, dtype)
        assert torch.equal(one_a, a[i:i + 1]) and torch.equal(one_b, b[i:i + 1])


def test_augment_view__is_one_of_the_pair():
    imgs, ids = _images(), torch.arange(8)
    a, b = augment_pair(imgs, ids, 1, 2, HALF)
    assert torch.equal(augment_view(imgs, ids, 1, 2, 0, HALF), a)
    assert torch.equal(augment_view(imgs, ids, 1, 2, 1, HALF), b)


def test_augment_pair__reproducible_and_fresh_per_round_seed_and_view():
    imgs, ids = _images(), torch.arange(8)
    cfg = AugmentConfig.byol()
    a, b = augment_pair(imgs, ids, 1, 2, cfg)
    assert torch.equal(a, augment_pair(imgs, ids, 1, 2, cfg)[0])
    for other in (b, augment_pair(imgs, ids, 1, 3, cfg)[0], augment_pair(imgs, ids, 2, 2, cfg)[0],
                  augment_pair(imgs, ids + 1, 1, 2, cfg)[0]):
        assert all(not torch.equal(a[i], other[i]) for i in range(8))


# ------------------------------------------------------------------ shapes and switches


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_augment_pair__shapes_dtype_and_range(channels, dtype):
    imgs = _images(c=channels, size=20)
    for size, expected in ((None, (8, channels, 20, 20)), ((12, 16), (8, channels, 12, 16))):
        a, b = augment_pair(imgs, torch.arange(8), 0, 0, HALF, dtype, size=size)
        for v in (a, b):
            assert v.shape == expected and v.dtype == dtype and v.device == imgs.device
            assert v.min() >= -1 and v.max() <= 1


@pytest.mark.parametrize("channels", [1, 3])
def test_augment_pair__everything_off_is_the_eval_view(channels):
    imgs = _images(c=channels)
    for dtype in (torch.float32, torch.float64):
        a, b = augment_pair(imgs, torch.arange(8), 0, 0, AugmentConfig(**OFF), dtype)
        torch.testing.assert_close(a, eval_view(imgs, dtype), atol=1e-6, rtol=0)
        torch.testing.assert_close(b, eval_view(imgs, dtype), atol=1e-6, rtol=0)


@pytest.mark.parametrize("channels", [1, 3])
def test_augment_pair__full_crop_with_certain_flip_is_the_mirror_image(channels):
    cfg = AugmentConfig(**{**OFF, "flip_p": 1.0})
    imgs = _images(c=channels)
    a, b = augment_pair(imgs, torch.arange(8), 0, 0, cfg, torch.float64)
    mirror = eval_view(imgs, torch.float64).flip(-1)
    torch.testing.assert_close(a, mirror, atol=1e-12, rtol=0)
    torch.testing.assert_close(b, mirror, atol=1e-12, rtol=0)


def test_augment_pair__one_channel_images_skip_colour_ops():
    """Only colour ops switched on (and certain): a one-channel image passes unchanged."""
    cfg = AugmentConfig(**{**OFF, "jitter_p": 1.0, "brightness": 0.0, "contrast": 0.0,
                           "saturation": 0.5, "hue": 0.5, "grayscale_p": 1.0,
                           "blur_p": (1.0, 1.0), "solarize_p": (1.0, 1.0)})
    gray = _images(c=1)
    for v in augment_pair(gray, torch.arange(8), 0, 0, cfg, torch.float64):
        torch.testing.assert_close(v, eval_view(gray, torch.float64), atol=1e-12, rtol=0)
    rgb = _images(c=3)
    assert not torch.allclose(augment_pair(rgb, torch.arange(8), 0, 0, cfg)[0], eval_view(rgb))


def test_augment_pair__certain_grayscale_gives_equal_channels_of_luma():
    cfg = AugmentConfig(**{**OFF, "grayscale_p": 1.0})
    imgs = _images()
    a, _ = augment_pair(imgs, torch.arange(8), 0, 0, cfg, torch.float64)
    luma = kornia.color.rgb_to_grayscale(imgs.double() / 255) * 2 - 1
    torch.testing.assert_close(a, luma.expand(-1, 3, -1, -1), atol=1e-12, rtol=0)


def test_augment_pair__blur_and_solarize_follow_their_view_probability():
    """blur_p and solarize_p are per view: (1, 0) changes view 0 only."""
    imgs = _images()
    plain = eval_view(imgs, torch.float64)
    for field in ("blur_p", "solarize_p"):
        cfg = AugmentConfig(**{**OFF, field: (1.0, 0.0)})
        a, b = augment_pair(imgs, torch.arange(8), 0, 0, cfg, torch.float64)
        assert all(not torch.allclose(a[i], plain[i]) for i in range(8)), field
        torch.testing.assert_close(b, plain, atol=1e-12, rtol=0)
    cfg = AugmentConfig(**{**OFF, "solarize_p": (1.0, 0.0)})
    a, _ = augment_pair(imgs, torch.arange(8), 0, 0, cfg, torch.float64)
    x = imgs.double() / 255
    torch.testing.assert_close(a, torch.where(x < 0.5, x, 1 - x) * 2 - 1, atol=1e-12, rtol=0)


def test_augment_pair__rejects_bad_inputs():
    imgs = _images()
    cfg = AugmentConfig.byol()
    with pytest.raises(ValueError, match="uint8"):
        augment_pair(imgs.float(), torch.arange(8), 0, 0, cfg)
    with pytest.raises(ValueError, match="C = 1 or 3"):
        augment_pair(imgs[:, :2], torch.arange(8), 0, 0, cfg)
    with pytest.raises(ValueError, match="sample_ids"):
        augment_pair(imgs, torch.arange(7), 0, 0, cfg)
    with pytest.raises(ValueError, match="dtype"):
        augment_pair(imgs, torch.arange(8), 0, 0, cfg, torch.int32)
    with pytest.raises(ValueError, match="round_index"):
        augment_pair(imgs, torch.arange(8), 0, -1, cfg)


# --------------------------------------------------------------------------- the pieces


def _torchvision_mean_crop_fraction(n: int = 20_000) -> float:
    """Mean area fraction of BYOL's crops on a square image, by torchvision's rule (numpy)."""
    rng = np.random.default_rng(0)
    total = 0.0
    for _ in range(n):
        for _ in range(CROP_TRIES):
            area = rng.uniform(0.08, 1.0)
            ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            if math.sqrt(area * ratio) <= 1 and math.sqrt(area / ratio) <= 1:
                total += area
                break
        else:
            total += 1.0
    return total / n


def test_crop_boxes__inside_the_image_within_scale_and_ratio():
    cfg = AugmentConfig.byol()
    u = uniforms(3, 0, torch.arange(4096), 0, range(Slot.SOLARIZE + 1))
    x0, y0, cw, ch = _crop_boxes(u, cfg, 32, 32).unbind(1)
    assert (x0 >= 0).all() and (y0 >= 0).all()
    assert (x0 + cw <= 32).all() and (y0 + ch <= 32).all()
    fraction, ratio = cw * ch / 32**2, cw / ch
    assert (fraction >= 0.08 - 1e-12).all() and (fraction <= 1 + 1e-12).all()
    assert (ratio >= 3 / 4 - 1e-12).all() and (ratio <= 4 / 3 + 1e-12).all()
    # torchvision's rejection of boxes that stick out lowers the mean area below 0.54
    assert float(fraction.mean()) == pytest.approx(_torchvision_mean_crop_fraction(), abs=0.02)
    # a ratio no try can fit falls back to the centred, ratio-clamped box
    wide = AugmentConfig(crop_scale=(0.9, 1.0), crop_ratio=(2.0, 2.0))
    boxes = _crop_boxes(u[:, :4], wide, 32, 32)
    torch.testing.assert_close(boxes, torch.tensor([[0.0, 8.0, 32.0, 16.0]] * 4,
                                                   dtype=torch.float64))


def test_shift_hue__equals_kornia_adjust_hue():
    x = torch.rand(16, 3, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x[0] = x[0, :1]  # grey: no hue
    x[1, :, :4] = (x[1, :, :4] * 2).round() / 2  # ties between channels
    x[2, 0], x[2, 1] = 1.0, 0.0  # saturated colours
    turns = torch.linspace(-0.5, 0.5, 16, dtype=torch.float64)
    ref = kornia.enhance.adjust_hue(x, turns * 2 * math.pi)
    torch.testing.assert_close(_shift_hue(x, turns), ref, atol=1e-7, rtol=0)


@pytest.mark.parametrize("size", [16, 64])
def test_blur__equals_kornia_gaussian_blur2d_with_per_sample_sigma(size):
    x = torch.rand(5, 3, size, size, dtype=torch.float64,
                   generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.1, 0.5, 1.0, 1.5, 2.0], dtype=torch.float64)
    k = blur_kernel_size(size, size)
    ref = kornia.filters.gaussian_blur2d(x, (k, k), sigma[:, None].expand(-1, 2),
                                         border_type="reflect")
    torch.testing.assert_close(_blur(x, sigma), ref, atol=1e-12, rtol=0)


def test_blur_kernel_size__a_tenth_of_the_side_odd_at_least_3():
    assert blur_kernel_size(224, 224) == 23  # BYOL
    assert blur_kernel_size(32, 32) == 3 and blur_kernel_size(28, 28) == 3
    assert blur_kernel_size(96, 128) == 11
    assert all(blur_kernel_size(s, s) % 2 == 1 for s in range(1, 300))


# --------------------------------------------------------------------------- the hash


def test_uniform__looks_uniform_and_never_collides():
    n = 100_000
    u = uniform(2**62 + 12345, 7, torch.arange(n), view=1, slot=3)
    assert u.dtype == torch.float64 and u.shape == (n,)
    assert u.min() >= 0 and u.max() < 1
    assert abs(float(u.mean()) - 0.5) < 0.003
    assert abs(float(u.var()) - 1 / 12) < 0.001
    hist = torch.histc(u, bins=20, min=0, max=1)
    assert (hist / (n / 20) - 1).abs().max() < 0.05
    assert torch.unique(u).numel() == n  # a bijection of the id: no collisions at all


def test_uniform__every_key_part_changes_the_stream():
    ids = torch.arange(10_000)
    base = uniform(2**40 + 5, 2**33 + 9, ids, 0, 0)
    variants = [
        uniform(5, 2**33 + 9, ids, 0, 0),  # seed's high half only
        uniform(2**40 + 6, 2**33 + 9, ids, 0, 0),  # seed's low half only
        uniform(2**40 + 5, 9, ids, 0, 0),  # round's high half only
        uniform(2**40 + 5, 2**33 + 8, ids, 0, 0),
        uniform(2**40 + 5, 2**33 + 9, ids, 1, 0),  # view
        uniform(2**40 + 5, 2**33 + 9, ids, 0, 1),  # slot
        uniform(2**40 + 5, 2**33 + 9, ids + 2**32, 0, 0),  # id's high half only
    ]
    for other in variants:
        assert float((other == base).double().mean()) < 0.001
        assert abs(float(torch.corrcoef(torch.stack([base, other]))[0, 1])) < 0.05
    neighbours = torch.corrcoef(torch.stack([base[:-1], base[1:]]))[0, 1]
    assert abs(float(neighbours)) < 0.05


def test_uniform__seed_up_to_2_64_and_rejects_out_of_range():
    ids = torch.arange(4)
    assert not torch.equal(uniform(2**64 - 1, 0, ids, 0, 0), uniform(2**63 - 1, 0, ids, 0, 0))
    for name, value in (("seed", -1), ("seed", 2**64), ("round_index", -1), ("view", 2**16),
                        ("slot", 2**16)):
        args = {"seed": 0, "round_index": 0, "sample_ids": ids, "view": 0, "slot": 0}
        with pytest.raises(ValueError, match=name):
            uniform(**(args | {name: value}))


def test_uniforms__rows_are_uniform_per_slot():
    ids = torch.tensor([3, 1, 2**40, 7])
    rows = uniforms(9, 4, ids, 1, [0, 5, 31])
    for row, slot in zip(rows, (0, 5, 31)):
        assert torch.equal(row, uniform(9, 4, ids, 1, slot))


# ----------------------------------------------------------------- eval and finetune views


@pytest.mark.parametrize("channels", [1, 3])
def test_eval_view__maps_0_and_255_to_minus_one_and_one(channels):
    imgs = torch.tensor([0, 255, 51], dtype=torch.uint8).view(3, 1, 1, 1).expand(-1, channels,
                                                                                  2, 2)
    x = eval_view(imgs, torch.float64)
    assert x.shape == (3, channels, 2, 2) and x.dtype == torch.float64
    torch.testing.assert_close(x[:, 0, 0, 0], torch.tensor([-1.0, 1.0, -0.6], dtype=torch.float64))


def test_flip_view__flips_about_half_reproducibly_and_nothing_else():
    imgs, ids = _images(n=64, size=6), torch.arange(64)
    x = flip_view(imgs, ids, 0, 0)
    plain = eval_view(imgs)
    flipped = torch.tensor([torch.equal(x[i], plain[i].flip(-1)) for i in range(64)])
    assert all(bool(f) or torch.equal(x[i], plain[i]) for i, f in enumerate(flipped))
    assert 16 < int(flipped.sum()) < 48
    assert torch.equal(x, flip_view(imgs, ids, 0, 0))
    assert torch.equal(x[10:11], flip_view(imgs[10:11], ids[10:11], 0, 0))
    assert not torch.equal(x, flip_view(imgs, ids, 0, 1))


# --------------------------------------------------------------------------- the config


@pytest.mark.parametrize("field,value", [
    ("flip_p", 1.5), ("jitter_p", -0.1), ("grayscale_p", 2.0),
    ("blur_p", (0.5, 1.5)), ("solarize_p", (-1.0, 0.0)), ("blur_p", (0.5,)),
    ("crop_scale", (0.9, 0.1)), ("crop_scale", (0.0, 1.0)), ("crop_scale", (0.5, 1.5)),
    ("crop_ratio", (2.0, 1.0)), ("blur_sigma", (0.0, 1.0)),
    ("brightness", 1.5), ("contrast", -0.1), ("saturation", 2.0), ("hue", 0.6),
])
def test_augment_config__validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"augment.{field}"):
        AugmentConfig(**{field: value})


def test_augment_config__presets():
    assert AugmentConfig.byol() == AugmentConfig()
    assert AugmentConfig.byol().blur_p == (1.0, 0.1)
    assert AugmentConfig.byol().solarize_p == (0.0, 0.2)
    assert AugmentConfig.cifar() == AugmentConfig(blur_p=(0.0, 0.0))


def test_rotation__a_quarter_turn_of_the_whole_image_is_rot90_and_none_changes_nothing():
    from dcco.data.augment import _crop_grid

    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (3, 2, 8, 8), generator=gen, dtype=torch.uint8)
    boxes = torch.tensor([[0.0, 0.0, 8.0, 8.0]] * 3, dtype=torch.float64)
    flip = torch.zeros(3, dtype=torch.bool)
    angle = torch.full((3,), math.pi / 2, dtype=torch.float64)
    grid = _crop_grid(boxes, flip, 8, 8, 8, 8, torch.float64, angle)
    x = images.double()
    out = torch.nn.functional.grid_sample(x, grid, mode="bilinear", align_corners=False)
    assert torch.allclose(out, torch.rot90(x, 1, dims=(-2, -1)), atol=1e-9)
    # a zero angle is the plain crop grid
    plain = _crop_grid(boxes, flip, 8, 8, 8, 8, torch.float64)
    assert torch.allclose(_crop_grid(boxes, flip, 8, 8, 8, 8, torch.float64, angle * 0), plain,
                          atol=1e-12)


def test_rotation__views_are_rotated_within_the_configured_range_and_reproducible():
    from dcco.config import AugmentConfig
    from dcco.data.augment import augment_pair

    gen = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (16, 3, 12, 12), generator=gen, dtype=torch.uint8)
    ids = torch.arange(16)
    base = AugmentConfig(blur_p=(0.0, 0.0))
    rotated = AugmentConfig(blur_p=(0.0, 0.0), rotate_degrees=30.0)
    a = augment_pair(images, ids, 0, 3, base)
    b = augment_pair(images, ids, 0, 3, rotated)
    c = augment_pair(images, ids, 0, 3, rotated)
    assert all(torch.equal(x, y) for x, y in zip(b, c))
    assert not torch.allclose(a[0], b[0])
    with pytest.raises(ValueError, match="augment.rotate_degrees"):
        AugmentConfig(rotate_degrees=200.0)


def test_image_views__ranges_seeding_and_the_identity_at_no_crop_and_no_jitter():
    """``dcco.ImageViews`` (the batched pipeline with torch's random state): a view keeps the
    input's shape and range (uint8 → [−1, 1]), follows torch's seed, differs between calls;
    with the whole image as its crop and no jitter, each view is its image or its mirror."""
    from dcco.data.image_views import ImageViews

    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (6, 3, 16, 16), dtype=torch.uint8, generator=gen)
    views = ImageViews()
    torch.manual_seed(1)
    a = views(images)
    torch.manual_seed(1)
    assert torch.equal(views(images), a)
    assert not torch.equal(views(images), a)
    assert a.shape == images.shape and a.dtype == torch.float32
    assert float(a.min()) >= -1 and float(a.max()) <= 1
    unit = images.double() / 255
    for given, low in ((unit, 0.0), (unit * 2 - 1, -1.0)):
        out = views(given)
        assert out.dtype == torch.float64 and float(out.min()) >= low and float(out.max()) <= 1
    plain = ImageViews(crop_scale=(1.0, 1.0), jitter=0.0, jitter_p=0.0)
    grey = images[:, :1]
    out = plain(grey)
    want = grey.float() / 127.5 - 1
    for view, image in zip(out, want, strict=True):
        assert min(float((view - image).abs().max()),
                   float((view - image.flip(-1)).abs().max())) < 1e-5
    with pytest.raises(ValueError, match="jitter and jitter_p must lie in"):
        ImageViews(jitter=1.5)
    with pytest.raises(ValueError, match="ImageViews takes images"):
        views(images.permute(0, 2, 3, 1))
