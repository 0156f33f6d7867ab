"""BYOL and SimSiam (appendix C's predictive baselines) and batch norm.

The losses are checked against independent transcriptions of the reference losses; the rounds
against the methods written directly from the modules (predictor, stop-gradient, target
network), as the papers' pseudo-code does; BYOL's target against its update rule; batch norm
against its refusals and its per-client normalisation.
"""

import math

import pytest
import torch

from dcco.config import AugmentConfig, ConfigError, ModelConfig, load_config
from dcco.core.algorithm import Algorithm
from dcco.core.losses import byol_loss_per_sample, simsiam_loss_per_sample
from dcco.core.simulator import BatchedExecutor, run_round
from dcco.data.augment import augment_pair
from dcco.methods import Segments, build_method
from dcco.methods.predictive import target_decay
from dcco.models import Head, build_dual_encoder, has_batch_norm
from dcco.run.setup import head, validate

SIZES = [1, 3, 2, 5, 1]


def _model(target="ema", norm="gn", predictor=(24, 16)):
    cfg = ModelConfig(arch="resnet14", widths=(4, 8, 8), norm=norm)
    head = Head(predictor, target) if target else None
    return build_dual_encoder(cfg, 1, (24, 16), seed=3, head=head).double()


def _views(sizes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    base = torch.rand(len(sizes), 1, 12, 12, generator=gen)
    imgs = torch.cat([(255 * (0.7 * base[k] + 0.3 * torch.rand(n, 1, 12, 12, generator=gen)))
                      .to(torch.uint8) for k, n in enumerate(sizes)])
    ids = torch.arange(imgs.shape[0])
    return augment_pair(imgs, ids, seed=1, round_index=2, cfg=AugmentConfig.byol(),
                        dtype=torch.float64)


def _flat(result):
    return torch.cat([v.flatten() for v in result.pseudo_gradient.values()])


# ------------------------------------------------------------------------ the losses


def _unit(v):
    return [x / math.sqrt(sum(t * t for t in v)) for x in v]


def _byol_transcription(a, b, c, d):
    """Grill et al. eq. 2: ‖q̄ − z̄'‖², symmetrised."""
    return sum((x - y) ** 2 for x, y in zip(a, b)) + sum((x - y) ** 2 for x, y in zip(c, d))


def _simsiam_transcription(a, b, c, d):
    """Chen & He Algorithm 1: D(p, z) = −(p/‖p‖ · z/‖z‖), L = D(p1, z2)/2 + D(p2, z1)/2."""
    return -sum(x * y for x, y in zip(a, b)) / 2 - sum(x * y for x, y in zip(c, d)) / 2


@pytest.mark.parametrize("ours,transcription", [
    (byol_loss_per_sample, _byol_transcription),
    (simsiam_loss_per_sample, _simsiam_transcription)], ids=["byol", "simsiam"])
def test_loss__equals_a_transcription_of_the_reference_loss(ours, transcription):
    """Each sample's loss against the paper's formula written with Python floats, on the
    unit vectors of (q1, y2) and (q2, y1)."""
    gen = torch.Generator().manual_seed(0)
    q1, q2, y1, y2 = (torch.randn(5, 7, generator=gen, dtype=torch.float64) for _ in range(4))
    got = ours(q1, q2, y1, y2)
    for n in range(5):
        want = transcription(*(_unit(t[n].tolist()) for t in (q1, y2, q2, y1)))
        assert abs(float(got[n]) - want) <= 1e-12


# ------------------------------------------------------------------------ the rounds


def _direct(model, x1, x2, sizes, method, stop=True):
    """The round's pseudo-gradient written from the modules, client by client: Σ_k (N_k/N)
    ∇L_k with L_k the client's mean loss (the papers' pseudo-code, no [q, y] packing)."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    for a, b in zip(x1.split(sizes), x2.split(sizes)):
        z1 = model.projector(model.backbone(a))
        z2 = model.projector(model.backbone(b))
        q1, q2 = model.predictor(z1), model.predictor(z2)
        if model.target is not None:
            with torch.no_grad():
                y1, y2 = model.target(a), model.target(b)
        else:
            y1, y2 = (z1.detach(), z2.detach()) if stop else (z1, z2)
        cos = torch.nn.functional.cosine_similarity
        if method.startswith("byol"):
            loss = ((2 - 2 * cos(q1, y2)) + (2 - 2 * cos(q2, y1))).mean()
        else:
            loss = (-cos(q1, y2) / 2 - cos(q2, y1) / 2).mean()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for t, g in zip(total, grads):
            if g is not None:
                t.add_(g, alpha=a.shape[0] / sum(sizes))
    return torch.cat([t.flatten() for t in total])


@pytest.mark.parametrize("method,target", [("byol_fedavg", "ema"),
                                           ("simsiam_fedavg", "stopgrad")])
def test_fedavg_round__batched_and_reference_equal_the_method_written_from_the_modules(
        method, target):
    model = _model(target)
    if target == "ema":  # a target that differs from the online network
        with torch.no_grad():
            for p in model.target.parameters():
                p.add_(0.05 * torch.randn_like(p))
    x1, x2 = _views(SIZES)
    segments = Segments.from_counts(SIZES)
    want = _direct(model, x1, x2, SIZES, method)
    assert want.norm() > 0
    for backend in ("batched", "reference"):
        got = _flat(run_round(model, build_method(method), x1, x2, segments, backend))
        assert float((got - want).norm() / want.norm()) <= 1e-9, backend


def test_simsiam__the_stop_gradient_matters():
    """Negative control: without SimSiam's stop-gradient the gradient is another one."""
    model = _model("stopgrad")
    x1, x2 = _views([4])
    with_stop = _direct(model, x1, x2, [4], "simsiam")
    without = _direct(model, x1, x2, [4], "simsiam", stop=False)
    assert float((with_stop - without).norm() / with_stop.norm()) > 1e-3


def test_centralized_round__is_the_batch_mean_loss_step():
    model = _model("stopgrad")
    x1, x2 = _views([6])
    got = run_round(model, build_method("centralized_simsiam"), x1, x2,
                    Segments.from_counts([6]), "batched")
    want = _direct(model, x1, x2, [6], "simsiam")
    assert float((_flat(got) - want).norm() / want.norm()) <= 1e-9


# ------------------------------------------------------------------------ BYOL's target


def test_target_network__starts_as_the_online_network_takes_no_gradient_and_moves_by_ema():
    model = _model("ema")
    online = [*model.backbone.parameters(), *model.projector.parameters()]
    target = list(model.target.parameters())
    assert all(torch.equal(a, b) for a, b in zip(online, target))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and not any(n.startswith("target.") for n in trainable)
    assert any(n.startswith("predictor.") for n in trainable)
    before = [t.clone() for t in target]
    with torch.no_grad():
        for p in online:
            p.add_(1.0)
    model.update_target(0.9)
    for b, t, o in zip(before, target, online):
        torch.testing.assert_close(t, 0.9 * b + 0.1 * o, rtol=1e-12, atol=1e-12)


def test_target_decay__rises_from_the_base_to_one_on_a_cosine():
    assert target_decay(0.99, 0, 100) == pytest.approx(0.99)
    assert target_decay(0.99, 50, 100) == pytest.approx(0.995)
    assert target_decay(0.99, 100, 100) == pytest.approx(1.0)


def test_byol_run__moves_its_target_and_resumes_bit_identically(tiny_config, tmp_path):
    from safetensors.torch import load_file

    from dcco.run.checkpoint import save_checkpoint
    from dcco.run.encoders import load_encoder
    from dcco.run.loop import run_pretraining
    from dcco.run.pretraining import Pretraining
    from dcco.run.rundir import RunDir
    from dcco.run.splits import load_splits

    cfg = load_config(tiny_config(method="byol_fedavg", rounds=4, checkpoint_every=2))
    train, _ = load_splits(cfg)
    whole = RunDir.create(tmp_path / "whole", cfg)
    summary = run_pretraining(cfg, whole, train)
    assert summary["rounds"] == 4 and math.isfinite(summary["final_loss"])
    sent = summary["bytes_per_client_round"]  # the target goes down with the model, not up
    pt = Pretraining.of(cfg, train)
    target_bytes = sum(p.numel() * p.element_size() for p in pt.model.target.parameters())
    assert sent["down"] - sent["up"] == target_bytes > 0

    stopped = RunDir.create(tmp_path / "stopped", cfg)
    pt = Pretraining.of(cfg, train)
    start = [p.clone() for p in pt.model.target.parameters()]
    for _ in range(2):
        pt.step()
    moved = list(pt.model.target.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(start, moved))
    online = [*pt.model.backbone.parameters(), *pt.model.projector.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(online, moved))
    save_checkpoint(stopped.checkpoint_path, pt.model, pt.optimizer, 2, state=pt.round_state())
    run_pretraining(cfg, stopped, train, resume=True)
    a, b = load_file(whole.checkpoint_path), load_file(stopped.checkpoint_path)
    assert any(k.startswith("model.target.") or ".target." in k for k in a)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    encoder = load_encoder(whole.path)  # the checkpoint's predictor and target load too
    assert encoder(torch.zeros(2, 1, 12, 12)).shape == (2, 8)


# ------------------------------------------------------------------------ config checks


def test_config__predictor_only_for_byol_and_simsiam_and_only_on_a_shared_network(tiny_config):
    path = tiny_config(method="simsiam_fedavg")
    cfg = load_config(path)
    assert head(cfg) == Head((4, 16), "stopgrad")  # d/4 bottleneck, as SimSiam's
    assert head(load_config(tiny_config(method="centralized_byol"))) == Head((16, 16), "ema")
    assert head(load_config(path, ["model.predictor=[8, 16]"])).predictor == (8, 16)
    with pytest.raises(ConfigError, match="model.predictor"):
        validate(load_config(tiny_config(method="dcco"), ["model.predictor=[8, 16]"]))
    with pytest.raises(ConfigError, match="model.predictor must end in the projection width 16"):
        validate(load_config(path, ["model.predictor=[8, 12]"]))
    with pytest.raises(ConfigError, match="model.shared"):
        validate(load_config(path, ["model.shared=false"]))


# ------------------------------------------------------------------------ batch norm


def test_batch_norm__is_refused_for_federated_clients_of_one_sample(tiny_config):
    path = tiny_config(method="byol_fedavg")
    with pytest.raises(ConfigError, match="model.norm = 'bn'.*2 samples"):
        validate(load_config(path, ["model.norm=\"bn\"", "data.samples_per_client=1"]))
    with pytest.raises(ConfigError, match="train.local_batch"):
        validate(load_config(path, ["model.norm=\"bn\"", "train.local_steps=2", "train.local_batch=1"]))
    assert load_config(path, ["model.norm=\"bn\""]).model.norm == "bn"  # 2 samples: allowed
    # a centralized batch is never that small, and one sample per client is fine there
    load_config(tiny_config(method="centralized_byol"),
                ["model.norm=\"bn\"", "data.samples_per_client=1"])


def test_batch_norm__is_refused_over_flower():
    from dcco.flower.appconfig import parse_run_config

    with pytest.raises(ConfigError, match="model.norm = 'bn' is not supported over Flower"):
        parse_run_config({"model.norm": "bn"})


def test_batch_norm_model__plain_convolutions_and_each_view_normalised_on_its_own():
    from dcco.models import WSConv2d

    model = _model("stopgrad", norm="bn")
    assert has_batch_norm(model) and model.batch_norm
    assert not any(isinstance(m, WSConv2d) for m in model.modules())
    assert not has_batch_norm(_model("stopgrad"))
    x1, x2 = _views([4])
    f, _ = model(x1, x2)
    f_other, _ = model(x1, torch.flip(x2, dims=[0]) + 1)
    torch.testing.assert_close(f, f_other, rtol=0, atol=0)  # view 2 does not touch view 1


def test_batch_norm_round__runs_client_by_client_in_both_backends():
    """With batch norm a client's batch statistics are its own: the batched backend falls
    back to the reference one, and the round is not the step on the pooled batch."""
    model = _model("stopgrad", norm="bn")
    sizes = [2, 3, 4]
    x1, x2 = _views(sizes)
    segments = Segments.from_counts(sizes)
    method = build_method("simsiam_fedavg")
    # the executor itself falls back (dcco.core.distributed builds executors without run_round)
    batched = _flat(Algorithm(method).round(BatchedExecutor(model, x1, x2, segments)))
    reference = _flat(run_round(model, method, x1, x2, segments, "reference"))
    want = _direct(model, x1, x2, sizes, "simsiam")
    assert float((reference - want).norm() / want.norm()) <= 1e-9
    assert float((batched - want).norm() / want.norm()) <= 1e-9
    pooled = _direct(model, x1, x2, [sum(sizes)], "simsiam")
    assert float((pooled - want).norm() / want.norm()) > 1e-3
