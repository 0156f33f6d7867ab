"""FedSC (Jing et al. 2024) and the spectral contrastive loss (HaoChen et al. 2021): the loss
from statistics against an independent term-by-term transcription (the all-pairs and the
i ≠ j form), one round equal to a centralized step (and a negative control), the FedAvg
baseline's rounds, and local steps with the client's own statistics live: bounded for the
spectral loss, where DCCO's grow."""

from __future__ import annotations

import pytest
import torch
from test_rounds import _model
from test_rounds import _round_views as _views

from dcco.config import LossConfig
from dcco.core.algorithm import Algorithm
from dcco.core.client import client_update, trainable_parameters
from dcco.core.losses import spectral_loss
from dcco.core.simulator import run_round
from dcco.core.stats import SPECTRAL_STATS, encoding_stats
from dcco.methods import Segments, build_method
from dcco.methods.registry import METHODS

SIZES = [1, 3, 1, 5, 2, 4]


def haochen_pairs(f: torch.Tensor, g: torch.Tensor, distinct: bool) -> torch.Tensor:
    """The spectral contrastive loss as HaoChen et al. (2021, eq. 5) define its estimate, one
    pair at a time: −(2/N) Σ_i f_iᵀg_i + the mean over negative pairs (i, j) of (f_iᵀg_j)²,
    the pairs i ≠ j when ``distinct``, else all N² of them."""
    n = f.shape[0]
    positive = sum(f[i] @ g[i] for i in range(n)) / n
    pairs = [(i, j) for i in range(n) for j in range(n) if not distinct or i != j]
    negative = sum((f[i] @ g[j]) ** 2 for i, j in pairs) / len(pairs)
    return -2 * positive + negative


def fedsc_batch_loss(z1: torch.Tensor, z0: torch.Tensor) -> torch.Tensor:
    """FedSC's loss on one batch as its code computes it (no sharing, α = 1): −(2/b) Σ z¹ᵀz⁰
    + ‖R‖²_F, R the second moment of both views pooled, (1/2b) Σ (z¹z¹ᵀ + z⁰z⁰ᵀ)."""
    b = z1.shape[0]
    r = (z1.T @ z1 + z0.T @ z0) / (2 * b)
    return -2 * (z1 * z0).sum() / b + (r ** 2).sum()


@pytest.mark.parametrize("scale", [0.3, 2.0])
def test_spectral_loss__from_statistics_equals_the_pairwise_definitions(scale):
    gen = torch.Generator().manual_seed(0)
    f = (scale * torch.randn(9, 5, generator=gen, dtype=torch.float64)).requires_grad_(True)
    g = (scale * torch.randn(9, 5, generator=gen, dtype=torch.float64)).requires_grad_(True)
    m = encoding_stats(f, g, SPECTRAL_STATS).moments()
    cross, all_pairs = spectral_loss(m, "cross"), haochen_pairs(f, g, distinct=False)
    torch.testing.assert_close(cross, all_pairs, rtol=1e-12, atol=0)
    for a, b in zip(torch.autograd.grad(cross, [f, g]),
                    torch.autograd.grad(all_pairs, [f, g]), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)
    # the i ≠ j estimate: the same sums, with the N diagonal pairs taken out and N(N − 1)
    # pairs averaged
    n = f.shape[0]
    diagonal = ((f * g).sum(1) ** 2).sum()
    positive = -2 * (f * g).sum() / n
    distinct = positive + ((cross - positive) * n * n - diagonal) / (n * (n - 1))
    torch.testing.assert_close(distinct, haochen_pairs(f, g, distinct=True), rtol=1e-12,
                               atol=0)
    pooled = spectral_loss(m, "pooled")
    torch.testing.assert_close(pooled, fedsc_batch_loss(f, g), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="loss.spectral_form"):
        spectral_loss(m, "mixed")


def _centralized_spectral_step(model, x1, x2, form="pooled"):
    named = trainable_parameters(model)
    f, g = model(x1, x2)
    loss = fedsc_batch_loss(f, g) if form == "pooled" else haochen_pairs(f, g, False)
    grads = torch.autograd.grad(loss, [p for _, p in named])
    return torch.cat([gr.flatten() for gr in grads]), float(loss.detach())


def _flat(result):
    return torch.cat([v.flatten() for v in result.pseudo_gradient.values()])


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("backend", ["batched", "reference"])
@pytest.mark.parametrize("form", ["pooled", "cross"])
def test_fedsc_round__equals_the_centralized_spectral_step(backend, form):
    model, (x1, x2) = _model(projector=(24, 24, 16)), _views(SIZES)
    method = METHODS["fedsc"](LossConfig(spectral_form=form))
    result = run_round(model, method, x1, x2, Segments.from_counts(SIZES), backend)
    central, loss = _centralized_spectral_step(model, x1, x2, form)
    assert central.norm() > 0
    assert _rel(_flat(result), central) <= 1e-12
    assert abs(result.loss - loss) <= 1e-12 * abs(loss)
    assert result.exchanges == 2


def test_spectral_fedavg__batched_equals_reference_and_is_not_the_centralized_step():
    sizes = [2, 3, 5, 2, 4]
    model, (x1, x2) = _model(projector=(24, 24, 16)), _views(sizes, seed=1)
    segments = Segments.from_counts(sizes)
    method = build_method("spectral_fedavg")
    batched = run_round(model, method, x1, x2, segments, "batched")
    reference = run_round(model, method, x1, x2, segments, "reference")
    assert _rel(_flat(batched), _flat(reference)) <= 1e-12
    central, _ = _centralized_spectral_step(model, x1, x2)
    assert _rel(_flat(batched), central) > 0.01  # negative control: no shared statistics
    assert batched.exchanges == 1


def _encoding_norm_after_local_steps(method_name: str, steps: int) -> tuple[float, float]:
    """A client of 4 samples among a round of 6 clients takes ``steps`` local steps with its
    own statistics live (``local_statistics = "own"``) and the others' frozen; returns its
    encodings' mean norm before and after."""
    from dcco.core.stats import merge

    model, (x1, x2) = _model(projector=(24, 24, 16)), _views(SIZES)
    method = build_method(method_name)
    sizes = SIZES
    parts = list(zip(x1.split(sizes), x2.split(sizes), strict=True))
    shared = merge([encoding_stats(*model(a, b), method.stats) for a, b in parts]).moments()
    a, b = parts[3]  # the client of 5 samples
    with torch.no_grad():
        before = model(a, b)[0].norm(dim=1).mean().item()
    update = client_update(model, method, a, b, shared, local_lr=0.01, local_steps=steps,
                           own_statistics=True)
    params = dict(trainable_parameters(model))
    with torch.no_grad():
        for name, delta in update.delta.items():
            params[name].add_(delta)
        after = model(a, b)[0].norm(dim=1).mean().item()
    return before, after


def test_local_steps_with_own_statistics__spectral_stays_bounded_where_dcco_grows():
    """FedSC's argument, as a test: with its own statistics live, a client lowers the CCO loss
    (scale-free) by inflating its encodings, while the spectral loss's quartic term holds them.
    Forty local steps at rate 0.01, one client of a round (at 0.05 the spectral client
    diverges too: its quartic term bounds the loss, not the step size)."""
    before_s, after_s = _encoding_norm_after_local_steps("fedsc", 40)
    before_d, after_d = _encoding_norm_after_local_steps("dcco", 40)
    assert before_d == before_s  # the same client, model and views
    assert after_s < 3 * before_s, (before_s, after_s)
    assert after_d > 10 * after_s, (after_d, after_s)


def test_fedsc_local_steps__one_step_is_the_exact_round_and_several_differ():
    model, (x1, x2) = _model(projector=(24, 24, 16)), _views(SIZES)
    segments = Segments.from_counts(SIZES)
    method = build_method("fedsc")
    exact = run_round(model, method, x1, x2, segments, "reference")
    one = run_round(model, Algorithm(method, local_steps=1, local_statistics="own"), x1, x2,
                    segments, "reference")
    assert _rel(_flat(one), _flat(exact)) <= 1e-12
    three = run_round(model, Algorithm(method, local_lr=0.05, local_steps=3,
                                       local_statistics="own"), x1, x2, segments, "reference")
    assert _rel(_flat(three), _flat(exact)) > 1e-3


def test_secagg_standardisation__round_trips_the_spectral_sums_without_first_moments():
    """SecAgg+ sends standardised moments; the spectral sums share no ⟨F⟩, so F is scaled by
    its root mean square alone, and the map still inverts exactly (and bounds ⟨u uᵀ⟩)."""
    from dcco.flower.secagg import SecureScales, standardise, unstandardise

    gen = torch.Generator().manual_seed(0)
    f = torch.randn(7, 4, generator=gen, dtype=torch.float64) + 3
    g = torch.randn(7, 4, generator=gen, dtype=torch.float64)
    d = torch.float64
    scales = SecureScales(f.mean(0), f.std(0), g.mean(0), g.std(0), 1.0, 1.0)
    m = encoding_stats(f, g, SPECTRAL_STATS).moments()
    u = standardise(m, scales, SPECTRAL_STATS)
    assert float(u.mean_fft.abs().max()) <= 1.5  # ~[−1, 1]: no (μ/σ)² blow-up
    back = unstandardise(u, scales, SPECTRAL_STATS)
    for k, v in m.items():
        torch.testing.assert_close(back[k], v, rtol=1e-12, atol=1e-14)
    assert d == u.mean_fft.dtype


def test_server_validation__spectral_replies_of_the_wrong_shape_asymmetric_nonfinite_or_count():
    from dcco.core.server import ReplyError, validate_statistics

    gen = torch.Generator().manual_seed(1)
    f, g = (torch.randn(5, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    good = dict(encoding_stats(f, g, SPECTRAL_STATS).items())
    validate_statistics(good, 3, 3, spec=SPECTRAL_STATS)
    asym = good["sum_fft"].clone()
    asym[0, 1] += 1.0
    for change, kind in ((good | {"sum_fft": torch.zeros(3, 4, dtype=torch.float64)}, "shape"),
                         (good | {"sum_ggt": good["sum_ggt"] * float("nan")}, "nonfinite"),
                         (good | {"sum_fft": asym}, "magnitude"),
                         (good | {"count": -5}, "count")):
        with pytest.raises(ReplyError) as e:
            validate_statistics(change, 3, 3, spec=SPECTRAL_STATS)
        assert e.value.kind == kind, (kind, str(e.value))


def test_fedsc_alpha_schedule__is_inexact_even_at_one_step_and_exact_at_alpha_n_k_over_n():
    """FedSC's own weight α (its code's schedule, 1 → 0.2) is an option, and a negative
    control: at one local step it is not the centralized step; at α = N_k/N for every client
    (one client's share of the round) it is."""
    from dcco.run.algorithms import fedsc_alpha

    assert fedsc_alpha(0, 11) == 1.0 and fedsc_alpha(10, 11) == pytest.approx(0.2)
    assert fedsc_alpha(5, 11) == pytest.approx(0.6)
    sizes = [2, 2, 2, 2]  # equal clients: N_k/N = 1/4 for all
    model, (x1, x2) = _model(projector=(24, 24, 16)), _views(sizes)
    segments = Segments.from_counts(sizes)
    method = build_method("fedsc")
    exact = run_round(model, method, x1, x2, segments, "reference")

    def with_alpha(alpha):
        algorithm = Algorithm(method, local_steps=1, local_statistics="own", own_alpha=alpha)
        return run_round(model, algorithm, x1, x2, segments, "reference")

    assert _rel(_flat(with_alpha(0.25)), _flat(exact)) <= 1e-12
    assert _rel(_flat(with_alpha(1.0)), _flat(exact)) > 1e-3
    assert _rel(_flat(with_alpha(0.2)), _flat(exact)) > 1e-3
    with pytest.raises(ValueError, match="needs train.local_statistics = 'own'"):
        Algorithm(method, own_alpha=0.5)


def test_dp_noise__is_a_negative_control_of_the_exact_round():
    """Differential privacy's noise on the shared sums: the round is no longer the exact one."""
    from dcco.core.privacy import RoundNoise

    model, (x1, x2) = _model(projector=(24, 24, 16)), _views(SIZES)
    segments = Segments.from_counts(SIZES)
    exact = run_round(model, build_method("fedsc"), x1, x2, segments, "reference")
    noisy = run_round(model, build_method("fedsc"), x1, x2, segments, "reference",
                      noise=RoundNoise(0, 0, stats_std=1.0, update_std=0.0))
    assert _rel(_flat(noisy), _flat(exact)) > 1e-3
