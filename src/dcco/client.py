"""One client's work, as a device runs it: statistics of its encodings and one local step.

The simulator's ``reference`` backend and the Flower client app call these same functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dcco.methods.base import Method
from dcco.stats import EncodingStats, Moments, encoding_stats


@dataclass(frozen=True)
class ClientUpdate:
    """What a client returns after its local step.

    Attributes:
        delta: θ_k − θ for every trainable parameter, by name (one SGD step: −lr·∇L_k).
        num_samples: N_k, the FedAvg weight.
        loss: the client's loss before the step.
    """

    delta: dict[str, Tensor]
    num_samples: int
    loss: float


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The (name, parameter) pairs a round updates, in a fixed order."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


@torch.no_grad()
def client_statistics(model: nn.Module, x1: Tensor, x2: Tensor) -> EncodingStats:
    """Phase 1 of a DCCO round: the count and sums of the client's encodings.

    Args:
        model: the dual encoder broadcast by the server; ``model(x1, x2)`` returns (F, G).
        x1, x2: the two views of the client's N_k samples, (N_k, C, H, W).
    """
    f, g = model(x1, x2)
    return encoding_stats(f, g)


def client_update(model: nn.Module, method: Method, x1: Tensor, x2: Tensor,
                  shared: Moments | None, local_lr: float) -> ClientUpdate:
    """Phase 2: one local SGD step on the method's client loss, returned as a model delta.

    The model itself is left unchanged; the delta is −local_lr·∇L_k exactly (computing θ' − θ
    after an in-place step would add rounding error of the size of θ).

    Args:
        shared: the server's aggregated moments S_A (DCCO), or None.
        local_lr: the client learning rate (paper: 1.0).
    """
    named = trainable_parameters(model)
    f, g = model(x1, x2)
    loss = method.client_loss(f, g, shared)
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    delta = {
        name: (torch.zeros_like(p) if gr is None else -local_lr * gr)
        for (name, p), gr in zip(named, grads)
    }
    return ClientUpdate(delta=delta, num_samples=int(x1.shape[0]), loss=float(loss.detach()))
