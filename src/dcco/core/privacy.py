"""Client-level differential privacy for the shared statistics and the updates (DP-FedAvg
style, McMahan et al. 2018), with its accounting.

Every round releases up to two sums over the round's K sampled clients: the statistics
(DCCO, DVICReg: the server's S_A) and the updates (every federated method). Each is made
private the same way: bound every client's contribution, sum, add Gaussian noise at the
server (central DP: the server is trusted to add it; under SecAgg+ it sees only the clipped
sum before noising it).

- **Statistics.** Each encoding F_n and G_n is scaled to unit L2 norm before the statistics
  (``DualEncoder.unit_encodings``; the loss sees the same encodings). One sample's
  contribution to every sum of a ``StatsSpec`` is then at most 1 in L2 norm (‖F‖ = 1,
  ‖F ∘ F‖ ≤ 1, ‖F Gᵀ‖_F = 1), so a client of at most n samples moves the concatenated sums
  by at most n·√(fields). The count is public (every client holds the same number of
  samples). The cost: the loss is the CCO (or VICReg) loss of sphere-projected encodings, a
  different objective from the unnormalised one; the cross-correlation's invariance to
  per-dimension scale does not make it the same, since the projection rescales per sample.
- **Updates.** Each client's update (all parameters, one vector) is clipped to L2 norm
  ``update_clip`` (C_u); with K equal-size clients the round's average moves by at most
  C_u / K when one client's data changes. Clipping needs each client's own update, so the
  batched executor runs DP rounds client by client.
- **Noise.** Each release gets N(0, (σ·sensitivity)²) per coordinate, σ =
  ``noise_multiplier``, drawn from a generator seeded by (seed, round, release), so a resumed
  run draws the same noise.
- **Accounting** (Google's ``dp-accounting``, RDP): clients are sampled K of M without
  replacement (what ``dcco.run.sampling.sample_clients`` does), so the neighbouring relation is
  "replace one client's data" and the event is ``SampledWithoutReplacementDpEvent``; under
  replacement a sum's sensitivity doubles, so each release is a Gaussian of noise multiplier
  σ/2. A round's releases use the same sample and compose inside it; rounds compose. With
  stale statistics, round 0's extra statistics exchange is one more release.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dcco.core.devices import to_device
from dcco.core.seeding import generator
from dcco.core.stats import EncodingStats, StatsSpec


def stats_sensitivity(spec: StatsSpec, max_samples: int) -> float:
    """L2 sensitivity of the summed statistics to one client (add or remove) of at most
    ``max_samples`` samples with unit-norm encodings: max_samples · √(fields)."""
    return max_samples * math.sqrt(len(spec.fields))


def clip_update(delta: dict[str, Tensor], bound: float) -> dict[str, Tensor]:
    """A client's update scaled to L2 norm at most ``bound`` (all tensors as one vector)."""
    norm = torch.sqrt(sum((v.double() ** 2).sum() for v in delta.values()))
    scale = torch.clamp(bound / (norm + 1e-12), max=1.0)
    return {k: v * scale.to(v.dtype) for k, v in delta.items()}


def _noise_like(value: Tensor, std: float, gen: torch.Generator) -> Tensor:
    """N(0, std²) of ``value``'s shape, drawn on the CPU in float64 (the same numbers on any
    device), then moved to ``value``'s device and dtype."""
    draw = torch.randn(value.shape, generator=gen, dtype=torch.float64) * std
    return to_device(draw, value.device).to(value.dtype)


@dataclass(frozen=True)
class RoundNoise:
    """The Gaussian noise of one round's releases, seeded by (seed, round, release).

    Attributes:
        seed, round_index: the run seed and the round (0-based).
        stats_std: the standard deviation added to every summed statistic.
        update_std: the standard deviation added to every coordinate of the averaged update.
    """

    seed: int
    round_index: int
    stats_std: float
    update_std: float

    def statistics(self, stats: EncodingStats, spec: StatsSpec,
                   release: str = "stats") -> EncodingStats:
        """The merged sums plus noise (the count is public and left as it is), then made
        consistent (``consistent``: post-processing, which costs no privacy)."""
        gen = generator(self.seed, "privacy", release, self.round_index)
        noisy = {k: v if k == "count" else v + _noise_like(v, self.stats_std, gen)
                 for k, v in stats.items()}
        return consistent(EncodingStats(noisy), spec)

    def update(self, pseudo_gradient: dict[str, Tensor]) -> dict[str, Tensor]:
        """The averaged update (as the pseudo-gradient) plus noise, parameter by parameter in
        the model's order."""
        gen = generator(self.seed, "privacy", "update", self.round_index)
        return {k: v + _noise_like(v, self.update_std, gen) for k, v in pseudo_gradient.items()}


def consistent(stats: EncodingStats, spec: StatsSpec) -> EncodingStats:
    """Noisy sums with every second moment of one encoding raised to at least its first
    moment's square over the count (Σ F_i² ≥ (Σ F_i)²/N, and the diagonal of Σ F Fᵀ
    likewise), so that no variance is negative: noise can make one so, and a loss would take
    its square root."""
    values = dict(stats.items())
    n = values["count"]
    firsts = {f.left: values[f"sum_{f.name}"] for f in spec.fields if f.form == "vec"}
    for f in spec.fields:
        if f.right != f.left or f.left not in firsts or f.form == "vec":
            continue
        floor = firsts[f.left] ** 2 / n
        key = f"sum_{f.name}"
        if f.form == "diag":
            values[key] = torch.maximum(values[key], floor)
        else:
            diag = torch.maximum(torch.diagonal(values[key]), floor)
            values[key] = values[key] - torch.diag_embed(torch.diagonal(values[key])) \
                + torch.diag_embed(diag)
    return EncodingStats(values)



def _accountant(noise_multiplier: float, population: int, sample: int, rounds: int,
                releases: int, extra_releases: int = 0):
    """dp-accounting's RDP accountant with this run's events composed."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    def sampled(k: int) -> dp_accounting.DpEvent:
        gaussians = [dp_accounting.GaussianDpEvent(noise_multiplier / 2)] * k
        return dp_accounting.SampledWithoutReplacementDpEvent(
            population, sample, dp_accounting.ComposedDpEvent(gaussians))

    events = [dp_accounting.SelfComposedDpEvent(sampled(releases), rounds)]
    if extra_releases:
        events.append(sampled(extra_releases))
    accountant = rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.ComposedDpEvent(events))
    return accountant


class Ledger:
    """ε after any number of rounds, without re-deriving a round's RDP each time: the RDP
    of one round (and of the extra releases) from ``dp-accounting`` once, composed for r
    rounds as the library composes ``SelfComposedDpEvent`` (r times the round's RDP) and
    converted by its own ``compute_epsilon``. ``epsilon`` recomputes everything per call;
    a run asks at every metrics record, so it keeps a ledger."""

    def __init__(self, noise_multiplier: float, population: int, sample: int, releases: int,
                 delta: float, extra_releases: int = 0) -> None:
        self.sigma, self.delta, self.extra = noise_multiplier, delta, extra_releases
        if noise_multiplier > 0:
            one = _accountant(noise_multiplier, population, sample, 1, releases)
            self.orders, self.round_rdp = one._orders, one._rdp
            self.extra_rdp = (_accountant(noise_multiplier, population, sample, 0, releases,
                                          extra_releases)._rdp if extra_releases else 0.0)

    def epsilon(self, rounds: int) -> float:
        """ε at ``delta`` after ``rounds`` rounds (the extra releases counted from round 1)."""
        if rounds == 0:
            return 0.0
        if self.sigma <= 0:
            return math.inf
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        rdp = rounds * self.round_rdp + (self.extra_rdp if self.extra else 0.0)
        return float(compute_epsilon(self.orders, rdp, self.delta)[0])


def epsilon(noise_multiplier: float, population: int, sample: int, rounds: int,
            releases: int, delta: float, extra_releases: int = 0) -> float:
    """ε at ``delta`` after ``rounds`` rounds of ``releases`` Gaussian releases each, every
    round on ``sample`` of ``population`` clients drawn without replacement (replace-one
    neighbours; RDP accountant of ``dp-accounting``); ``extra_releases`` once more on one
    round's sample (stale statistics' first exchange). 0 rounds: 0; σ = 0: ∞."""
    if rounds == 0 and not extra_releases:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    return float(_accountant(noise_multiplier, population, sample, rounds, releases,
                             extra_releases).get_epsilon(delta))


def solve_noise_multiplier(target_epsilon: float, population: int, sample: int, rounds: int,
                           releases: int, delta: float, extra_releases: int = 0) -> float:
    """The smallest σ (to 0.1 %) whose ``epsilon`` after all rounds is at most the target;
    bisection on the library's accountant."""
    def eps(sigma: float) -> float:
        return epsilon(sigma, population, sample, rounds, releases, delta, extra_releases)

    low, high = 1e-2, 1.0
    while eps(high) > target_epsilon:
        low, high = high, high * 2
        if high > 1e6:
            raise ValueError(f"privacy.target_epsilon = {target_epsilon} is out of reach "
                             f"(σ would exceed 1e6)")
    while high - low > 1e-3 * high:
        mid = (low + high) / 2
        low, high = (low, mid) if eps(mid) <= target_epsilon else (mid, high)
    return high


__all__ = ["Ledger", "RoundNoise", "clip_update", "epsilon", "solve_noise_multiplier",
           "stats_sensitivity"]
