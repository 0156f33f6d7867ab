"""The protocol the core's round runs against: a method (its statistics, its client loss and
that loss's batched form over a round) and the segments that say whose samples are whose.

The methods themselves (``dcco.methods``) implement ``Method``; the core (``algorithm``,
``client``, ``simulator``, ``distributed``) needs only this module, so it imports nothing from
``dcco.methods``. ``dcco.methods.base`` re-exports both names, their old home.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import Tensor

from dcco.core.devices import to_device
from dcco.core.stats import Moments, StatsSpec


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
