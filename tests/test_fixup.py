"""FedSC's encoder: the Fixup ResNet-20 against a transcription of Fixup's forward, its
initialisation, per-sample independence (what exact batched rounds need), the projector
without normalisation, and the clipping of encodings to √μ."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dcco.config import ModelConfig
from dcco.models import FixupBlock, FixupResNet20, build_backbone, build_dual_encoder
from dcco.models.dual import clip_scale

FIXUP = ModelConfig(arch="resnet20_fixup", norm="none", widths=(4, 8, 8))


def _randomised(net: nn.Module) -> nn.Module:
    """Every parameter random (the zero-initialised convs and biases included), so the test
    sees each one's place in the forward."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return net


def _reference_block(b: FixupBlock, x: torch.Tensor) -> torch.Tensor:
    """Fixup's basic block as Zhang et al.'s and FedSC's code write it: the shortcut is a 1×1
    average pool of stride 2 of x + bias1a, then as many zero channels as it has."""
    out = F.conv2d(x + b.bias1a, b.conv1.weight, stride=b.conv1.stride, padding=1)
    out = F.relu(out + b.bias1b)
    out = F.conv2d(out + b.bias2a, b.conv2.weight, padding=1) * b.scale + b.bias2b
    identity = x
    if b.conv1.stride[0] != 1:
        identity = nn.AvgPool2d(1, stride=2)(x + b.bias1a)
        identity = torch.cat((identity, torch.zeros_like(identity)), 1)
    return F.relu(out + identity)


def test_fixup_resnet20__forward_equals_fixups_code_term_by_term():
    net = _randomised(FixupResNet20(3, (4, 8, 16)).double())
    x = torch.randn(3, 3, 12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    h = F.relu(F.conv2d(x, net.stem.weight, padding=1) + net.bias1)
    for block in net.blocks:
        h = _reference_block(block, h)
    expected = F.adaptive_avg_pool2d(h, 1).flatten(1) + net.bias2
    torch.testing.assert_close(net(x), expected, atol=1e-12, rtol=0)
    assert net(x).shape == (3, 16) and net.feature_dim == 16


def test_fixup_resnet20__fedsc_widths_nine_blocks_and_parameter_count():
    net = build_backbone(ModelConfig(arch="resnet20_fixup", norm="none"), 3, seed=0)
    assert len(net.blocks) == 9 and net.feature_dim == 512
    widths = [128] * 3 + [256] * 3 + [512] * 3
    inputs = [128] + widths[:-1]
    # stem, two 3×3 convs and five scalars per block, two scalars around the blocks
    expected = 3 * 128 * 9 + sum(9 * (c * w + w * w) + 5 for c, w in zip(inputs, widths)) + 2
    assert sum(p.numel() for p in net.parameters()) == expected


def test_fixup_init__every_block_starts_as_its_shortcut_with_scaled_first_convs():
    net = build_backbone(ModelConfig(arch="resnet20_fixup", norm="none", widths=(16, 32, 64)),
                         3, seed=1)
    x = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(1))
    block = net.blocks[0]
    torch.testing.assert_close(block(x), F.relu(x), atol=0, rtol=0)
    for block in net.blocks:
        assert torch.count_nonzero(block.conv2.weight) == 0
        assert block.scale.item() == 1.0 and block.bias1a.item() == 0.0
    w = net.blocks[-1].conv1.weight  # 64 out channels, 3×3: He std √(2/576), then × 9^(−1/2)
    target = (2 / 576) ** 0.5 / 3
    assert abs(w.std().item() - target) < 0.1 * target
    a, b = (build_backbone(ModelConfig(arch="resnet20_fixup", norm="none"), 3, seed=s)
            for s in (2, 2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_fixup_dual_encoder__batch_equals_samples_alone_and_gradients_add_up():
    m = _randomised(build_dual_encoder(FIXUP, 1, (16, 8), seed=1).double())
    gen = torch.Generator().manual_seed(2)
    x1, x2 = (torch.randn(4, 1, 10, 10, dtype=torch.float64, generator=gen) for _ in range(2))
    f, g = m(x1, x2)
    params = list(m.parameters())
    total = torch.autograd.grad(f.sum() + (g * g).sum(), params)
    parts = []
    for i in range(4):
        fi, gi = m(x1[i:i + 1], x2[i:i + 1])
        torch.testing.assert_close(fi, f[i:i + 1], atol=1e-12, rtol=0)
        parts.append(torch.autograd.grad(fi.sum() + (gi * gi).sum(), params))
    for j, t in enumerate(total):
        torch.testing.assert_close(sum(p[j] for p in parts), t, atol=1e-12, rtol=1e-10)


def test_projector_without_norm__linear_relu_linear_as_fedscs_head():
    m = build_dual_encoder(FIXUP, 3, (32, 16), seed=0)
    kinds = [type(layer) for layer in m.projector]
    assert kinds == [nn.Linear, nn.ReLU, nn.Linear]
    assert not any(isinstance(x, (nn.GroupNorm, nn.BatchNorm1d)) for x in m.modules())


def test_clip_encodings__long_rows_clipped_short_rows_kept_and_gradients_finite():
    z = torch.tensor([[3.0, 4.0], [0.6, 0.8], [0.0, 0.0]], dtype=torch.float64,
                     requires_grad=True)
    clipped = z * clip_scale(z, 2.0)
    torch.testing.assert_close(clipped, torch.tensor([[1.2, 1.6], [0.6, 0.8], [0.0, 0.0]],
                                                     dtype=torch.float64))
    (grad,) = torch.autograd.grad(clipped.sum(), z)
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(grad[1:], torch.ones(2, 2, dtype=torch.float64))
    # FedSC's form: z where ‖z‖ < √μ, else √μ z/‖z‖
    mask = (z.norm(dim=1, keepdim=True) < 2.0).double()
    torch.testing.assert_close(clipped, mask * z + (1 - mask) * F.normalize(z, dim=1) * 2.0)


def test_clip_encodings__bounds_the_training_forward_and_not_the_evaluation_encoding():
    cfg = ModelConfig(arch="resnet20_fixup", norm="none", widths=(4, 8, 8),
                      clip_encodings=0.05)
    m = build_dual_encoder(cfg, 1, (16, 8), seed=3)
    x = torch.randn(6, 1, 10, 10, generator=torch.Generator().manual_seed(4))
    f, g = m(x, x.flip(-1))
    assert float(f.norm(dim=1).max()) <= 0.05 + 1e-6 and float(g.norm(dim=1).max()) <= 0.05 + 1e-6
    assert float(m.encode(x).norm(dim=1).max()) > 0.05


@pytest.mark.parametrize("kwargs, field", [
    ({"arch": "resnet20_fixup"}, "model.norm = 'none'"),
    ({"arch": "resnet20_fixup", "norm": "none", "widths": (8, 4, 16)}, "may not shrink"),
    ({"arch": "resnet20_fixup", "norm": "none", "widths": (8, 16)}, "model.widths"),
    ({"clip_encodings": 0.0}, "model.clip_encodings"),
    ({"clip_encodings": float("nan")}, "model.clip_encodings"),
    ({"norm": "ln"}, "model.norm"),
])
def test_model_config__fixup_and_clipping_errors_name_the_key(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)
