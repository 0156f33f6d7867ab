"""Client-level differential privacy (dcco.core.privacy): the sensitivity bounds hold, also for
adversarial clients; the noise has the configured standard deviation and is reproducible;
the accountant is the library's; a DP run resumes bit-identically."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dcco.config import AugmentConfig, ConfigError, ModelConfig, load_config
from dcco.core.algorithm import Algorithm
from dcco.core.client import trainable_parameters
from dcco.core.privacy import (
    RoundNoise,
    clip_update,
    consistent,
    epsilon,
    solve_noise_multiplier,
    stats_sensitivity,
)
from dcco.core.simulator import ReferenceExecutor, run_round
from dcco.core.stats import CCO_STATS, SPECTRAL_STATS, VICREG_STATS, EncodingStats
from dcco.data.augment import augment_pair
from dcco.methods import Segments, build_method
from dcco.models import build_dual_encoder
from dcco.run.setup import projector, validate

SIZES = [4, 4, 4, 4, 4]


def _model(scale: float = 1.0):
    net = build_dual_encoder(ModelConfig(widths=(4, 8, 8)), 1, (24, 24, 16), seed=7).double()
    net.unit_encodings = True
    with torch.no_grad():  # an adversarial client's network can make encodings huge
        net.projector[-1].weight.mul_(scale)
        net.projector[-1].bias.mul_(scale)
    return net


def _views(n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    imgs = (255 * torch.rand(n, 1, 12, 12, generator=gen)).to(torch.uint8)
    return augment_pair(imgs, torch.arange(n), 3, 5, AugmentConfig.byol(), dtype=torch.float64)


def _flat(stats: EncodingStats) -> torch.Tensor:
    return torch.cat([v.flatten() for k, v in stats.items() if k != "count"])


@pytest.mark.parametrize("spec", [CCO_STATS, VICREG_STATS, SPECTRAL_STATS],
                         ids=["cco", "vicreg", "spectral"])
@pytest.mark.parametrize("scale", [1.0, 1e6])
def test_statistics_sensitivity__one_clients_change_is_within_the_bound(spec, scale):
    """Merged statistics with and without one client differ by at most n·√fields, also when
    that client's encodings are a million times their usual size."""
    model = _model(scale)
    x1, x2 = _views(sum(SIZES))
    everyone = ReferenceExecutor(model, x1, x2, Segments.from_counts(SIZES)).statistics(spec)
    n = sum(SIZES[:-1])
    rest = ReferenceExecutor(model, x1[:n], x2[:n],
                             Segments.from_counts(SIZES[:-1])).statistics(spec)
    change = float((_flat(everyone) - _flat(rest)).norm())
    bound = stats_sensitivity(spec, max(SIZES))
    assert 0 < change <= bound * (1 + 1e-12)


@pytest.mark.parametrize("local_lr", [1.0, 1e6])
def test_update_sensitivity__every_client_is_clipped_so_one_moves_the_average_by_at_most_c_over_k(
        local_lr):
    model = _model()
    x1, x2 = _views(sum(SIZES))
    clip = 0.5
    algorithm = Algorithm(build_method("cco_fedavg"), local_lr=local_lr, update_clip=clip)
    assert not algorithm.batched_exact(4)  # clipping needs each client's own update
    rounds = {}
    for k in (len(SIZES), len(SIZES) - 1):
        n = sum(SIZES[:k])
        rounds[k] = run_round(model, algorithm, x1[:n], x2[:n],
                              Segments.from_counts(SIZES[:k]), "batched")
    # one client's update, clipped, weighs 1/K in the average
    k = len(SIZES)
    flat = {j: torch.cat([v.flatten() for v in r.pseudo_gradient.values()])
            for j, r in rounds.items()}
    removed = flat[k] * k - flat[k - 1] * (k - 1)  # that client's clipped update
    assert float(removed.norm()) <= clip * (1 + 1e-9)
    assert float((flat[k] - flat[k - 1] * (k - 1) / k).norm()) <= clip / k * (1 + 1e-9)


def test_clip_update__scales_only_what_exceeds_the_bound():
    small = {"a": torch.tensor([0.3, 0.4])}
    assert torch.equal(clip_update(small, 1.0)["a"], small["a"])
    big = {"a": torch.tensor([3.0, 4.0]), "b": torch.zeros(2, 2)}
    out = clip_update(big, 1.0)
    assert float(torch.cat([v.flatten() for v in out.values()]).norm()) == pytest.approx(1.0)


def test_noise__has_the_configured_standard_deviation_and_is_a_function_of_seed_and_round():
    noise = RoundNoise(seed=3, round_index=7, stats_std=2.5, update_std=0.125)
    zeros = {"w": torch.zeros(400, 500), "b": torch.zeros(1000)}
    drawn = noise.update(zeros)
    values = torch.cat([v.flatten() for v in drawn.values()])
    assert float(values.std()) == pytest.approx(0.125, rel=0.01)
    assert abs(float(values.mean())) < 0.125 * 5 / math.sqrt(values.numel())
    again = RoundNoise(seed=3, round_index=7, stats_std=2.5, update_std=0.125).update(zeros)
    assert all(torch.equal(drawn[k], again[k]) for k in drawn)
    other = RoundNoise(seed=3, round_index=8, stats_std=2.5, update_std=0.125).update(zeros)
    assert not torch.equal(drawn["w"], other["w"])
    d = 64
    stats = EncodingStats({"count": torch.tensor(1e6, dtype=torch.float64),
                           "sum_f": torch.zeros(d, dtype=torch.float64),
                           "sum_g": torch.zeros(d, dtype=torch.float64),
                           "sum_ff": torch.full((d,), 1e9, dtype=torch.float64),
                           "sum_gg": torch.full((d,), 1e9, dtype=torch.float64),
                           "sum_fg": torch.zeros(d, d, dtype=torch.float64)})
    noisy = noise.statistics(stats, CCO_STATS)
    assert float(noisy.count) == 1e6  # public
    assert float(noisy.sum_fg.std()) == pytest.approx(2.5, rel=0.02)


def test_consistent__no_variance_is_negative_after_noise():
    n = torch.tensor(4.0, dtype=torch.float64)
    stats = EncodingStats({"count": n, "sum_f": torch.tensor([2.0, 0.0], dtype=torch.float64),
                           "sum_g": torch.zeros(2, dtype=torch.float64),
                           "sum_fft": torch.tensor([[0.1, 0.5], [0.5, 3.0]],
                                                   dtype=torch.float64),
                           "sum_ggt": -torch.eye(2, dtype=torch.float64),
                           "sum_fg_diag": torch.zeros(2, dtype=torch.float64)})
    out = consistent(stats, VICREG_STATS)
    assert torch.equal(torch.diagonal(out.sum_fft), torch.tensor([1.0, 3.0],
                                                                 dtype=torch.float64))
    assert float(out.sum_fft[0, 1]) == 0.5  # off-diagonal entries kept
    assert torch.equal(torch.diagonal(out.sum_ggt), torch.zeros(2, dtype=torch.float64))


def test_accountant__is_the_librarys_rdp_for_the_implemented_sampling():
    """Our ε equals dp-accounting's RDP accountant fed the events by hand: K of M without
    replacement, replace-one neighbours (sensitivity doubled: noise multiplier σ/2), two
    releases per round composed inside each round's sample."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    sigma, m, k, rounds, delta = 1.3, 15_000, 32, 300, 1e-5
    inner = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(sigma / 2)] * 2)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(m, k, inner), rounds)
    reference = rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    reference.compose(event)
    assert epsilon(sigma, m, k, rounds, 2, delta) == pytest.approx(
        reference.get_epsilon(delta), rel=1e-12)
    # more noise, fewer rounds or a smaller sample: less ε
    assert epsilon(2 * sigma, m, k, rounds, 2, delta) < epsilon(sigma, m, k, rounds, 2, delta)
    assert epsilon(sigma, m, k, rounds // 2, 2, delta) < epsilon(sigma, m, k, rounds, 2, delta)
    assert epsilon(sigma, m, k, 0, 2, delta) == 0 and epsilon(0, m, k, 1, 2, delta) == math.inf
    from dcco.core.privacy import Ledger

    for extra in (0, 1):  # a run's ledger (one round's RDP, composed) gives the same ε
        ledger = Ledger(sigma, m, k, 2, delta, extra)
        for r in (1, 37, rounds):
            assert ledger.epsilon(r) == pytest.approx(
                epsilon(sigma, m, k, r, 2, delta, extra), rel=1e-9)
    solved = solve_noise_multiplier(4.0, m, k, rounds, 2, delta)
    assert epsilon(solved, m, k, rounds, 2, delta) <= 4.0
    assert epsilon(solved * 0.99, m, k, rounds, 2, delta) > 4.0


def test_privacy_config__errors_name_the_key():
    with pytest.raises(ConfigError, match="privacy.update_clip must be a finite number > 0"):
        validate(load_config(None, ["privacy.update_clip=0"]))
    with pytest.raises(ConfigError, match="not both"):
        validate(load_config(None, ["privacy.noise_multiplier=1.0", "privacy.target_epsilon=4.0"]))
    with pytest.raises(ConfigError, match="centralized_cco is centralized"):
        validate(load_config(None, ['train.method="centralized_cco"', "privacy.noise_multiplier=1.0"]))


def test_dp_run__reports_epsilon_and_resumes_bit_identically(tiny_config, tmp_path):
    """A DCCO run with ε = 8 reports ε in metrics and summary; killed after its checkpoint
    at round 3 and resumed, it ends with the weights of an uninterrupted run."""
    from dcco.data.datasets import load_dataset
    from dcco.run.checkpoint import load_checkpoint
    from dcco.run.loop import pretraining_loop, resume_from_checkpoint
    from dcco.run.pretraining import Pretraining
    from dcco.run.rundir import RunDir

    cfg = load_config(tiny_config(rounds=6, checkpoint_every=3), ["privacy.target_epsilon=8"])
    train = load_dataset("fashion_mnist", "train", cfg.data.data_dir)
    whole = RunDir.create(tmp_path / "whole", cfg)
    pt = Pretraining.of(cfg, train)
    summary = pretraining_loop(pt, whole, pt.step, train)
    privacy = summary["privacy"]
    assert privacy["epsilon"] <= 8 and privacy["noise_multiplier"] > 0
    records = [json.loads(line) for line in (whole.path / "metrics.jsonl").open()]
    eps = [r["epsilon"] for r in records if "epsilon" in r]
    assert eps == sorted(eps) and eps[-1] == pytest.approx(privacy["epsilon"])

    cut = RunDir.create(tmp_path / "cut", cfg)
    first = Pretraining.of(cfg, train)
    while first.rounds_done < 3:  # as if killed after round 3's checkpoint
        first.step()
    from dcco.run.checkpoint import save_checkpoint

    save_checkpoint(cut.checkpoint_path, first.model, first.optimizer, 3)
    resumed = Pretraining.of(cfg, train)
    resume_from_checkpoint(resumed, cut)
    pretraining_loop(resumed, cut, resumed.step, train)
    a = build_dual_encoder(cfg.model, 1, projector(cfg), seed=0)
    b = build_dual_encoder(cfg.model, 1, projector(cfg), seed=0)
    assert load_checkpoint(whole.checkpoint_path, a) == load_checkpoint(cut.checkpoint_path,
                                                                        b) == 6
    for (k, x), (_, y) in zip(trainable_parameters(a), trainable_parameters(b)):
        assert torch.equal(x, y), k


def test_fedsc_private_run__takes_the_same_accountant_and_reports_epsilon(tiny_config):
    """FedSC under client-level DP: its shared second moments of unit-norm encodings have the
    sensitivity n·√fields as DCCO's sums (tested above), so the same mechanism and accountant
    apply, and a run reports the same ε as a DCCO run of the same sampling and noise."""
    from dcco.data.datasets import load_dataset
    from dcco.run.pretraining import Pretraining

    runs = {}
    for method in ("fedsc", "dcco"):
        cfg = load_config(tiny_config(method=method, rounds=2), ["privacy.noise_multiplier=1.5"])
        pt = Pretraining.of(cfg, load_dataset("fashion_mnist", "train", cfg.data.data_dir))
        for _ in range(2):
            assert torch.isfinite(torch.as_tensor(pt.step().loss))
        runs[method] = pt.privacy
    assert runs["fedsc"].stats_bound == pytest.approx(runs["dcco"].stats_bound * (3 / 5) ** 0.5)
    assert runs["fedsc"].epsilon(2) == pytest.approx(runs["dcco"].epsilon(2), rel=1e-12)
