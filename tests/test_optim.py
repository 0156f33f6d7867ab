"""Server optimisers and the learning-rate schedule."""

import itertools
import math

import pytest
import torch
from torch import nn

from dcco.config import OptimConfig
from dcco.core.optim import LARS, build_optimizer, scheduled_lr


def test_scheduled_lr__warmup_then_cosine_to_zero():
    lrs = [scheduled_lr(s, 110, 1.0, warmup_steps=10) for s in range(110)]
    assert lrs[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.5)
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    assert scheduled_lr(110, 110, 1.0, 10) == pytest.approx(0.0)
    assert scheduled_lr(50, 100, 2.0, schedule="constant") == 2.0


def test_lars__trust_ratio_scales_matrices_and_skips_vectors():
    w = nn.Parameter(torch.full((2, 2), 3.0))  # ‖w‖ = 6
    b = nn.Parameter(torch.ones(2))
    opt = LARS([{"params": [w]}, {"params": [b], "exclude": True, "weight_decay": 0.0}], lr=0.5,
               momentum=0.0, weight_decay=0.1, trust_coefficient=0.01)
    w.grad, b.grad = torch.full((2, 2), 1.0), torch.full((2,), 2.0)
    opt.step()
    g = torch.full((2, 2), 1.0) + 0.1 * 3.0  # gradient + weight decay
    ratio = 0.01 * 6.0 / float(g.norm())
    torch.testing.assert_close(w.detach(), torch.full((2, 2), 3.0) - 0.5 * ratio * g)
    torch.testing.assert_close(b.detach(), torch.ones(2) - 0.5 * 2.0)  # plain SGD


def test_build_optimizer__lars_excludes_biases_and_norm_parameters():
    net = nn.Sequential(nn.Linear(3, 4), nn.GroupNorm(2, 4))
    opt = build_optimizer(net.named_parameters(), OptimConfig(optimizer="lars", weight_decay=1e-3))
    excluded = [g for g in opt.param_groups if g["exclude"]]
    assert len(excluded) == 1 and excluded[0]["weight_decay"] == 0.0
    assert {p.ndim for p in excluded[0]["params"]} == {1} and len(excluded[0]["params"]) == 3


def test_optim_config__rejects_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="optim.lr"):
        OptimConfig(lr=0.0)
    with pytest.raises(ValueError, match="optim.momentum"):
        OptimConfig(momentum=1.5)
    assert math.isclose(OptimConfig().lr, 5e-3)


@pytest.mark.parametrize("name", ["lars", "adam"])
def test_vector_lr_scale__one_dimensional_parameters_step_at_a_fraction_of_the_rate(name):
    from dcco.core.optim import set_lr

    torch.manual_seed(0)
    layer = nn.Linear(4, 3)
    opt = build_optimizer(layer.named_parameters(),
                          OptimConfig(optimizer=name, lr=0.5, vector_lr_scale=0.024))
    set_lr(opt, 0.2)  # a schedule keeps the ratio
    by_dim = {g["params"][0].ndim: g["lr"] for g in opt.param_groups}
    assert by_dim == {2: 0.2, 1: pytest.approx(0.2 * 0.024)}
    if name == "lars":  # an excluded vector moves by lr × scale × its gradient
        layer.bias.grad = torch.ones(3)
        layer.weight.grad = torch.zeros(3, 4)
        before = layer.bias.detach().clone()
        opt.step()
        assert torch.allclose(layer.bias, before - 0.2 * 0.024)
    with pytest.raises(ValueError, match="optim.vector_lr_scale"):
        OptimConfig(vector_lr_scale=0.0)


def test_optim_old_key_names__read_as_the_new_ones_with_a_warning_and_a_conflict_is_refused(
        tmp_path):
    """One name for the warm-up and the server optimiser: ``optim.warmup_rounds`` and
    ``optim.optimizer`` in TOML as in the strategy's ``warmup_rounds=`` and ``optimizer=``. A
    file or override with the old ``optim.warmup_steps`` or ``optim.name`` still loads, told
    the new name; a run directory's stored config (written by an earlier version) loads
    quietly; both names at once with two values are refused."""
    import re
    import warnings

    from dcco.config import ConfigError, RunConfig, load_config
    from dcco.run.rundir import RunDir

    old = tmp_path / "old.toml"
    old.write_text("[train]\nrounds = 5\n\n[optim]\nwarmup_steps = 7\n")
    with pytest.warns(DeprecationWarning, match="optim.warmup_steps is now optim.warmup_rounds"):
        assert load_config(old).optim.warmup_rounds == 7
    with pytest.warns(DeprecationWarning, match="optim.warmup_rounds"):
        assert load_config(None, ["optim.warmup_steps=3"]).optim.warmup_rounds == 3
    with pytest.warns(DeprecationWarning, match="optim.name is now optim.optimizer"):
        assert load_config(None, ['optim.name="lars"']).optim.optimizer == "lars"
    with pytest.warns(DeprecationWarning, match="train.dtype is now train.precision"):
        dtype = load_config(None, ['train.dtype="float64"']).train
    assert (dtype.precision, dtype.compile) == ("float64", "off")
    with pytest.raises(ConfigError, match="optim.warmup_steps .the old name of "
                                          "optim.warmup_rounds"):
        load_config(old, ["optim.warmup_rounds=8"])
    run = RunDir.create(tmp_path / "run", RunConfig())
    stored = run.config_path.read_text().replace("warmup_rounds", "warmup_steps")
    run.config_path.write_text(re.sub(r"^optimizer =", "name =", stored, flags=re.MULTILINE))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run.config().optim == RunConfig().optim
