"""Additive encoding statistics: the only thing DCCO clients share.

The CCO loss (paper eq. 1) depends on a batch only through the averages ⟨F_i⟩, ⟨F_i²⟩, ⟨G_j⟩,
⟨G_j²⟩ and ⟨F_i G_j⟩; VICReg from statistics needs ⟨F Fᵀ⟩, ⟨G Gᵀ⟩ and ⟨F_i G_i⟩ instead of
the last three. A ``StatsSpec`` says which sums a method's clients share, as named fields with
their shapes; ``EncodingStats`` holds a count plus those sums, so merging clients is addition
and the sample-weighted average of client means falls out of ``merged.moments()``. The reply
checks, the message codec and SecAgg+ read the spec, so a new loss's statistics travel
through them unchanged.

Sums are accumulated in float64: the covariance ⟨F G⟩ − ⟨F⟩⟨G⟩ cancels catastrophically in
float32 when |mean| ≫ std, and the statistics are tiny next to the network, so the cost is nil.
"""

from __future__ import annotations

import math
from collections.abc import ItemsView, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

STATS_DTYPE = torch.float64


Factor = Literal["f", "g"]
Form = Literal["vec", "diag", "outer"]


@dataclass(frozen=True)
class StatField:
    """One shared statistic: the sum over a batch of a per-sample monomial of F and G.

    Attributes:
        name: the quantity, e.g. ``"fg"``; the sum is ``sum_fg``, the average ``mean_fg``.
        left: the first factor, ``"f"`` (F, width d_f) or ``"g"`` (G, width d_g).
        right: the second factor, or None for a first moment.
        form: ``"vec"`` (Σ A, needs right None), ``"diag"`` (Σ A ∘ B, element-wise, equal
            widths) or ``"outer"`` (Σ A Bᵀ).
    """

    name: str
    left: Factor
    right: Factor | None
    form: Form

    def __post_init__(self) -> None:
        if (self.form == "vec") != (self.right is None):
            raise ValueError(f"statistic {self.name}: form 'vec' takes one factor, "
                             f"'diag' and 'outer' two")

    def shape(self, d_f: int, d_g: int) -> tuple[int, ...]:
        width = {"f": d_f, "g": d_g}
        if self.form == "outer":
            return (width[self.left], width[self.right])
        return (width[self.left],)

    def batch_sum(self, f: Tensor, g: Tensor) -> Tensor:
        """The sum over the N samples of (F (N, d_f), G (N, d_g))."""
        a = f if self.left == "f" else g
        if self.right is None:
            return a.sum(0)
        b = f if self.right == "f" else g
        return (a * b).sum(0) if self.form == "diag" else a.T @ b


@dataclass(frozen=True)
class StatsSpec:
    """The statistics a method's clients share: a count and these sums."""

    fields: tuple[StatField, ...]

    @property
    def sum_names(self) -> tuple[str, ...]:
        return tuple(f"sum_{f.name}" for f in self.fields)

    def shapes(self, d_f: int, d_g: int) -> dict[str, tuple[int, ...]]:
        """Each sum's name and shape for encodings of widths d_f and d_g."""
        return {f"sum_{f.name}": f.shape(d_f, d_g) for f in self.fields}

    def num_values(self, d_f: int, d_g: int) -> int:
        """Numbers in one client's statistics (the count included): what a message carries."""
        return 1 + sum(math.prod(s) for s in self.shapes(d_f, d_g).values())


CCO_STATS = StatsSpec((
    StatField("f", "f", None, "vec"),
    StatField("g", "g", None, "vec"),
    StatField("ff", "f", "f", "diag"),
    StatField("gg", "g", "g", "diag"),
    StatField("fg", "f", "g", "outer"),
))
"""The five sums of the CCO loss (paper eq. 1): Σ F, Σ G, Σ F², Σ G², Σ F Gᵀ."""

VICREG_STATS = StatsSpec((
    StatField("f", "f", None, "vec"),
    StatField("g", "g", None, "vec"),
    StatField("fft", "f", "f", "outer"),
    StatField("ggt", "g", "g", "outer"),
    StatField("fg_diag", "f", "g", "diag"),
))
"""The sums of VICReg (Bardes et al. 2022): Σ F, Σ G, Σ F Fᵀ, Σ G Gᵀ and Σ F_i G_i (the
invariance term needs only the diagonal of Σ F Gᵀ; the encodings have equal widths)."""


SPECTRAL_STATS = StatsSpec((
    StatField("fft", "f", "f", "outer"),
    StatField("ggt", "g", "g", "outer"),
    StatField("fg_diag", "f", "g", "diag"),
))
"""The sums of the spectral contrastive loss (HaoChen et al. 2021; FedSC, Jing et al. 2024):
Σ F Fᵀ, Σ G Gᵀ and Σ F_i G_i. No means: the loss is of uncentred second moments."""


class _Named:
    """Tensors by name, readable as attributes (``s.sum_fg``), in a fixed order."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Tensor] | None = None, **named: Tensor) -> None:
        object.__setattr__(self, "_values", dict(values or {}) | named)

    def __getattr__(self, name: str) -> Tensor:
        try:
            return object.__getattribute__(self, "_values")[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no {name!r}") from None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __getitem__(self, name: str) -> Tensor:
        return self._values[name]

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def items(self) -> ItemsView[str, Tensor]:
        return self._values.items()

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={tuple(v.shape)}" for k, v in self._values.items())
        return f"{type(self).__name__}({shapes})"


class Moments(_Named):
    """Batch averages of two encodings: the arguments of a statistics loss, by name
    (``mean_f``, ``mean_fg``, ...). ``count`` is the number of samples averaged, a float64
    scalar tensor, kept apart from the averages: losses with an unbiased variance
    (VICReg) need it.
    """

    __slots__ = ("count",)

    def __init__(self, values: Mapping[str, Tensor] | None = None, count: Tensor | None = None,
                 **named: Tensor) -> None:
        super().__init__(values, **named)
        object.__setattr__(self, "count", count)

    def tensors(self) -> tuple[Tensor, ...]:
        """The averages, in the spec's order (the count is not among them)."""
        return tuple(self._values.values())

    def detach(self) -> Moments:
        return Moments({k: v.detach() for k, v in self.items()}, self.count)


class EncodingStats(_Named):
    """Count and sums of one or more clients' encodings; merging is ``+``.

    Attributes:
        count: number of samples N, a float64 scalar tensor.
        sum_<name>: the sums of the spec that made them (``encoding_stats``), e.g. ``sum_f``
            (d_f,) and ``sum_fg`` (d_f, d_g) for the CCO loss.
    """

    __slots__ = ()

    def __init__(self, values: Mapping[str, Tensor] | None = None, **named: Tensor) -> None:
        super().__init__(values, **named)
        if "count" not in self._values:
            raise ValueError("EncodingStats needs a count")

    def __add__(self, other: EncodingStats) -> EncodingStats:
        if list(self) != list(other):
            raise ValueError(f"cannot merge statistics of different kinds: {list(self)} and "
                             f"{list(other)}")
        return EncodingStats({k: v + other[k] for k, v in self.items()})

    def tensors(self) -> tuple[Tensor, ...]:
        """The count, then the sums in the spec's order."""
        return tuple(self._values.values())

    def as_dict(self) -> dict[str, Tensor]:
        """The count and sums by name, e.g. for a message or a checkpoint."""
        return dict(self._values)

    @classmethod
    def from_dict(cls, tensors: Mapping[str, Tensor]) -> EncodingStats:
        return cls(tensors)

    def detach(self) -> EncodingStats:
        return EncodingStats({k: v.detach() for k, v in self.items()})

    def moments(self) -> Moments:
        """The averages: each ``sum_x`` divided by the count, as ``mean_x``."""
        n = self.count
        return Moments({"mean_" + k[len("sum_"):]: v / n for k, v in self.items()
                        if k != "count"}, count=n)


def encoding_stats(f: Tensor, g: Tensor, spec: StatsSpec = CCO_STATS) -> EncodingStats:
    """Count and sums of a batch of encoding pairs, in float64 and differentiable.

    Args:
        f: encodings F of the first inputs, shape (N, d_f).
        g: encodings G of the second inputs, shape (N, d_g).
        spec: which sums (default: the CCO loss's five).
    """
    f64, g64 = f.to(STATS_DTYPE), g.to(STATS_DTYPE)
    count = torch.full((), float(f.shape[0]), dtype=STATS_DTYPE, device=f.device)
    return EncodingStats({"count": count} | {f"sum_{s.name}": s.batch_sum(f64, g64)
                                             for s in spec.fields})


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
    The count is the aggregate's: the combined statistics stand for the aggregate's batch.
    """
    return Moments({k: lo + (aggregate[k] - lo).detach() for k, lo in local.items()},
                   count=aggregate.count)


def refreshed(local: Moments, start: Moments, aggregate: Moments, weight: float) -> Moments:
    """The aggregate with one client's share followed as the client steps:
    S_A + w (S_k − S_k⁰), with w = N_k/N and S_k⁰ its statistics where the round started.

    With several local steps, the anchored statistics (``anchored``) keep the value S_A
    whatever the client does, so its objective is linear in its own statistics and unbounded;
    here the other clients' statistics stay fixed at their round-start values while the
    client's own contribution moves with its weights.
    """
    return Moments({k: aggregate[k] + weight * (lo - start[k].detach())
                    for k, lo in local.items()}, count=aggregate.count)


def others_mix(local: Moments, start: Moments, aggregate: Moments, own: float,
               alpha: float) -> Moments:
    """FedSC's local statistics: α S_k + (1 − α) S_ext, with S_ext = (S_A − w S_k⁰)/(1 − w)
    the other clients' average (w = N_k/N, S_k⁰ the client's statistics where the round
    started). At α = w it is ``refreshed``'s S_A + w (S_k − S_k⁰), the exact step; FedSC's
    schedule of α (1 to 0.2 over the run) is not."""
    if not own < 1:
        return Moments(dict(local.items()), count=aggregate.count)
    return Moments({k: alpha * lo + (1 - alpha) * (aggregate[k] - own * start[k].detach())
                    / (1 - own) for k, lo in local.items()}, count=aggregate.count)


def moving_average(previous: Moments, new: Moments, decay: float) -> Moments:
    """β·previous + (1 − β)·new, average by average; the count is the new one's (the batch
    the statistics stand for)."""
    return Moments({k: decay * previous[k] + (1.0 - decay) * v for k, v in new.items()},
                   count=new.count)
