"""Augmentations: batch invariance, reproducibility, and each op's switch."""

import pytest
import torch

from dcco.augment import AugmentConfig, augment_pair, eval_view, flip_view, uniform


def _images(n=6, c=3, size=16, seed=0):
    return torch.randint(0, 256, (n, c, size, size), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_augment_pair__batch_invariant(channels, dtype):
    imgs, ids = _images(c=channels), torch.tensor([10, 3, 99, 4, 5, 7])
    a, b = augment_pair(imgs, ids, seed=1, round_index=2, cfg=AugmentConfig.byol(), dtype=dtype)
    order = torch.tensor([4, 0, 2])
    a2, b2 = augment_pair(imgs[order], ids[order], 1, 2, AugmentConfig.byol(), dtype)
    assert torch.equal(a[order], a2) and torch.equal(b[order], b2)
    for i in range(6):
        one, _ = augment_pair(imgs[i:i + 1], ids[i:i + 1], 1, 2, AugmentConfig.byol(), dtype)
        assert torch.equal(one, a[i:i + 1])


def test_augment_pair__reproducible_and_fresh_per_round_seed_and_view():
    imgs, ids = _images(), torch.arange(6)
    cfg = AugmentConfig.byol()
    a, b = augment_pair(imgs, ids, 1, 2, cfg)
    assert torch.equal(a, augment_pair(imgs, ids, 1, 2, cfg)[0])
    assert not torch.equal(a, b)
    assert not torch.equal(a, augment_pair(imgs, ids, 1, 3, cfg)[0])
    assert not torch.equal(a, augment_pair(imgs, ids, 2, 2, cfg)[0])


@pytest.mark.parametrize("channels", [1, 3])
def test_augment_pair__shapes_dtype_and_range(channels):
    a, b = augment_pair(_images(c=channels), torch.arange(6), 0, 0, AugmentConfig.byol())
    assert a.shape == b.shape == (6, channels, 16, 16) and a.dtype == torch.float32
    assert a.min() >= -1 - 1e-5 and a.max() <= 1 + 1e-5


def test_augment_pair__everything_off_is_the_plain_image():
    cfg = AugmentConfig(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip_p=0.0, jitter_p=0.0,
                        grayscale_p=0.0, blur_p=(0.0, 0.0), solarize_p=(0.0, 0.0))
    imgs = _images()
    a, b = augment_pair(imgs, torch.arange(6), 0, 0, cfg, torch.float64)
    torch.testing.assert_close(a, eval_view(imgs, torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(b, eval_view(imgs, torch.float64), atol=1e-12, rtol=0)


def test_augment_pair__full_crop_with_certain_flip_is_the_mirror_image():
    cfg = AugmentConfig(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip_p=1.0, jitter_p=0.0,
                        grayscale_p=0.0, blur_p=(0.0, 0.0), solarize_p=(0.0, 0.0))
    imgs = _images(c=1)
    a, _ = augment_pair(imgs, torch.arange(6), 0, 0, cfg, torch.float64)
    torch.testing.assert_close(a, eval_view(imgs, torch.float64).flip(-1), atol=1e-12, rtol=0)


def test_augment_pair__one_channel_images_skip_colour_ops():
    """With only colour ops enabled, a one-channel image passes through unchanged."""
    cfg = AugmentConfig(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip_p=0.0, jitter_p=1.0,
                        brightness=0.0, contrast=0.0, saturation=0.5, hue=0.5, grayscale_p=1.0,
                        blur_p=(1.0, 1.0), solarize_p=(1.0, 1.0))
    imgs = _images(c=1)
    a, _ = augment_pair(imgs, torch.arange(6), 0, 0, cfg, torch.float64)
    torch.testing.assert_close(a, eval_view(imgs, torch.float64), atol=1e-12, rtol=0)
    c, _ = augment_pair(_images(c=3), torch.arange(6), 0, 0, cfg, torch.float64)
    assert not torch.allclose(c, eval_view(_images(c=3), torch.float64))


def test_flip_view__only_flips():
    imgs = _images()
    x = flip_view(imgs, torch.arange(6), 0, 0)
    plain = eval_view(imgs)
    flipped = [torch.equal(x[i], plain[i].flip(-1)) for i in range(6)]
    assert all(f or torch.equal(x[i], plain[i]) for i, f in enumerate(flipped))


def test_uniform__looks_uniform_and_distinct():
    u = uniform(2**62 + 12345, 7, torch.arange(200_000), view=1, slot=3)
    assert u.min() >= 0 and u.max() < 1
    assert abs(float(u.mean()) - 0.5) < 0.005
    assert torch.unique(u).numel() > 199_990
    hist = torch.histc(u.float(), bins=10, min=0, max=1)
    assert (hist / 20_000 - 1).abs().max() < 0.03


def test_augment_config__validation_names_the_field():
    with pytest.raises(ValueError, match="augment.flip_p"):
        AugmentConfig(flip_p=1.5)
    with pytest.raises(ValueError, match="augment.crop_scale"):
        AugmentConfig(crop_scale=(0.9, 0.1))
    assert AugmentConfig.cifar().blur_p == (0.0, 0.0)
