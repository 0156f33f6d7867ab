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
