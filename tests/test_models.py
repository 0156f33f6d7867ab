"""Models: shapes, structure, the GN/WS rules, seeded initialisation, and per-sample
independence (what the batched backend relies on)."""

import pytest
import torch
from torch import nn

from dcco.config import ModelConfig
from dcco.models import (
    PROJECTOR_MIN_GROUP,
    DualEncoder,
    Projector,
    ResNet14,
    ResNet50,
    WSConv2d,
    WSLinear,
    build_backbone,
    build_dual_encoder,
    group_count,
    group_norm,
    standardised_weight,
)

TINY = ModelConfig(widths=(4, 8, 8))
PROJ = (16, 16, 8)


def _convs_and_norms(net: nn.Module) -> tuple[list[nn.Module], list[nn.Module]]:
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    norms = [m for m in net.modules() if isinstance(m, nn.GroupNorm)]
    return convs, norms


def _float64_pair(n: int, size: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(n, 1, size, size, dtype=torch.float64, generator=gen)
                 for _ in range(2))


def _perturbed(model: nn.Module) -> nn.Module:
    """Random GN scales and shifts, so zero-initialised residual branches carry gradient too."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.GroupNorm):
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=gen))
    return model


def test_resnet14__feature_shapes_for_fmnist_and_cifar():
    for c, size in ((1, 28), (3, 32)):
        net = build_backbone(ModelConfig(widths=(8, 16, 32)), c, seed=0)
        assert isinstance(net, ResNet14) and net.feature_dim == 32
        assert net(torch.randn(2, c, size, size)).shape == (2, 32)
        assert net.layers(net.stem(torch.randn(2, c, size, size))).shape[-1] == size // 4


def test_resnet14__thirteen_ws_convs_each_followed_by_group_norm():
    net = ResNet14(3, (8, 16, 32))
    convs, norms = _convs_and_norms(net)
    shortcuts = [m for m in net.modules() if isinstance(m, nn.Sequential) and len(m) == 2]
    assert all(isinstance(c, WSConv2d) for c in convs) and len(convs) == len(norms)
    assert len(net.layers) == 6 and len(shortcuts) == 2  # stages 2 and 3 change shape
    assert len(convs) - len(shortcuts) == 13  # 6n + 1 convs, n = 2; the head is the 14th layer
    assert [b.convs[0].stride for b in net.layers] == [(1, 1), (1, 1), (2, 2), (1, 1),
                                                       (2, 2), (1, 1)]


def test_resnet50__bottleneck_stages_and_tiny_widths_on_small_images():
    net = build_backbone(ModelConfig(arch="resnet50", widths=(4, 4, 8, 8)), 3, seed=0)
    assert isinstance(net, ResNet50) and net.feature_dim == 32
    convs, norms = _convs_and_norms(net)
    assert len(net.layers) == 16 and len(convs) == 1 + 16 * 3 + 4 == len(norms)
    assert all(isinstance(c, WSConv2d) for c in convs) and net.stem[0].kernel_size == (7, 7)
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 32)
    assert net(torch.randn(2, 1, 28, 28).expand(2, 3, 28, 28)).shape == (2, 32)


def test_resnet50__one_by_one_maps_still_depend_on_the_input():
    # 32 px ends at 1×1 maps: group norm there needs several channels per group
    net = build_backbone(ModelConfig(arch="resnet50", widths=(8, 8, 16, 16), gn_groups=4), 3, 0)
    out = net(torch.randn(4, 3, 32, 32))
    assert out.shape == (4, 64) and (out[1:] - out[0]).abs().amax(dim=1).min() > 1e-3


def test_dual_encoder__shared_and_two_tower_shapes():
    x1, x2 = torch.randn(3, 1, 12, 12), torch.randn(3, 1, 12, 12)
    shared = build_dual_encoder(TINY, 1, PROJ, seed=0)
    towers = build_dual_encoder(ModelConfig(widths=(4, 8, 8), shared=False), 1, PROJ, 0)
    for m in (shared, towers):
        f, g = m(x1, x2)
        assert f.shape == g.shape == (3, 8) and m.projection_dim == 8 and m.feature_dim == 8
        assert m.features(x1).shape == m.features(x2, tower=1).shape == (3, 8)
    assert shared.shared and not towers.shared and shared.backbone2 is None
    f, g = towers(x1, x1)
    assert not torch.allclose(f, g)  # two towers, two functions
    with pytest.raises(ValueError, match="tower"):
        shared.features(x1, tower=2)


def test_dual_encoder__rejects_towers_of_different_projection_widths():
    a, b = ResNet14(1, (4, 8, 8)), ResNet14(1, (4, 8, 8))
    with pytest.raises(ValueError, match="one dimension"):
        DualEncoder(a, Projector(8, (16, 8)), second=(b, Projector(8, (16, 4))))


def test_projector__ws_gn_hidden_layers_and_plain_last_layer():
    p = Projector(8, (16, 16, 4))
    kinds = [type(m) for m in p]
    assert kinds == [WSLinear, nn.GroupNorm, nn.ReLU, WSLinear, nn.GroupNorm, nn.ReLU, nn.Linear]
    assert p.out_dim == 4 and p(torch.randn(5, 8)).shape == (5, 4)
    norms = [m for m in p if isinstance(m, nn.GroupNorm)]
    assert all(m.num_channels // m.num_groups >= PROJECTOR_MIN_GROUP for m in norms)
    assert [m.num_groups for m in Projector(8, (1024, 256, 128)) if isinstance(m, nn.GroupNorm)
            ] == [32, 32]  # the paper's widths keep the paper's 32 groups
    with pytest.raises(ValueError, match="hidden ones >= 2"):
        Projector(8, (1, 4))


def test_group_count__32_or_the_largest_divisor_below():
    assert [group_count(c) for c in (64, 1024, 2048, 16, 24, 48, 40, 4)] == [
        32, 32, 32, 16, 24, 24, 20, 4]
    assert group_count(96, 32) == 32 and group_count(36, 32) == 18 and group_count(8, 4) == 4
    # with a floor on the group size (the projector's): 8 channels per group at least
    assert group_count(1024, 32, 8) == 32 and group_count(16, 32, 8) == 2
    assert group_count(4, 32, 8) == 1
    assert group_norm(48).num_groups == 24 and group_norm(48, 32, 8).num_groups == 6


def test_weight_standardisation__zero_mean_unit_variance_per_output():
    gen = torch.Generator().manual_seed(0)
    for w in (torch.randn(5, 3, 3, 3, generator=gen) * 2 + 0.3,
              torch.randn(7, 40, generator=gen) * 0.5 - 1):
        s = standardised_weight(w, 1e-5)
        dims = tuple(range(1, w.ndim))
        torch.testing.assert_close(s.mean(dim=dims), torch.zeros(w.shape[0]), atol=1e-6, rtol=0)
        torch.testing.assert_close(s.std(dim=dims, unbiased=False), torch.ones(w.shape[0]),
                                   atol=1e-4, rtol=0)


def test_ws_layers__forward_invariant_to_affine_changes_of_each_units_weights():
    gen = torch.Generator().manual_seed(0)
    conv = WSConv2d(3, 4, 3, padding=1, eps=1e-12).double()
    lin = WSLinear(6, 5, eps=1e-12).double()
    x_conv = torch.randn(2, 3, 5, 5, dtype=torch.float64, generator=gen)
    x_lin = torch.randn(2, 6, dtype=torch.float64, generator=gen)
    for layer, x in ((conv, x_conv), (lin, x_lin)):
        before = layer(x)
        shape = (-1,) + (1,) * (layer.weight.ndim - 1)
        scale = torch.rand(layer.weight.shape[0], dtype=torch.float64, generator=gen) + 0.5
        shift = torch.randn(layer.weight.shape[0], dtype=torch.float64, generator=gen)
        with torch.no_grad():
            layer.weight.mul_(scale.view(shape)).add_(shift.view(shape))
        torch.testing.assert_close(layer(x), before, atol=1e-9, rtol=1e-9)


def test_dual_encoder__batch_equals_samples_alone_in_float64():
    m = _perturbed(build_dual_encoder(TINY, 1, PROJ, seed=1).double())
    x1, x2 = _float64_pair(5)
    f, g = m(x1, x2)
    for i in range(5):
        fi, gi = m(x1[i:i + 1], x2[i:i + 1])
        torch.testing.assert_close(fi, f[i:i + 1], atol=1e-12, rtol=0)
        torch.testing.assert_close(gi, g[i:i + 1], atol=1e-12, rtol=0)


def test_dual_encoder__weighted_batch_gradient_equals_sum_of_sample_gradients():
    for cfg in (TINY, ModelConfig(widths=(4, 8, 8), shared=False)):
        m = _perturbed(build_dual_encoder(cfg, 1, PROJ, seed=2).double())
        x1, x2 = _float64_pair(4)
        gen = torch.Generator().manual_seed(3)
        wf, wg = (torch.rand(4, 8, dtype=torch.float64, generator=gen) for _ in range(2))
        params = list(m.parameters())
        f, g = m(x1, x2)
        total = torch.autograd.grad((wf * f).sum() + (wg * g).sum(), params)
        parts = []
        for i in range(4):
            fi, gi = m(x1[i:i + 1], x2[i:i + 1])
            parts.append(torch.autograd.grad((wf[i] * fi).sum() + (wg[i] * gi).sum(), params))
        for j, t in enumerate(total):
            assert t.abs().max() > 0  # every parameter is exercised
            torch.testing.assert_close(sum(p[j] for p in parts), t, atol=1e-13, rtol=1e-10)


def test_dual_encoder__shared_forward_equals_the_tower_run_on_each_input():
    m = _perturbed(build_dual_encoder(TINY, 1, PROJ, seed=3).double())
    x1, x2 = _float64_pair(3)
    f, g = m(x1, x2)
    torch.testing.assert_close(f, m.projector(m.backbone(x1)), atol=1e-12, rtol=0)
    torch.testing.assert_close(g, m.encode(x2), atol=1e-12, rtol=0)
    torch.testing.assert_close(m.features(x2, tower=1), m.backbone(x2), atol=0, rtol=0)


def test_build_dual_encoder__seeded_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    a = build_dual_encoder(TINY, 1, PROJ, seed=4)
    towers = build_dual_encoder(ModelConfig(widths=(4, 8, 8), shared=False), 1, PROJ, seed=4)
    build_backbone(TINY, 1, seed=4)
    assert torch.equal(state, torch.random.get_rng_state())
    b = build_dual_encoder(TINY, 1, PROJ, seed=4)
    c = build_dual_encoder(TINY, 1, PROJ, seed=5)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if k.endswith("conv.weight")
               or ".convs." in k)
    assert all(torch.isfinite(v).all() for v in sa.values())
    # the towers differ from each other; tower 0 is the shared network
    assert not torch.equal(towers.backbone.stem[0].weight, towers.backbone2.stem[0].weight)
    assert torch.equal(towers.backbone.stem[0].weight, a.backbone.stem[0].weight)


def test_build_backbone__streams_independent_of_the_projector():
    a = build_dual_encoder(TINY, 1, PROJ, seed=6)
    b = build_dual_encoder(TINY, 1, (32, 4), seed=6)
    alone = build_backbone(TINY, 1, seed=6)
    for k, v in a.backbone.state_dict().items():
        assert torch.equal(v, b.backbone.state_dict()[k]) and torch.equal(v, alone.state_dict()[k])


def test_build_backbone__init_scales_and_zero_residual_gammas():
    net = build_backbone(ModelConfig(widths=(8, 16, 32)), 3, seed=0)
    for block in net.layers:
        assert torch.count_nonzero(block.norms[-1].weight) == 0
        assert torch.equal(block.norms[0].weight, torch.ones(block.norms[0].num_channels))
    w = net.layers[-1].convs[0].weight  # 32 out channels, 3×3: fan_out = 288
    assert abs(w.std().item() - (2 / 288) ** 0.5) < 0.1 * (2 / 288) ** 0.5


def test_model_config__validation_names_the_field():
    cases = [({"arch": "resnet18"}, "model.arch"), ({"widths": (4, 8)}, "model.widths"),
             ({"widths": (4, 0, 8)}, "model.widths"),
             ({"arch": "resnet50", "widths": (4, 8, 8)}, "model.widths"),
             ({"projector": ()}, "model.projector"), ({"projector": (8, -1)}, "model.projector"),
             ({"gn_groups": 0}, "model.gn_groups"), ({"ws_eps": 0.0}, "model.ws_eps"),
             ({"ws_eps": float("inf")}, "model.ws_eps")]
    for kwargs, field in cases:
        with pytest.raises(ValueError, match=field):
            ModelConfig(**kwargs)
    assert ModelConfig().stage_widths == (64, 128, 256)
    assert ModelConfig(arch="resnet50").stage_widths == (64, 128, 256, 512)
