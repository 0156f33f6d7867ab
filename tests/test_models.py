"""Models: shapes, GN/WS rules, per-sample independence (what the batched backend relies on)."""

import pytest
import torch
from torch import nn

from dcco.models import (
    ModelConfig,
    Projector,
    WSConv2d,
    WSLinear,
    _standardise,
    build_backbone,
    build_dual_encoder,
    gn_groups,
)

TINY = ModelConfig(widths=(4, 8, 8))


def test_resnet14__feature_shapes_for_fmnist_and_cifar():
    for c, size in ((1, 28), (3, 32)):
        net = build_backbone(ModelConfig(widths=(8, 16, 32)), c, seed=0)
        assert net(torch.randn(2, c, size, size)).shape == (2, 32) and net.feature_dim == 32


def test_resnet50__tiny_widths_run_on_32px():
    net = build_backbone(ModelConfig(arch="resnet50", widths=(4, 4, 8, 8)), 3, seed=0)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 32)


def test_dual_encoder__shared_and_two_tower_shapes():
    x1, x2 = torch.randn(3, 1, 12, 12), torch.randn(3, 1, 12, 12)
    shared = build_dual_encoder(TINY, 1, (16, 16, 8), seed=0)
    towers = build_dual_encoder(ModelConfig(widths=(4, 8, 8), shared=False), 1, (16, 16, 8), 0)
    for m in (shared, towers):
        f, g = m(x1, x2)
        assert f.shape == g.shape == (3, 8) and m.features(x1).shape == (3, 8)
    assert shared.shared and not towers.shared
    f, _ = towers(x1, x1)
    assert not torch.allclose(f, towers(x1, x1)[1])  # two towers, two functions


def test_projector__ws_gn_hidden_layers_and_plain_last_layer():
    p = Projector(8, (16, 16, 4))
    kinds = [type(m) for m in p]
    assert kinds == [WSLinear, nn.GroupNorm, nn.ReLU, WSLinear, nn.GroupNorm, nn.ReLU, nn.Linear]
    assert all(m.num_channels // m.num_groups >= 8 for m in p if isinstance(m, nn.GroupNorm))


def test_gn_groups__32_or_the_largest_divisor_below():
    assert gn_groups(64) == 32 and gn_groups(16) == 16 and gn_groups(24) == 24
    assert gn_groups(48) == 24 and gn_groups(1024) == 32
    assert gn_groups(1024, 32, 8) == 32 and gn_groups(16, 32, 8) == 2


def test_weight_standardisation__zero_mean_unit_variance_per_output():
    conv = WSConv2d(3, 5, 3)
    with torch.no_grad():
        conv.weight.normal_(0.3, 2.0)
    w = _standardise(conv.weight, 1e-5)
    torch.testing.assert_close(w.mean(dim=(1, 2, 3)), torch.zeros(5), atol=1e-6, rtol=0)
    torch.testing.assert_close(w.var(dim=(1, 2, 3), unbiased=False), torch.ones(5), atol=1e-3,
                               rtol=0)


def test_dual_encoder__batch_equals_samples_alone_in_float64():
    m = build_dual_encoder(TINY, 1, (16, 16, 8), seed=1).double()
    x1, x2 = torch.randn(5, 1, 12, 12, dtype=torch.float64), torch.randn(5, 1, 12, 12,
                                                                         dtype=torch.float64)
    f, g = m(x1, x2)
    for i in range(5):
        fi, gi = m(x1[i:i + 1], x2[i:i + 1])
        torch.testing.assert_close(fi, f[i:i + 1], atol=1e-12, rtol=0)
        torch.testing.assert_close(gi, g[i:i + 1], atol=1e-12, rtol=0)
    w = torch.rand(5, dtype=torch.float64)
    params = list(m.parameters())
    total = torch.autograd.grad((w[:, None] * f).sum(), params)
    parts = [torch.autograd.grad(m(x1[i:i + 1], x2[i:i + 1])[0].sum() * w[i], params)
             for i in range(5)]
    for j, t in enumerate(total):
        torch.testing.assert_close(sum(p[j] for p in parts), t, atol=1e-12, rtol=1e-10)


def test_build_dual_encoder__seeded_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    a = build_dual_encoder(TINY, 1, (16, 16, 8), seed=4)
    assert torch.equal(state, torch.random.get_rng_state())
    b = build_dual_encoder(TINY, 1, (16, 16, 8), seed=4)
    c = build_dual_encoder(TINY, 1, (16, 16, 8), seed=5)
    for (k, va), vb, vc in zip(a.state_dict().items(), b.state_dict().values(),
                               c.state_dict().values()):
        assert torch.equal(va, vb), k
    assert any(not torch.equal(va, vc) for va, vc in zip(a.state_dict().values(),
                                                         c.state_dict().values()))


def test_model_config__validation_names_the_field():
    with pytest.raises(ValueError, match="model.widths"):
        ModelConfig(widths=(4, 8))
    with pytest.raises(ValueError, match="model.projector"):
        ModelConfig(projector=())
