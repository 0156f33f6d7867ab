"""What every method provides: the loss a client optimises and its batched form over a round.

A method is a small object around the math (fedjax style). The execution backend decides how
clients run; the method only says what each client's objective is:

- ``client_loss``: the objective of ONE client on its own encodings (what a device computes);
- ``round_loss``: Σ_k (N_k / N) · client_loss_k over all of a round's clients at once, from the
  concatenated encodings and per-client segments. Its gradient is the sample-weighted average
  of the clients' gradients, i.e. the server's aggregate of one local SGD step per client
  (divided by the local learning rate).

The two must agree; ``tests/test_rounds.py`` checks it for every registered method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import Tensor

from dcco.losses import BN_EPS, LAMBDA, TEMPERATURE
from dcco.stats import Moments


@dataclass(frozen=True)
class LossConfig:
    """Loss hyper-parameters, the paper's values by default (appendix B)."""

    lambd: float = LAMBDA
    """λ of the CCO loss (paper eq. 1)."""
    eps: float = BN_EPS
    """Variance epsilon, placed as BatchNorm places it."""
    temperature: float = TEMPERATURE
    """NT-Xent temperature τ."""

    def __post_init__(self) -> None:
        if not self.lambd >= 0:
            raise ValueError(f"loss.lambd must be >= 0, got {self.lambd}")
        if not self.eps > 0:
            raise ValueError(f"loss.eps must be > 0, got {self.eps}")
        if not self.temperature > 0:
            raise ValueError(f"loss.temperature must be > 0, got {self.temperature}")


@dataclass(frozen=True)
class Segments:
    """Which of a round's concatenated samples belong to which client.

    Attributes:
        ids: int64 (N,), the client slot (0..K−1) of each sample.
        counts: int64 (K,), N_k, the number of samples of each client.
    """

    ids: Tensor
    counts: Tensor

    @property
    def num_clients(self) -> int:
        return int(self.counts.shape[0])

    @property
    def num_samples(self) -> int:
        return int(self.ids.shape[0])

    def weights(self, dtype: torch.dtype = torch.float64) -> Tensor:
        """N_k / N, the FedAvg weight of each client, shape (K,)."""
        counts = self.counts.to(dtype)
        return counts / counts.sum()

    @classmethod
    def from_counts(cls, counts: Tensor | list[int]) -> Segments:
        counts = torch.as_tensor(counts, dtype=torch.int64)
        ids = torch.repeat_interleave(torch.arange(len(counts)), counts)
        return cls(ids=ids, counts=counts)

    def to(self, device: torch.device | str) -> Segments:
        return Segments(self.ids.to(device), self.counts.to(device))


class Method(Protocol):
    """A pretraining method. See the module docstring for the contract."""

    name: ClassVar[str]
    federated: ClassVar[bool]
    """False for centralized training on pooled minibatches."""
    needs_statistics: ClassVar[bool]
    """True if a round first aggregates encoding statistics (DCCO's extra exchange)."""
    min_client_samples: ClassVar[int]
    """Smallest client a round can use (within-client losses need two samples)."""
    default_projector: ClassVar[tuple[int, ...]]
    """Projector widths used when the model config leaves them unset (paper §4)."""
    loss_kind: ClassVar[str]
    """What the logged loss measures; methods whose kinds differ have losses that cannot be
    compared (plots put them in separate panels)."""

    def client_loss(self, f: Tensor, g: Tensor, shared: Moments | None) -> Tensor:
        """One client's objective on its own encodings (N_k, d); ``shared`` is S_A or None."""
        ...

    def round_loss(self, f: Tensor, g: Tensor, segments: Segments,
                   shared: Moments | None) -> Tensor:
        """Σ_k (N_k/N) client_loss_k over a round's concatenated encodings (N, d)."""
        ...
