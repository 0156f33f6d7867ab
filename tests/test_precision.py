"""The fast paths on the CPU: precision, compilation, host-sync-free rounds and the server
optimisers (issue: paper scale at the speed of the GPU).

The float64 equivalence tests (tests/test_rounds.py) are untouched; these show that ``bf16``
and ``compile`` run and agree with float32 on a tiny model within stated tolerances, that
preparing a model changes none of its names, and that the deferred finiteness check still
keeps a diverged model out of every checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dcco.config import (
    AugmentConfig,
    ConfigError,
    ModelConfig,
    OptimConfig,
    RunConfig,
    load_config,
    to_toml,
)
from dcco.core.client import trainable_parameters
from dcco.core.optim import LARS, build_optimizer
from dcco.core.precision import Speed, prepare_model
from dcco.core.simulator import run_round
from dcco.data.augment import (
    _apply,
    _apply_all,
    _blur,
    _grayscale,
    _jitter,
    _solarize,
    augment_pair,
)
from dcco.methods import Segments, build_method
from dcco.models import build_dual_encoder
from dcco.run.checkpoint import load_checkpoint, save_checkpoint
from dcco.run.setup import projector, resolved, speed_of, validate

ROOT = Path(__file__).resolve().parent.parent
SIZES = [2, 3, 5, 2, 4]


def _model(speed: Speed, projector=(24, 24, 16)):
    net = build_dual_encoder(ModelConfig(widths=(4, 8, 8)), 1, projector, seed=7)
    return prepare_model(net, speed, "cpu")


def _views():
    gen = torch.Generator().manual_seed(0)
    base = torch.rand(len(SIZES), 1, 12, 12, generator=gen)
    imgs = torch.cat([
        (255 * (0.7 * base[k] + 0.3 * torch.rand(n, 1, 12, 12, generator=gen))).to(torch.uint8)
        for k, n in enumerate(SIZES)])
    return augment_pair(imgs, torch.arange(imgs.shape[0]) + 1000, 3, 5, AugmentConfig.byol())


def _flat(result, exclude=()):
    return torch.cat([v.flatten().double() for k, v in result.pseudo_gradient.items()
                      if k not in exclude])


def _round(speed, method):
    x1, x2 = _views()
    m = build_method(method)
    seg = Segments.from_counts(SIZES if m.federated else [sum(SIZES)])
    return run_round(_model(speed), m, x1, x2, seg)


METHODS = ["dcco", "cco_fedavg", "contrastive_fedavg", "centralized_cco"]


# ------------------------------------------------------------------------------ config


def test_precision_and_compile__auto_resolves_on_this_machine_and_stored_configs_are_concrete():
    cfg = resolved(load_config(None, ["train.device=\"cpu\""]))
    assert (cfg.train.precision, cfg.train.compile) == ("float32", "off")
    assert "precision = \"float32\"" in to_toml(cfg)
    # unresolved configs (built in code) resolve at use
    assert RunConfig().train.precision == "auto"
    assert speed_of(replace(RunConfig(), train=replace(RunConfig().train, device="cpu"))) == Speed()


def test_precision__bad_values_name_the_key():
    with pytest.raises(ConfigError, match="train.precision = 'half' is not allowed"):
        validate(load_config(None, ["train.precision=\"half\""]))
    with pytest.raises(ConfigError, match="train.compile = 'yes' is not allowed"):
        validate(load_config(None, ["train.compile=\"yes\""]))
    with pytest.raises(ConfigError, match="train.compile = 'cudagraphs' needs a CUDA device"):
        validate(load_config(None, ["train.device=\"cpu\"", "train.compile=\"cudagraphs\""]))
    with pytest.raises(ConfigError, match="train.channels_last must be true or false"):
        validate(load_config(None, ["train.channels_last=1"]))


def test_legacy_train_dtype__reads_as_precision_and_a_conflict_is_refused(tmp_path):
    old = tmp_path / "old.toml"
    old.write_text("[train]\nrounds = 5\ndtype = \"float64\"\n")
    assert load_config(old).train.precision == "float64"
    with pytest.raises(ConfigError, match="train.dtype .the old name of train.precision"):
        validate(load_config(old, ["train.precision=\"bf16\""]))


# -------------------------------------------------------------------- names and numerics


def test_prepared_models__keep_parameter_names_state_dict_and_checkpoints(tmp_path):
    eager = _model(Speed())
    for speed in (Speed("bf16"), Speed("float32", "on", channels_last=True)):
        model = _model(speed)
        assert list(model.state_dict()) == list(eager.state_dict())
        assert not any("_orig_mod" in k for k in model.state_dict())
        save_checkpoint(tmp_path / "c.safetensors", model, None, 3)
        fresh = _model(Speed())
        assert load_checkpoint(tmp_path / "c.safetensors", fresh, None) == 3
        for (k, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
            assert torch.equal(a, b), k


@pytest.mark.parametrize("method", METHODS)
def test_compiled_round__agrees_with_eager(method):
    """torch.compile (inductor) against eager float32: loss to 1e-5 and pseudo-gradient to
    1e-4 relative (measured: 3e-6 to 1e-5)."""
    eager, compiled = _round(Speed(), method), _round(Speed("float32", "on"), method)
    assert list(compiled.pseudo_gradient) == list(eager.pseudo_gradient)  # names unchanged
    assert float(compiled.loss) == pytest.approx(float(eager.loss), rel=1e-5)
    a, b = _flat(compiled), _flat(eager)
    assert float((a - b).norm() / b.norm()) < 1e-4


# Stated tolerances of bf16 against float32 on this tiny model (widths 4/8/8, 12×12 images):
# the loss within 2 % and the pseudo-gradient's cosine with float32's at least COSINE. bf16
# keeps 8 bits of mantissa, 2^16 times float32's rounding, and the rounds amplify rounding
# alike in both: float32 against float64 differs by 5e-6 (DCCO) to 4e-5 (cco_fedavg) here,
# bf16 against float32 by 15-30 %. cco_fedavg's within-client CCO on 2-5 samples is the worst
# conditioned (cosine about 0.5); the accuracy check on a GPU (benchmarks/precision_check.py)
# is what decides whether bf16 is safe for a method. The last layer's bias is left out: the
# CCO loss is invariant to shifting the encodings, so its true gradient is zero and only
# rounding remains.
COSINE = {"dcco": 0.95, "centralized_cco": 0.95, "contrastive_fedavg": 0.95, "cco_fedavg": 0.3}


@pytest.mark.parametrize("method", METHODS)
def test_bf16_round__agrees_with_float32_within_the_stated_tolerance(method):
    full, half = _round(Speed(), method), _round(Speed("bf16"), method)
    assert float(half.loss) == pytest.approx(float(full.loss), rel=0.02)
    a, b = _flat(half, {"projector.6.bias"}), _flat(full, {"projector.6.bias"})
    assert float(a @ b / (a.norm() * b.norm())) >= COSINE[method]
    assert all(v.dtype == torch.float32 for v in half.pseudo_gradient.values())


def test_bf16__autocasts_the_backbone_only_and_keeps_evaluation_in_float32():
    model = _model(Speed("bf16"))
    x1, x2 = _views()
    f, g = model(x1, x2)
    assert f.dtype == g.dtype == torch.float32  # the projector ran in float32
    assert model.features(x1).dtype == torch.float32
    # features without autocast equal the float32 model's exactly
    assert torch.equal(model.features(x1), _model(Speed()).features(x1))


# ---------------------------------------------------------------- no host synchronisation


def test_batched_round__leaves_the_loss_on_the_device():
    result = _round(Speed(), "dcco")
    assert isinstance(result.loss, torch.Tensor) and result.loss.ndim == 0


@pytest.mark.parametrize("op,extra", [(_jitter, 4), (_grayscale, 0), (_blur, 1),
                                      (_solarize, 0)])
def test_masked_ops_without_sync__equal_the_subset_path_bit_for_bit(op, extra):
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(9, 3, 10, 10, generator=gen)
    mask = torch.rand(9, generator=gen) < 0.5
    params = [0.6 + 0.8 * torch.rand(9, generator=gen, dtype=torch.float64)
              for _ in range(extra)]
    if op is _jitter:
        params[3] = params[3] - 1.0  # hue shifts in turns
    if op is _blur:
        params = [0.5 + torch.rand(9, generator=gen, dtype=torch.float64)]
    assert torch.equal(_apply_all(mask, op, x.clone(), *params),
                       _apply(mask, op, x.clone(), *params))


def test_deferred_finiteness__names_the_round_and_no_checkpoint_holds_the_diverged_model(
        tmp_path, tiny_config):
    """The loss is read only at metrics records and checkpoints; a NaN in round 3 (logging
    every 5, checkpoints every 2) is caught before round 4's checkpoint, naming round 3."""
    from dcco.core.algorithm import RoundResult
    from dcco.data.datasets import load_dataset
    from dcco.run.loop import pretraining_loop
    from dcco.run.pretraining import Pretraining
    from dcco.run.rundir import RunDir

    cfg = load_config(tiny_config(rounds=6, checkpoint_every=2), ["train.log_every=5"])
    train = load_dataset("fashion_mnist", "train", cfg.data.data_dir)
    pt = Pretraining.of(cfg, train)
    run = RunDir.create(tmp_path / "run", cfg)

    def step():
        if pt.rounds_done != 2:
            return pt.step()
        nan = torch.tensor(float("nan"), dtype=torch.float64)  # as a diverged round's loss
        grads = {n: torch.full_like(p, float("nan")) for n, p in pt.params}
        return pt.apply(RoundResult(grads, nan, 4, 8), pt.lr(2), 0.0)

    with pytest.raises(FloatingPointError,
                       match=r"round 3: the loss is nan.*no checkpoint was written after round 2"):
        pretraining_loop(pt, run, step, train)
    assert pt.rounds_done == 4  # round 4 ran; its checkpoint was refused
    model = build_dual_encoder(cfg.model, 1, projector(cfg), seed=0)
    assert load_checkpoint(run.checkpoint_path, model) == 2
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ------------------------------------------------------------------------- optimisers


def test_foreach_lars__equals_the_looping_lars():
    torch.manual_seed(0)
    shapes = [(4, 3), (5,), (2, 2, 3, 3)]
    ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]

    def groups(params):
        return [{"params": params[::2]},
                {"params": params[1:2], "exclude": True, "weight_decay": 0.0}]

    loop = LARS(groups(ps), lr=0.1, weight_decay=1e-3, foreach=False)
    multi = LARS(groups(qs), lr=0.1, weight_decay=1e-3, foreach=True)
    for _ in range(3):
        for p, q in zip(ps, qs):
            g = torch.randn(p.shape)
            p.grad, q.grad = g.clone(), g.clone()
        loop.step()
        multi.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["adam", "lars"])
def test_fast_server_optimisers__agree_with_the_default_ones(name):
    torch.manual_seed(0)
    nets = [_model(Speed()) for _ in range(2)]
    opts = [build_optimizer(trainable_parameters(n), OptimConfig(optimizer=name, lr=0.01), fast=f)
            for n, f in zip(nets, (False, True))]
    assert (getattr(opts[1], "foreach", None) is True if name == "lars"
            else opts[1].defaults["fused"] is True)
    for _ in range(3):
        grads = [torch.randn_like(p) for p in nets[0].parameters()]
        for net, opt in zip(nets, opts):
            for p, g in zip(net.parameters(), grads):
                p.grad = g.clone()
            opt.step()
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------- the benchmark


def test_round_cost_ladder__runs_on_the_cpu_and_writes_the_committed_schema(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "round_cost.py"), "--scale", "tiny",
           "--device", "cpu", "--steps", "eager float32", "+ bf16", "--repeats", "1",
           "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                         check=False)
    assert out.returncode == 0, out.stderr
    record = json.loads((tmp_path / "round_cost_cpu.json").read_text())
    assert record["device"].startswith("CPU")
    rows = record["rows"]
    assert [(r["step"], r["method"]) for r in rows] == [
        (s, m) for s in ("eager float32", "+ bf16") for m in METHODS]
    for r in rows:
        assert {"method", "clients", "samples_per_client", "precision", "compiled",
                "ms_per_round", "centralized_ms_per_round"} <= set(r)
        assert r["ms_per_round"] > 0 and r["centralized_ms_per_round"] > 0
        assert r["tflop_per_round"] > 0
    assert rows[0]["clients"] == 4 and rows[0]["samples_per_client"] == 4
    assert rows[3]["clients"] == 1 and rows[3]["samples_per_client"] == 16
    assert "| + bf16 | dcco |" in (tmp_path / "round_cost_cpu.md").read_text()


@pytest.mark.parametrize("grid,scale,out", [
    ("table1_fmnist", "small", "table1_fmnist-small"),
    ("future_work_fmnist", "small", "future_work_fmnist-small"),
    ("stale_fmnist", "small-adam", "stale_fmnist-small-adam"),
    ("stale_fmnist", "small-stale-adam", "stale_fmnist-small-stale-adam"),
])
def test_committed_cells__still_match_their_grid_after_train_dtype_became_precision(
        grid, scale, out):
    """The committed cells were written with ``train.dtype``; they read as eager float32 runs
    and match the grid's cells (which pin that), so ``dcco reproduce`` reuses them."""
    from dcco.reproduce import load_grid, plan_cells
    from dcco.run.rundir import RunDir, config_differences

    cells = [c for c in plan_cells(load_grid(ROOT / "experiments" / f"{grid}.toml", scale),
                                   ROOT / "experiments" / "results" / out)
             if (c.path / "config.toml").is_file()]
    assert cells
    for c in cells:
        assert config_differences(RunDir.open(c.path).config(), c.cfg) == "", c.path.name


def test_precision_check__runs_both_configurations_and_writes_its_record(tmp_path, tiny_fmnist):
    """The GPU accuracy check, at a tiny size on the CPU: two runs from one seed, the k-NN
    difference in points, the overlaid loss curves."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "precision_check.py"), "--scale", "small",
           "--rounds", "4", "--knn-every", "2", "--fast-precision", "bf16", "--fast-compile",
           "off", "--set", f'data.data_dir="{tiny_fmnist}"', "--set", "model.widths=[4, 8, 8]",
           "--set", "model.projector=[16, 16, 16]", "--set", "eval.knn_bank=200", "--set",
           "eval.knn_queries=50", "--work", str(tmp_path / "work"), "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                         check=False)
    assert out.returncode == 0, out.stderr
    record = json.loads((tmp_path / "precision_check_cpu.json").read_text())
    runs = record["runs"]
    assert (runs["eager float32"]["precision"], runs["eager float32"]["compile"]) == (
        "float32", "off")
    assert runs["fast"]["precision"] == "bf16"
    for r in runs.values():
        assert [p[0] for p in r["loss_curve"]] == [1, 2, 3, 4]
        assert 0 <= r["knn"] <= 1
    assert record["knn_difference_points"] == pytest.approx(
        100 * (runs["fast"]["knn"] - runs["eager float32"]["knn"]), abs=1e-3)
    assert (tmp_path / "precision_check_cpu.png").stat().st_size > 1000


def test_auto_compile__is_off_for_rounds_run_client_by_client_and_cudagraphs_refused_there():
    from dcco.core.precision import resolve

    assert resolve("auto", "auto", "cpu", batched=False) == ("float32", "off")
    assert resolve("bf16", "on", "cuda", batched=False) == ("bf16", "on")  # asked for by name
    with pytest.raises(ConfigError, match="'cudagraphs' needs rounds of one batch"):
        validate(load_config(None, ['train.backend="reference"', 'train.compile="cudagraphs"']))
    cfg = resolved(load_config(None, ['train.local_steps=2', 'train.device="cpu"']))
    assert cfg.train.compile == "off"
