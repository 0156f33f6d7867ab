"""The round object and the paper's future work: VICReg from statistics, stale statistics,
several local steps. Fixtures as in test_rounds: unequal non-IID clients, float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_rounds import _model
from test_rounds import _round_views as _views

from dcco.core.algorithm import Algorithm
from dcco.core.client import client_update, trainable_parameters
from dcco.core.losses import vicreg_loss
from dcco.core.simulator import run_round
from dcco.core.stats import VICREG_STATS, encoding_stats
from dcco.methods import Segments, build_method

SIZES = [1, 3, 1, 5, 2, 4]
SIZES_FEDAVG = [2, 3, 5, 2, 4]


def _flat(grads):
    return torch.cat([v.flatten() for v in grads.values()])


def _rel(a, b):
    return float((a - b).norm() / b.norm())


# ------------------------------------------------------------------- VICReg from statistics


def reference_vicreg(x: torch.Tensor, y: torch.Tensor, sim_coeff=25.0, std_coeff=25.0,
                     cov_coeff=1.0) -> torch.Tensor:
    """VICReg's loss as its reference implementation writes it (facebookresearch/vicreg,
    ``main_vicreg.py``, ``VICReg.forward`` after the projector, one process), transcribed
    independently of ``dcco.core.losses``."""
    batch_size, num_features = x.shape
    repr_loss = F.mse_loss(x, y)
    x = x - x.mean(dim=0)
    y = y - y.mean(dim=0)
    std_x = torch.sqrt(x.var(dim=0) + 0.0001)
    std_y = torch.sqrt(y.var(dim=0) + 0.0001)
    std_loss = torch.mean(F.relu(1 - std_x)) / 2 + torch.mean(F.relu(1 - std_y)) / 2
    cov_x = (x.T @ x) / (batch_size - 1)
    cov_y = (y.T @ y) / (batch_size - 1)

    def off_diagonal(m):
        n = m.shape[0]
        return m.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()

    cov_loss = off_diagonal(cov_x).pow_(2).sum().div(num_features) + \
        off_diagonal(cov_y).pow_(2).sum().div(num_features)
    return sim_coeff * repr_loss + std_coeff * std_loss + cov_coeff * cov_loss


@pytest.mark.parametrize("scale", [0.1, 3.0])  # variance hinge active / inactive
def test_vicreg_loss__from_statistics_equals_reference_in_value_and_gradient(scale):
    gen = torch.Generator().manual_seed(0)
    f = (scale * torch.randn(11, 6, generator=gen, dtype=torch.float64)).requires_grad_(True)
    g = (scale * torch.randn(11, 6, generator=gen, dtype=torch.float64)).requires_grad_(True)
    ours = vicreg_loss(encoding_stats(f, g, VICREG_STATS).moments())
    ref = reference_vicreg(f, g)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=0)
    a = torch.autograd.grad(ours, [f, g])
    b = torch.autograd.grad(ref, [f, g])
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-14)


def _centralized_vicreg_step(model, x1, x2):
    """The gradient of the reference VICReg loss on the pooled batch: one centralized step."""
    named = trainable_parameters(model)
    f, g = model(x1, x2)
    loss = reference_vicreg(f, g)
    grads = torch.autograd.grad(loss, [p for _, p in named])
    return {n: gr for (n, _), gr in zip(named, grads, strict=True)}, float(loss.detach())


@pytest.mark.parametrize("backend", ["batched", "reference"])
def test_dvicreg_round__equals_centralized_vicreg_step(backend):
    model, (x1, x2) = _model(projector=(24, 24, 24)), _views(SIZES)
    result = run_round(model, build_method("dvicreg"), x1, x2, Segments.from_counts(SIZES),
                       backend)
    central, loss = _centralized_vicreg_step(model, x1, x2)
    assert _flat(central).norm() > 0
    assert _rel(_flat(result.pseudo_gradient), _flat(central)) <= 1e-9
    assert abs(result.loss - loss) <= 1e-9 * abs(loss)
    assert result.exchanges == 2


def test_vicreg_fedavg_round__batched_equals_reference_and_differs_from_centralized():
    model, (x1, x2) = _model(projector=(24, 24, 24)), _views(SIZES_FEDAVG, seed=1)
    segments = Segments.from_counts(SIZES_FEDAVG)
    method = build_method("vicreg_fedavg")
    batched = run_round(model, method, x1, x2, segments, "batched")
    reference = run_round(model, method, x1, x2, segments, "reference")
    assert _rel(_flat(batched.pseudo_gradient), _flat(reference.pseudo_gradient)) <= 1e-9
    central, _ = _centralized_vicreg_step(model, x1, x2)
    assert _rel(_flat(batched.pseudo_gradient), _flat(central)) > 0.1  # negative control
    assert batched.exchanges == 1


# ------------------------------------------------------------------------ stale statistics


def test_stale_statistics__staleness_zero_is_dcco_exactly():
    model, (x1, x2) = _model(), _views(SIZES)
    segments = Segments.from_counts(SIZES)
    dcco = build_method("dcco")
    paper = run_round(model, dcco, x1, x2, segments, "batched")
    other = run_round(model, dcco, *_views(SIZES, round_index=4), segments, "batched")
    fresh = run_round(model, Algorithm(dcco, staleness=0), x1, x2, segments, "batched",
                      previous=other.shared)  # ignored when fresh
    assert torch.equal(_flat(fresh.pseudo_gradient), _flat(paper.pseudo_gradient))
    assert fresh.exchanges == paper.exchanges == 2 and fresh.aggregate is None


@pytest.mark.parametrize("backend", ["batched", "reference"])
def test_stale_statistics__one_exchange_with_the_previous_aggregate(backend):
    model, (x1, x2) = _model(), _views(SIZES)
    segments = Segments.from_counts(SIZES)
    stale = Algorithm(build_method("dcco"), staleness=1)
    first = run_round(model, stale, x1, x2, segments, backend)  # round 0: no previous
    assert first.exchanges == 2
    paper = run_round(model, build_method("dcco"), x1, x2, segments, backend)
    assert _rel(_flat(first.pseudo_gradient), _flat(paper.pseudo_gradient)) <= 1e-12
    # the aggregate sent with the updates is this round's statistics, for the next round
    for k, v in paper.shared.items():
        torch.testing.assert_close(first.aggregate[k], v, rtol=1e-12, atol=1e-14)
    # next round: another batch, the previous round's aggregate, one exchange
    y1, y2 = _views(SIZES, seed=2, round_index=6)
    second = run_round(model, stale, y1, y2, segments, backend, previous=first.aggregate)
    assert second.exchanges == 1
    for k, v in first.aggregate.items():
        assert torch.equal(second.shared[k], v)
    fresh = run_round(model, build_method("dcco"), y1, y2, segments, backend)
    assert _rel(_flat(second.pseudo_gradient), _flat(fresh.pseudo_gradient)) > 1e-6


def test_stale_statistics__batched_equals_reference():
    model, (x1, x2) = _model(), _views(SIZES)
    segments = Segments.from_counts(SIZES)
    stale = Algorithm(build_method("dcco"), staleness=1)
    prev = run_round(model, stale, *_views(SIZES, seed=4), segments, "reference").aggregate
    a = run_round(model, stale, x1, x2, segments, "batched", previous=prev)
    b = run_round(model, stale, x1, x2, segments, "reference", previous=prev)
    assert _rel(_flat(a.pseudo_gradient), _flat(b.pseudo_gradient)) <= 1e-9
    for k, v in b.aggregate.items():
        torch.testing.assert_close(a.aggregate[k], v, rtol=1e-10, atol=1e-12)


def test_stale_own_statistics__one_client_is_the_fresh_round_and_mix_by_hand():
    """train.stale_statistics = "own": a stale round's client steps on L(mix)/w with
    mix = w·S_k + (1 − w)·A, w = N_k/N; with one client holding the aggregate's N samples
    the mix is its own statistics, so the round is the fresh one; with several clients,
    each one's gradient is a transcription's, and batched (falling back) equals reference."""
    dcco = build_method("dcco")
    model, (x1, x2) = _model(), _views([6])
    one = Segments.from_counts([6])
    own = Algorithm(dcco, staleness=1, stale_statistics="own")
    prev = run_round(model, own, *_views([6], seed=5), one, "reference").aggregate
    stale = run_round(model, own, x1, x2, one, "reference", previous=prev)
    fresh = run_round(model, dcco, x1, x2, one, "reference")
    assert stale.exchanges == 1
    assert _rel(_flat(stale.pseudo_gradient), _flat(fresh.pseudo_gradient)) <= 1e-12
    anchored = run_round(model, Algorithm(dcco, staleness=1), x1, x2, one, "reference",
                         previous=prev)
    assert _rel(_flat(anchored.pseudo_gradient), _flat(fresh.pseudo_gradient)) > 1e-3

    segments = Segments.from_counts(SIZES)
    y1, y2 = _views(SIZES)
    prev = run_round(model, own, *_views(SIZES, seed=4), segments, "reference").aggregate
    a = run_round(model, own, y1, y2, segments, "batched", previous=prev)
    b = run_round(model, own, y1, y2, segments, "reference", previous=prev)
    assert torch.equal(_flat(a.pseudo_gradient), _flat(b.pseudo_gradient))
    n, total = SIZES[0], float(prev.count)
    w = n / total
    f, g = model(y1[:n], y2[:n])
    local = encoding_stats(f, g).moments()
    mix = type(local)({k: w * v + (1 - w) * prev[k] for k, v in local.items()},
                      count=prev.count)
    named = trainable_parameters(model)
    grads = torch.autograd.grad(dcco.statistics_loss(mix) / w, [p for _, p in named],
                                allow_unused=True)
    by_hand = torch.cat([(torch.zeros_like(p) if gr is None else gr).flatten()
                         for (_, p), gr in zip(named, grads)])
    update = Algorithm(dcco, staleness=1, stale_statistics="own", stale_round=True)
    mine = update.client_update(model, y1[:n], y2[:n], prev)
    assert _rel(-_flat(mine.delta), by_hand) <= 1e-10
    assert mine.loss == pytest.approx(float(dcco.statistics_loss(mix).detach()), rel=1e-10)
    with pytest.raises(ValueError, match="train.stale_statistics"):
        Algorithm(dcco, staleness=1, stale_statistics="mixed")
    with pytest.raises(ValueError, match="need train.staleness = 1"):
        Algorithm(dcco, stale_statistics="own")


def test_aggregate_decay__a_moving_average_of_the_aggregates_and_zero_is_the_last():
    dcco = build_method("dcco")
    model, segments = _model(), Segments.from_counts(SIZES)
    plain = Algorithm(dcco, staleness=1)
    ema = Algorithm(dcco, staleness=1, aggregate_decay=0.75)
    prev = run_round(model, plain, *_views(SIZES, seed=4), segments, "batched").aggregate
    x1, x2 = _views(SIZES)
    a = run_round(model, plain, x1, x2, segments, "batched", previous=prev)
    b = run_round(model, ema, x1, x2, segments, "batched", previous=prev)
    assert torch.equal(_flat(a.pseudo_gradient), _flat(b.pseudo_gradient))  # same round
    for k, v in a.aggregate.items():
        torch.testing.assert_close(b.aggregate[k], 0.75 * prev[k] + 0.25 * v, rtol=1e-14,
                                   atol=0)
    first = run_round(model, ema, x1, x2, segments, "batched")  # no previous: the new one
    assert all(torch.equal(first.aggregate[k], v) for k, v in
               run_round(model, plain, x1, x2, segments, "batched").aggregate.items())
    with pytest.raises(ValueError, match="train.aggregate_decay"):
        Algorithm(dcco, staleness=1, aggregate_decay=1.0)


# ---------------------------------------------------------------------- local steps


@pytest.mark.parametrize("method,sizes", [("dcco", [4, 6, 5]), ("cco_fedavg", [4, 6, 5]),
                                          ("contrastive_fedavg", [4, 6, 5]),
                                          ("dvicreg", [4, 6, 5])])
def test_local_steps__batched_equals_reference(method, sizes):
    model = _model(projector=(24, 24, 24))
    x1, x2 = _views(sizes)
    segments = Segments.from_counts(sizes)
    alg = Algorithm(build_method(method), local_lr=0.05, local_steps=2, local_batch=3)
    a = run_round(model, alg, x1, x2, segments, "batched")  # falls back to client by client
    b = run_round(model, alg, x1, x2, segments, "reference")
    assert _rel(_flat(a.pseudo_gradient), _flat(b.pseudo_gradient)) <= 1e-9
    one = run_round(model, Algorithm(build_method(method), local_lr=0.05), x1, x2, segments,
                    "reference")
    assert _rel(_flat(a.pseudo_gradient), _flat(one.pseudo_gradient)) > 1e-6


def test_local_steps__one_step_on_all_samples_is_the_paper_round():
    model, (x1, x2) = _model(), _views(SIZES)
    segments = Segments.from_counts(SIZES)
    alg = Algorithm(build_method("dcco"), local_steps=1, local_batch=64)
    a = run_round(model, alg, x1, x2, segments, "reference")
    b = run_round(model, build_method("dcco"), x1, x2, segments, "reference")
    assert torch.equal(_flat(a.pseudo_gradient), _flat(b.pseudo_gradient))


def test_mean_gradient__is_the_paper_round_for_one_step_and_its_limit_for_several():
    """train.pseudo_gradient = "mean_gradient" divides the averaged delta by local_lr × E: one
    step gives the paper's round at any local lr, and E steps over a partition of each client's
    samples tend to it as local_lr → 0 (with S_A held fixed, the anchored loss's gradient is
    the mean of its minibatches' gradients); at a real local lr the steps drift."""
    sizes = [4, 4, 4]
    model, (x1, x2) = _model(), _views(sizes)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # off the initialisation, whose zero-scaled residual branches put
        for p in model.parameters():  # ReLUs exactly at their kink (no limit to take there)
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    segments = Segments.from_counts(sizes)
    dcco = build_method("dcco")
    paper = _flat(run_round(model, dcco, x1, x2, segments, "reference").pseudo_gradient)

    def mean_gradient(lr, steps, batch):
        alg = Algorithm(dcco, local_lr=lr, local_steps=steps, local_batch=batch,
                        pseudo_gradient="mean_gradient")
        return _flat(run_round(model, alg, x1, x2, segments, "reference").pseudo_gradient)

    assert _rel(mean_gradient(1e-3, 1, None), paper) <= 1e-12
    # the drift is linear in local_lr, and large: weight-standardised layers' gradients are
    # big against their weights (4e-5 at 1e-9 here, 5e-2 at 1e-6)
    assert _rel(mean_gradient(1e-12, 2, 2), paper) <= 1e-6
    assert _rel(mean_gradient(1e-6, 2, 2), paper) > 1e-3
    with pytest.raises(ValueError, match="train.pseudo_gradient"):
        Algorithm(dcco, pseudo_gradient="gradient")


def test_own_statistics__first_step_is_the_anchored_one_and_later_steps_follow_the_client():
    """train.local_statistics = "own": one step equals the anchored round (same gradient);
    with several steps the loss of the client's own statistics, checked against a
    transcription: L(S_A + (N_k/N)(S_k(θ) − S_k(θ₀))) · N/N_k on the step's samples."""
    import copy

    from dcco.core.stats import Moments

    sizes = [4, 6, 4]
    model, (x1, x2) = _model(), _views(sizes)
    segments = Segments.from_counts(sizes)
    dcco = build_method("dcco")
    own1 = Algorithm(dcco, local_statistics="own")
    paper = run_round(model, dcco, x1, x2, segments, "reference")
    one = run_round(model, own1, x1, x2, segments, "reference")
    assert torch.equal(_flat(one.pseudo_gradient), _flat(paper.pseudo_gradient))

    # two steps of one client of 4 samples, by hand
    a, b = x1[:4], x2[:4]
    shared = paper.shared
    update = client_update(model, dcco, a, b, shared, 0.01, 2, 2, own_statistics=True)
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(twin.parameters(), lr=0.01)
    w = 4 / float(shared.count)
    for idx in ([0, 1], [2, 3]):
        with torch.no_grad():
            f0, g0 = model(a[idx], b[idx])
        f, g = twin(a[idx], b[idx])
        now = {"mean_f": f.mean(0), "mean_g": g.mean(0), "mean_ff": (f * f).mean(0),
               "mean_gg": (g * g).mean(0), "mean_fg": f.T @ g / 2}
        then = {"mean_f": f0.mean(0), "mean_g": g0.mean(0), "mean_ff": (f0 * f0).mean(0),
                "mean_gg": (g0 * g0).mean(0), "mean_fg": f0.T @ g0 / 2}
        moved = Moments({k: shared[k] + w * (now[k] - then[k]) for k in now},
                        count=shared.count)
        opt.zero_grad()
        (dcco.statistics_loss(moved) / w).backward()
        opt.step()
    before, after = dict(model.named_parameters()), dict(twin.named_parameters())
    for name, delta in update.delta.items():
        torch.testing.assert_close(delta, after[name] - before[name], rtol=1e-9, atol=1e-12)
    fixed = client_update(model, dcco, a, b, shared, 0.01, 2, 2)
    assert update.loss == pytest.approx(fixed.loss, rel=1e-12)  # L(S_A), unscaled
    assert _rel(_flat(update.delta), _flat(fixed.delta)) > 1e-6
    with pytest.raises(ValueError, match="train.local_statistics"):
        Algorithm(build_method("cco_fedavg"), local_statistics="own")


def test_client_update__two_steps_equal_two_sgd_steps_on_a_copy():
    """E = 2 steps of b = 3 samples (the second wraps around the 5 samples) against plain SGD
    on a copy of the model, the shared statistics held fixed."""
    import copy

    model, (x1, x2) = _model(), _views([5])
    method = build_method("dcco")
    with torch.no_grad():
        shared = encoding_stats(*model(*_views([7], seed=9))).moments()
    update = client_update(model, method, x1, x2, shared, local_lr=0.5, local_steps=2,
                           local_batch=3)
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(twin.parameters(), lr=0.5)
    for idx in ([0, 1, 2], [3, 4, 0]):
        opt.zero_grad()
        method.client_loss(*twin(x1[idx], x2[idx]), shared).backward()
        opt.step()
    before, after = dict(model.named_parameters()), dict(twin.named_parameters())
    for name, delta in update.delta.items():
        torch.testing.assert_close(delta, after[name] - before[name], rtol=1e-9, atol=1e-12)
    assert update.num_samples == 5


def test_layerwise_local_steps__trust_ratio_steps_reported_in_sgd_units():
    """train.local_optimizer = "layerwise": each tensor steps by lr·r_e·g_e with
    r_e = ‖θ₀‖/‖g_e‖ (θ₀ at the round's start), transcribed by hand, so each moves lr of its
    round-start norm per step; the delta comes back as Δ/r_0. One step is the SGD step bit for bit, and with a
    tiny lr E steps on all the samples tend to SGD's E steps."""
    import copy

    model, (x1, x2) = _model(), _views([6])
    method = build_method("dcco")
    with torch.no_grad():
        shared = encoding_stats(*model(*_views([8], seed=3))).moments()
    update = client_update(model, method, x1, x2, shared, local_lr=0.05, local_steps=2,
                           local_batch=3, layerwise=True)
    twin = copy.deepcopy(model)
    named = dict(twin.named_parameters())
    start = {n: p.detach().norm() for n, p in named.items()}
    first, moves = None, []
    for idx in ([0, 1, 2], [3, 4, 5]):
        twin.zero_grad()
        method.client_loss(*twin(x1[idx], x2[idx]), shared).backward()
        ratios = {n: (start[n] / p.grad.norm()
                      if p.grad is not None and p.grad.norm() > 0 and start[n] > 0 else 1.0)
                  for n, p in named.items()}
        first = first or ratios
        with torch.no_grad():
            for n, p in named.items():
                if p.grad is not None:
                    p -= 0.05 * ratios[n] * p.grad
                    if start[n] > 0 and p.grad.norm() > 0:
                        moves.append(float((0.05 * ratios[n] * p.grad).norm() / start[n]))
    assert moves and max(abs(m - 0.05) for m in moves) < 1e-9  # lr of the norm, every step
    before = dict(model.named_parameters())
    for name, delta in update.delta.items():
        step = (named[name].detach() - before[name].detach())
        torch.testing.assert_close(delta, step / first[name], rtol=1e-7, atol=1e-12)
    one = [client_update(model, method, x1, x2, shared, 0.05, layerwise=lw).delta
           for lw in (False, True)]
    assert all(torch.equal(one[0][n], one[1][n]) for n in one[0])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # off the initialisation's ReLU kinks (as for mean_gradient)
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    tiny = [_flat(client_update(model, method, x1, x2, shared, 1e-12, 2,
                                layerwise=lw).delta) for lw in (False, True)]
    assert _rel(tiny[1], tiny[0]) <= 1e-6
    with pytest.raises(ValueError, match="train.local_optimizer"):
        Algorithm(method, local_optimizer="adam")


# ------------------------------------------------------------------------ exchanges, bytes


def test_algorithm__exchanges_and_bytes_per_round():
    d = 128
    dcco, fedavg = build_method("dcco"), build_method("cco_fedavg")
    assert Algorithm(dcco).exchanges(has_previous=True) == 2
    assert Algorithm(dcco, staleness=1).exchanges(has_previous=True) == 1
    assert Algorithm(dcco, staleness=1).exchanges(has_previous=False) == 2
    assert Algorithm(fedavg).exchanges(has_previous=True) == 1
    stats = 8 * (1 + 4 * d + d * d)  # count, four vectors, the d×d cross moment
    assert Algorithm(dcco).message_bytes(d, d, 1000) == {"up": 1000 + stats,
                                                         "down": 1000 + stats - 8}
    assert Algorithm(fedavg).message_bytes(d, d, 1000) == {"up": 1000, "down": 1000}


def test_algorithm__settings_are_checked_by_name():
    with pytest.raises(ValueError, match="train.staleness"):
        Algorithm(build_method("cco_fedavg"), staleness=1)
    with pytest.raises(ValueError, match="train.local_batch"):
        Algorithm(build_method("contrastive_fedavg"), local_batch=1)
    with pytest.raises(ValueError, match="train.local_steps"):
        Algorithm(build_method("centralized_cco"), local_steps=2)
    with pytest.raises(ValueError, match="train.stale_after .* needs train.staleness = 1"):
        Algorithm(build_method("dcco"), stale_after=3)
    with pytest.raises(ValueError, match="train.stale_after must be >= 0"):
        Algorithm(build_method("dcco"), staleness=1, stale_after=-1)


def test_stale_after__a_fresh_warm_up_then_one_exchange_and_the_fresh_run_in_its_limit(
        tiny_config):
    """``train.stale_after = 2``: rounds 1 and 2 take fresh statistics (two exchanges) and
    send their statistics with their updates, round 3 on takes the last aggregate (one); with
    ``stale_after`` at the run's length the run is the fresh one, weight for weight."""
    from dcco.config import load_config
    from dcco.run.pretraining import Pretraining
    from dcco.run.splits import load_splits

    def run(*overrides: str) -> tuple[Pretraining, list[int]]:
        cfg = load_config(tiny_config(rounds=4), list(overrides))
        pt = Pretraining.of(cfg, load_splits(cfg)[0])
        return pt, [pt.step().exchanges for _ in range(4)]

    warm, exchanges = run("train.staleness=1", "train.stale_after=2")
    assert exchanges == [2, 2, 1, 1] and warm.aggregate is not None
    fresh, fresh_exchanges = run()
    limit, limit_exchanges = run("train.staleness=1", "train.stale_after=4")
    assert fresh_exchanges == limit_exchanges == [2, 2, 2, 2]
    for (name, a), (_, b) in zip(fresh.model.state_dict().items(),
                                 limit.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    stale, stale_exchanges = run("train.staleness=1")
    assert stale_exchanges == [2, 1, 1, 1]
    assert not all(torch.equal(a, b) for a, b in zip(stale.model.state_dict().values(),
                                                     warm.model.state_dict().values()))


# ------------------------------------------------------------------------ in a run


def test_stale_statistics__resume_is_bit_identical_with_the_saved_aggregate(tiny_config,
                                                                           tmp_path):
    from safetensors.torch import load_file

    from dcco.config import load_config
    from dcco.run.checkpoint import save_checkpoint
    from dcco.run.loop import run_pretraining
    from dcco.run.pretraining import Pretraining
    from dcco.run.rundir import RunDir
    from dcco.run.splits import load_splits

    cfg = load_config(tiny_config(rounds=4, checkpoint_every=2), ["train.staleness=1"])
    train, _ = load_splits(cfg)
    whole = RunDir.create(tmp_path / "whole", cfg)
    summary = run_pretraining(cfg, whole, train)
    assert summary["rounds"] == 4
    exchanges = [r["exchanges"] for r in whole.metrics() if "exchanges" in r]
    assert exchanges == [1.5, 1.0]  # per round, over windows of 2: round 1 took two

    stopped = RunDir.create(tmp_path / "stopped", cfg)
    pt = Pretraining.of(cfg, train)
    for _ in range(2):
        pt.step()
    assert pt.aggregate is not None
    save_checkpoint(stopped.checkpoint_path, pt.model, pt.optimizer, 2, state=pt.round_state())
    run_pretraining(cfg, stopped, train, resume=True)
    a, b = load_file(whole.checkpoint_path), load_file(stopped.checkpoint_path)
    assert a.keys() == b.keys() and any(k.startswith("state.aggregate.") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key
