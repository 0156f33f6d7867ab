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

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import Tensor

from dcco.config.loss import LossConfig  # noqa: F401 (re-exported: its old home)
from dcco.core.devices import to_device
from dcco.core.stats import Moments, StatsSpec, anchored, encoding_stats, others_mix, refreshed


@dataclass(frozen=True)
class Segments:
    """Which of a round's concatenated samples belong to which client.

    Attributes:
        ids: int64 (N,), the client slot (0..K−1) of each sample.
        counts: int64 (K,), N_k, the number of samples of each client.
    """

    ids: Tensor
    counts: Tensor

    def __post_init__(self) -> None:
        # the round's bookkeeping (sizes, splits) reads the counts: on the host, that never
        # waits for the device
        object.__setattr__(self, "counts", self.counts.cpu())

    @property
    def num_clients(self) -> int:
        return int(self.counts.shape[0])

    @property
    def num_samples(self) -> int:
        return int(self.ids.shape[0])

    def weights(self, dtype: torch.dtype = torch.float64,
                device: torch.device | str = "cpu") -> Tensor:
        """N_k / N, the FedAvg weight of each client, shape (K,), on ``device``."""
        counts = self.counts.to(dtype)
        return to_device(counts / counts.sum(), device)

    @classmethod
    def from_counts(cls, counts: Tensor | list[int]) -> Segments:
        counts = torch.as_tensor(counts, dtype=torch.int64)
        ids = torch.repeat_interleave(torch.arange(len(counts)), counts)
        return cls(ids=ids, counts=counts)

    def to(self, device: torch.device | str) -> Segments:
        """The ids on ``device`` (without waiting for it); the counts stay on the host."""
        return Segments(to_device(self.ids, device), self.counts)


class Method(Protocol):
    """A pretraining method. See the module docstring for the contract."""

    name: ClassVar[str]
    federated: ClassVar[bool]
    """False for centralized training on pooled minibatches."""
    stats: ClassVar[StatsSpec | None]
    """The statistics a client shares before its step (DCCO's first exchange), or None."""
    min_client_samples: ClassVar[int]
    """Smallest client a round can use (within-client losses need two samples)."""
    stateful: ClassVar[bool]
    """Whether a client keeps state between its rounds (``MethodBase.stateful``)."""
    default_projector: ClassVar[tuple[int, ...]]
    """Projector widths used when the model config leaves them unset (paper §4)."""
    loss_kind: ClassVar[str]
    """What the logged loss measures; methods whose kinds differ have losses that cannot be
    compared (plots put them in separate panels)."""
    similarity: ClassVar[str]
    """The space cross-modal retrieval compares encodings in (``dcco.evaluate.Similarity``):
    "standardized" for losses of standardised statistics, "cosine" for contrastive ones."""

    def client_loss(self, f: Tensor, g: Tensor, shared: Moments | None) -> Tensor:
        """One client's objective on its own encodings (N_k, d); ``shared`` is S_A or None."""
        ...

    def variance_eps(self) -> float:
        """The ε the loss adds inside each variance (``MethodBase.variance_eps``)."""
        ...

    def round_loss(self, f: Tensor, g: Tensor, segments: Segments,
                   shared: Moments | None) -> Tensor:
        """Σ_k (N_k/N) client_loss_k over a round's concatenated encodings (N, d)."""
        ...


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
