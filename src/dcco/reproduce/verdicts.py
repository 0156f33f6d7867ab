"""Verdicts between two methods, paired by seed, in words that each have one meaning.

Two cells of the same seed share their initial weights, their clients' partition and the
order in which clients are drawn, so the comparison takes the difference seed by seed
(A − B, in points) and judges its mean against its standard error (SE = sd / √n):

- **leads**: A is ahead of B on every seed, and the mean difference is more than twice its
  standard error;
- **trails**: the same with A behind B on every seed (B leads A);
- **level**: neither: the seeds disagree in sign, or the mean is within twice its standard
  error. "Level" says the seeds run cannot tell the two apart, not that they are equal;
- **passes** / **under**: "leads" / "trails" when B is a floor (the raw pixels or the untrained
  encoder) rather than another method.

Fewer than two shared seeds give no verdict (``None``): one difference has no spread.

Each comparison also carries the paired t (mean / SE) and its two-sided p under Student's t
with n − 1 degrees of freedom (``Paired.t``, ``Paired.p``), so that a reader can judge how
strong a verdict is; ``holm`` says which of a table's comparisons survive a Holm correction
for their number.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal

Word = Literal["leads", "trails", "level"]

FLOOR_WORDS = {"leads": "passes", "trails": "under", "level": "level"}
"""The words for a comparison against a floor."""


@dataclass(frozen=True)
class Paired:
    """A − B on the seeds both have, in points (percent)."""

    differences: tuple[float, ...]
    """Per shared seed, in seed order."""

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.differences)

    @property
    def sd(self) -> float:
        """The sample standard deviation (n − 1); 0 for one seed."""
        return statistics.stdev(self.differences) if self.n > 1 else 0.0

    @property
    def se(self) -> float:
        return self.sd / math.sqrt(self.n)

    @property
    def ahead(self) -> int:
        """Seeds on which A is ahead of B."""
        return sum(d > 0 for d in self.differences)

    @property
    def word(self) -> Word | None:
        """The verdict (module docstring); None with fewer than two seeds."""
        if self.n < 2:
            return None
        decisive = abs(self.mean) > 2 * self.se
        if decisive and all(d > 0 for d in self.differences):
            return "leads"
        if decisive and all(d < 0 for d in self.differences):
            return "trails"
        return "level"

    @property
    def t(self) -> float | None:
        """The paired t, mean / SE (±inf for differences all alike and not 0); None with fewer
        than two seeds."""
        if self.n < 2:
            return None
        if self.se == 0:
            return 0.0 if self.mean == 0 else math.copysign(math.inf, self.mean)
        return self.mean / self.se

    @property
    def p(self) -> float | None:
        """The two-sided p of ``t`` under Student's t with n − 1 degrees of freedom."""
        return None if self.t is None else two_sided_p(self.t, self.n - 1)

    def floor_word(self) -> str | None:
        """The verdict against a floor: passes, under or level."""
        return None if self.word is None else FLOOR_WORDS[self.word]

    def __str__(self) -> str:
        """e.g. ``+1.2 ± 0.4, ahead on 3/3`` (mean ± sd over seeds)."""
        sd = f" ± {self.sd:.1f}" if self.n > 1 else ""
        return f"{round(self.mean, 1) + 0.0:+.1f}{sd}, ahead on {self.ahead}/{self.n}"


def paired(a: dict[int, float], b: dict[int, float]) -> Paired | None:
    """A − B over the seeds both record (seed → accuracy in percent); None if they share none."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    return Paired(tuple(a[s] - b[s] for s in seeds))


def two_sided_p(t: float, df: int) -> float:
    """P(|T| ≥ |t|) for Student's T with ``df`` (a positive integer) degrees of freedom, from
    the closed form of its distribution function for integer degrees of freedom (Abramowitz
    and Stegun 26.7.3-4): with θ = atan(|t| / √df), A = P(|T| < |t|) is
    (2/π)(θ + sin θ Σ_k c_k cos^(2k+1) θ) for odd df and sin θ Σ_k c_k cos^(2k) θ for even.

    >>> round(two_sided_p(2.0, 2), 4), round(two_sided_p(12.706, 1), 3)
    (0.1835, 0.05)
    """
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a positive integer, got {df}")
    if math.isinf(t):
        return 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    c, s = math.cos(theta), math.sin(theta)
    if df % 2:
        term, total = c, c if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):  # c_k = 2·4···2k / (3·5···(2k+1))
            term *= c * c * (2 * k) / (2 * k + 1)
            total += term
        inside = 2 / math.pi * (theta + s * total)
    else:
        term = total = 1.0
        for k in range(1, df // 2):  # c_k = 1·3···(2k−1) / (2·4···2k)
            term *= c * c * (2 * k - 1) / (2 * k)
            total += term
        inside = s * total
    return min(1.0, max(0.0, 1.0 - inside))


def holm(ps: list[float], alpha: float = 0.05) -> list[bool]:
    """Which of ``ps`` (the p of each of a table's m comparisons) survive Holm's step-down
    correction at family-wise level ``alpha``: the i-th smallest survives if it and every
    smaller one is at most alpha / (m − i + 1) (i from 1).

    >>> holm([0.01, 0.04, 0.03, 0.2])
    [True, False, False, False]
    """
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    survives = [False] * len(ps)
    for rank, i in enumerate(order):
        if ps[i] > alpha / (len(ps) - rank):
            break
        survives[i] = True
    return survives
