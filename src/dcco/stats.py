"""Additive encoding statistics: the only thing DCCO clients share.

The CCO loss (paper eq. 1) depends on a batch only through the averages ⟨F_i⟩, ⟨F_i²⟩, ⟨G_j⟩,
⟨G_j²⟩ and ⟨F_i G_j⟩. ``EncodingStats`` holds them as a count plus sums, so merging clients is
addition and the sample-weighted average of client means falls out of ``merged.moments()``.

Sums are accumulated in float64: the covariance ⟨F G⟩ − ⟨F⟩⟨G⟩ cancels catastrophically in
float32 when |mean| ≫ std, and the statistics are tiny next to the network, so the cost is nil.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

STATS_DTYPE = torch.float64


@dataclass(frozen=True)
class Moments:
    """Batch averages of two encodings F (d_f) and G (d_g): the arguments of the CCO loss.

    Attributes:
        mean_f: ⟨F_i⟩, shape (d_f,).
        mean_g: ⟨G_j⟩, shape (d_g,).
        mean_ff: ⟨F_i²⟩, shape (d_f,).
        mean_gg: ⟨G_j²⟩, shape (d_g,).
        mean_fg: ⟨F_i G_j⟩, shape (d_f, d_g).
    """

    mean_f: Tensor
    mean_g: Tensor
    mean_ff: Tensor
    mean_gg: Tensor
    mean_fg: Tensor

    def tensors(self) -> tuple[Tensor, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def detach(self) -> Moments:
        return Moments(*(t.detach() for t in self.tensors()))


@dataclass(frozen=True)
class EncodingStats:
    """Count and sums of one or more clients' encodings; merging is ``+``.

    Attributes:
        count: number of samples N, a float64 scalar tensor.
        sum_f: Σ_n F^n, shape (d_f,).
        sum_g: Σ_n G^n, shape (d_g,).
        sum_ff: Σ_n (F^n)², shape (d_f,).
        sum_gg: Σ_n (G^n)², shape (d_g,).
        sum_fg: Σ_n F^n (G^n)ᵀ, shape (d_f, d_g).
    """

    count: Tensor
    sum_f: Tensor
    sum_g: Tensor
    sum_ff: Tensor
    sum_gg: Tensor
    sum_fg: Tensor

    def __add__(self, other: EncodingStats) -> EncodingStats:
        return EncodingStats(*(a + b for a, b in zip(self.tensors(), other.tensors())))

    def tensors(self) -> tuple[Tensor, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def as_dict(self) -> dict[str, Tensor]:
        """The fields by name, e.g. for a message or a checkpoint."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, tensors: dict[str, Tensor]) -> EncodingStats:
        return cls(**{f.name: tensors[f.name] for f in fields(cls)})

    def detach(self) -> EncodingStats:
        return EncodingStats(*(t.detach() for t in self.tensors()))

    def moments(self) -> Moments:
        """The averages: sums divided by the count."""
        n = self.count
        return Moments(
            self.sum_f / n, self.sum_g / n, self.sum_ff / n, self.sum_gg / n, self.sum_fg / n
        )


def encoding_stats(f: Tensor, g: Tensor) -> EncodingStats:
    """Count and sums of a batch of encoding pairs, in float64 and differentiable.

    Args:
        f: encodings F of the first inputs, shape (N, d_f).
        g: encodings G of the second inputs, shape (N, d_g).
    """
    f64, g64 = f.to(STATS_DTYPE), g.to(STATS_DTYPE)
    count = torch.tensor(float(f.shape[0]), dtype=STATS_DTYPE, device=f.device)
    return EncodingStats(
        count=count,
        sum_f=f64.sum(0),
        sum_g=g64.sum(0),
        sum_ff=(f64 * f64).sum(0),
        sum_gg=(g64 * g64).sum(0),
        sum_fg=f64.T @ g64,
    )


def merge(stats: list[EncodingStats]) -> EncodingStats:
    """The statistics of the union of the clients' samples: the sum of their statistics."""
    if not stats:
        raise ValueError("merge() needs at least one EncodingStats")
    total = stats[0]
    for s in stats[1:]:
        total = total + s
    return total


def anchored(local: Moments, aggregate: Moments) -> Moments:
    """DCCO's combined statistics ⟨·⟩_C = ⟨·⟩_k + stopgrad(⟨·⟩_A − ⟨·⟩_k) (paper Fig. 1, eq. 2).

    The value equals the aggregate; the gradient flows only through the client's own samples.
    """
    return Moments(
        *(lo + (ag - lo).detach() for lo, ag in zip(local.tensors(), aggregate.tensors()))
    )
