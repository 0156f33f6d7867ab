"""What every method provides: the statistics its clients share, the loss a client optimises,
and that loss's batched form over a round.

A method is a small object around the math (fedjax style). ``dcco.core.algorithm.Algorithm`` puts a
method together with the round's settings (local steps, staleness) and owns the sequence of a
round; the execution backend decides how clients run. The method says:

- ``stats``: which statistics a client shares (a ``StatsSpec`` of named sums), or None for
  methods without a statistics exchange;
- ``client_loss``: the objective of ONE client on its own encodings (what a device computes),
  given the aggregated statistics S_A when the method shares statistics;
- ``round_loss``: Σ_k (N_k / N) · client_loss_k over all of a round's clients at once, from the
  concatenated encodings and per-client segments. Its gradient is the sample-weighted average
  of the clients' gradients, i.e. the server's aggregate of one local SGD step per client
  (divided by the local learning rate). ``MethodBase.round_loss`` computes it client by client;
  a method overrides it with a faster exact form where one exists, with the argument in its
  docstring.

The two must agree; ``tests/test_rounds.py`` checks it for every registered method.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from dcco.core.method import Method, Segments  # noqa: F401 (re-exported: their old home)
from dcco.core.stats import Moments, StatsSpec, anchored, encoding_stats, others_mix, refreshed
from dcco.moved import moved_names


class MethodBase:
    """Defaults shared by the methods: ``needs_statistics`` from ``stats``, and the round loss
    computed client by client (exact for any client loss; methods override it with a faster
    exact form where one exists)."""

    stats: ClassVar[StatsSpec | None] = None
    similarity: ClassVar[str] = "standardized"
    stateful: ClassVar[bool] = False
    """Whether a client keeps state between the rounds it takes part in (FedU's and FedEMA's
    own model, MoCo's queue: ``dcco.core.client_state``)."""
    uses_eps: ClassVar[bool] = False
    """Whether the loss adds ``loss.eps`` inside each variance (the CCO loss)."""

    def variance_eps(self) -> float:
        """The ε the loss adds inside each encoding dimension's variance (``loss.eps`` for
        the CCO loss; 0 for a loss without one): a dimension whose variance is under it is
        dead to the loss (``dcco.core.collapse``)."""
        return float(self.loss.eps) if self.uses_eps else 0.0

    @property
    def needs_statistics(self) -> bool:
        """True if a round aggregates encoding statistics (DCCO's extra exchange)."""
        return self.stats is not None

    def round_loss(self, f: Tensor, g: Tensor, segments: Segments,
                   shared: Moments | None) -> Tensor:
        """Σ_k (N_k/N) client_loss_k, one client at a time (float64); ``client_loss`` is the
        method's own."""
        weights = segments.weights(device=f.device)
        sizes = segments.counts.tolist()
        losses = [self.client_loss(a, b, shared).to(torch.float64)
                  for a, b in zip(f.split(sizes), g.split(sizes), strict=True)]
        return (weights * torch.stack(losses)).sum()


class AnchoredMethod(MethodBase):
    """A loss of shared statistics, DCCO's way: client k steps on L(S_k + stopgrad(S_A − S_k))
    (``stats.anchored``), so the loss sees the round's statistics while gradients flow only
    through the client's own samples. A method gives ``stats`` and ``statistics_loss(m)``, the
    loss as a function of batch averages ``m`` (and their count)."""

    def client_loss(self, f: Tensor, g: Tensor, shared: Moments | None) -> Tensor:
        if shared is None:
            raise ValueError(f"{self.name} needs the aggregated statistics S_A of the round")
        local = encoding_stats(f, g, self.stats).moments()
        return self.statistics_loss(anchored(local, shared))

    def refreshed_loss(self, f: Tensor, g: Tensor, shared: Moments, start: Moments,
                       weight: float) -> Tensor:
        """L(S_A + w (S_k − S_k⁰)) / w (``stats.refreshed``): a local step's loss with the
        client's own statistics followed (``train.local_statistics = "own"``). At the round's
        start its gradient is the anchored loss's; ``start`` is S_k⁰ of the same samples."""
        local = encoding_stats(f, g, self.stats).moments()
        return self.statistics_loss(refreshed(local, start, shared, weight)) / weight

    def others_loss(self, f: Tensor, g: Tensor, shared: Moments, start: Moments, own: float,
                    alpha: float) -> Tensor:
        """L(α S_k + (1 − α) S_ext) / α (``stats.others_mix``): FedSC's local objective with
        its α; at α = N_k/N it is ``refreshed_loss``."""
        local = encoding_stats(f, g, self.stats).moments()
        return self.statistics_loss(others_mix(local, start, shared, own, alpha)) / alpha

    def round_loss(self, f: Tensor, g: Tensor, segments: Segments,
                   shared: Moments | None) -> Tensor:
        """Σ_k w_k L(S_k + sg(S_A − S_k)) for all clients at once, exactly in value and gradient.

        Every client's combined statistics equal S_A (count included), so its gradient with
        respect to its own averages is the same ∇L(S_A), and Σ_k w_k ⟨∇L(S_A), ∂S_k⟩ =
        ⟨∇L(S_A), ∂(Σ_k w_k S_k)⟩. With w_k = N_k/N, Σ_k w_k S_k is the pooled average of the
        concatenated batch, so one anchored loss on the pooled averages has the round's
        aggregate gradient — the paper's appendix A argument, used here as an implementation,
        and valid for any loss of the averages. (``segments`` only fixes the weights, which
        the pooled average already carries.)
        """
        if shared is None:
            raise ValueError(f"{self.name} needs the aggregated statistics S_A of the round")
        pooled = encoding_stats(f, g, self.stats).moments()
        return self.statistics_loss(anchored(pooled, shared))


__getattr__ = moved_names(__name__)  # old names of dcco.config's classes, warned
