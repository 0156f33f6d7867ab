"""FedSC's local recipe: momentum, weight decay and gradient clipping of the local steps equal
``torch.optim.SGD`` with ``clip_grad_norm_`` step for step, the cosine local learning rate,
and decay or clipping as a negative control of the exact round."""

from __future__ import annotations

import copy

import pytest
import torch
from test_rounds import _model
from test_rounds import _round_views as _views

from dcco.config import ConfigError, RunConfig, TrainConfig
from dcco.core.algorithm import Algorithm
from dcco.core.client import (
    LocalSGD,
    client_statistics,
    client_update,
    local_batches,
    trainable_parameters,
)
from dcco.core.simulator import run_round
from dcco.core.stats import merge
from dcco.methods import Segments, build_method
from dcco.run.algorithms import algorithm_of
from dcco.run.setup import validate

SIZES = [3, 6, 2, 5]


def _torch_sgd_delta(model, method, x1, x2, shared, lr, steps, batch, sgd: LocalSGD):
    """The local steps as FedSC's client takes them: a fresh ``torch.optim.SGD`` per round,
    ``clip_grad_norm_`` before every step; returns θ_E − θ_0 by parameter name."""
    local = copy.deepcopy(model)
    params = [p for _, p in trainable_parameters(local)]
    opt = torch.optim.SGD(params, lr=lr, momentum=sgd.momentum, weight_decay=sgd.weight_decay)
    for idx in local_batches(x1.shape[0], steps, batch):
        opt.zero_grad()
        loss = method.client_loss(*local(x1[idx], x2[idx]), shared)
        loss.backward()
        if sgd.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, sgd.grad_clip)
        opt.step()
    start = dict(trainable_parameters(model))
    return {n: p.detach() - start[n].detach() for n, p in trainable_parameters(local)}


def _shared(model, method, x1, x2):
    parts = zip(x1.split(SIZES), x2.split(SIZES), strict=True)
    return merge([client_statistics(model, a, b, method.stats) for a, b in parts]).moments()


@pytest.mark.parametrize("sgd", [LocalSGD(momentum=0.9), LocalSGD(weight_decay=5e-4),
                                 LocalSGD(grad_clip=0.05),
                                 LocalSGD(momentum=0.9, weight_decay=5e-4, grad_clip=0.05)])
def test_local_sgd__equals_torch_sgd_with_clip_grad_norm_step_for_step(sgd):
    model, (x1, x2) = _model(projector=(24, 24, 16)), _views(SIZES)
    method = build_method("fedsc")
    shared = _shared(model, method, x1, x2)
    a, b = x1[3:9], x2[3:9]  # the client of 6 samples
    ours = client_update(model, method, a, b, shared, local_lr=0.03, local_steps=5,
                         local_batch=4, sgd=sgd)
    theirs = _torch_sgd_delta(model, method, a, b, shared, 0.03, 5, 4, sgd)
    plain = client_update(model, method, a, b, shared, local_lr=0.03, local_steps=5,
                          local_batch=4)
    num = sum(float((ours.delta[n] - theirs[n]).norm() ** 2) for n in theirs) ** 0.5
    den = sum(float(theirs[n].norm() ** 2) for n in theirs) ** 0.5
    moved = sum(float((plain.delta[n] - theirs[n]).norm() ** 2) for n in theirs) ** 0.5
    assert den > 0 and num <= 1e-12 * den, (num, den)
    assert moved > 1e-6 * den  # the option changed the steps


def test_weight_decay_or_clipping__make_even_one_step_inexact_and_leave_the_batched_path():
    model, (x1, x2) = _model(projector=(24, 24, 16)), _views(SIZES)
    segments = Segments.from_counts(SIZES)
    method = build_method("fedsc")
    exact = run_round(model, method, x1, x2, segments, "batched")
    flat = torch.cat([v.flatten() for v in exact.pseudo_gradient.values()])
    for sgd in (LocalSGD(momentum=0.9), LocalSGD(weight_decay=0.1), LocalSGD(grad_clip=1e-3)):
        algorithm = Algorithm(method, local_sgd=sgd)
        assert algorithm.batched_exact(2) == (sgd.weight_decay == 0 and sgd.grad_clip is None)
        for backend in ("batched", "reference"):
            out = run_round(model, algorithm, x1, x2, segments, backend)
            other = torch.cat([v.flatten() for v in out.pseudo_gradient.values()])
            rel = float((other - flat).norm() / flat.norm())
            if sgd.momentum:  # one step: momentum changes nothing
                assert rel <= 1e-12
            else:
                assert rel > 1e-4, (sgd, backend, rel)


def test_cosine_local_lr__follows_the_round_and_reaches_the_clients():
    # torch's CosineAnnealingLR with T_max = R, as FedSC's server steps it once a round
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 200)
    long = RunConfig(train=TrainConfig(method="fedsc", rounds=200, local_lr=1.0,
                                       local_lr_schedule="cosine"))
    for r in range(200):
        assert algorithm_of(long, r).local_lr == pytest.approx(
            opt.param_groups[0]["lr"], rel=1e-9, abs=1e-12), r
        opt.step()
        schedule.step()
    cfg = RunConfig(train=TrainConfig(method="fedsc", rounds=10, local_lr=0.03,
                                      local_lr_schedule="cosine", local_momentum=0.9,
                                      local_weight_decay=5e-4, local_grad_clip=3.0))
    assert algorithm_of(cfg, 0).local_lr == pytest.approx(0.03)
    assert algorithm_of(cfg, 5).local_lr == pytest.approx(0.015)
    assert algorithm_of(cfg, 5).local_sgd == LocalSGD(0.9, 5e-4, 3.0)


@pytest.mark.parametrize("key, value, match", [
    ("local_momentum", 1.0, "train.local_momentum"),
    ("local_momentum", -0.1, "train.local_momentum"),
    ("local_weight_decay", -1e-4, "train.local_weight_decay"),
    ("local_grad_clip", 0.0, "train.local_grad_clip"),
])
def test_local_sgd__bad_settings_name_the_key(key, value, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(train=TrainConfig(method="fedsc", **{key: value}))


def test_local_sgd__refused_for_centralized_methods():
    with pytest.raises(ConfigError, match="centralized_cco is centralized: it takes no local"):
        validate(RunConfig(train=TrainConfig(method="centralized_cco", local_momentum=0.9)))


def test_uniform_weighting__the_clients_plain_mean_exact_only_over_clients_of_one_size():
    """FedSC's server averages its clients' models unweighted: 1/K each. Over clients of one
    size that is the sample-weighted round (and the batched path keeps it); over unequal
    clients it is the plain mean of their updates, and no longer the centralized step."""
    model = _model(projector=(24, 24, 16))
    method = build_method("fedsc")
    uniform = Algorithm(method, client_weighting="uniform")
    for sizes in ([3, 3, 3, 3], SIZES):
        x1, x2 = _views(sizes)
        segments = Segments.from_counts(sizes)
        exact = run_round(model, method, x1, x2, segments, "batched")
        outs = [run_round(model, uniform, x1, x2, segments, b) for b in ("batched", "reference")]
        flat = [torch.cat([v.flatten() for v in o.pseudo_gradient.values()]) for o in outs]
        ref = torch.cat([v.flatten() for v in exact.pseudo_gradient.values()])
        assert float((flat[0] - flat[1]).norm()) <= 1e-12 * float(flat[1].norm())
        rel = float((flat[1] - ref).norm() / ref.norm())
        assert (rel <= 1e-12) == (len(set(sizes)) == 1), (sizes, rel)
        assert outs[1].num_samples == sum(sizes)
    # the plain mean of the clients' own updates, by hand
    x1, x2 = _views(SIZES)
    shared = _shared(model, method, x1, x2)
    deltas = [client_update(model, method, a, b, shared, 1.0).delta
              for a, b in zip(x1.split(SIZES), x2.split(SIZES), strict=True)]
    by_hand = torch.cat([-sum(d[n] for d in deltas).flatten() / len(deltas)
                         for n in deltas[0]])
    torch.testing.assert_close(flat[1], by_hand, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="train.client_weighting"):
        Algorithm(method, client_weighting="median")


def test_uniform_weighting__refused_over_flower():
    from dcco.config import ConfigError
    from dcco.flower.appconfig import parse_run_config

    with pytest.raises(ConfigError, match="client_weighting = 'uniform' is not supported"):
        parse_run_config({"train.client_weighting": "uniform"})
