"""A model as the round's parts see it: (x1, x2) → (F, G), and how its parameter names map
back to the user's (``dual_view``). A plain encoder becomes a shared dual encoder; a forward
may run in chunks of samples (``Chunked``), which gives every sample the same encodings and
gradients (to float rounding) when no layer mixes the samples of a batch, and runs faster on
a CPU: each layer's activations stay cache-sized (``benchmarks/quickstart_speed.py``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from dcco.errors import ArgumentError
from dcco.models.dual import DualEncoder
from dcco.models.layers import has_batch_norm

CHUNK = 256
"""Samples a chunk of a node's forward by default (``dcco.flower.answer``): on the
quickstart's CNN, chunks of 128 to 512 samples forward and backpropagate 1,600 images in
about 0.7 of one batch's CPU time."""


class Shared(nn.Module):
    """A plain encoder as a shared dual encoder: (x1, x2) → (encoder(x1), encoder(x2)), in
    one forward over both views (the encoder must have no cross-sample terms to give each
    view its own encodings; batch norm has them)."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor]:
        return self.encoder(x1), self.encoder(x2)


class Chunked(nn.Module):
    """A dual encoder's forward over chunks of ``size`` samples, its encodings concatenated
    in the samples' order (one chunk: the dual encoder's own forward, to the bit)."""

    def __init__(self, dual: nn.Module, size: int) -> None:
        super().__init__()
        self.dual = dual
        self.size = size

    def forward(self, x1: Tensor, x2: Tensor) -> tuple[Tensor, Tensor]:
        if x1.shape[0] <= self.size:
            return self.dual(x1, x2)
        parts = [self.dual(a, b) for a, b in zip(x1.split(self.size), x2.split(self.size),
                                                 strict=True)]
        return torch.cat([f for f, _ in parts]), torch.cat([g for _, g in parts])


def dual_view(model: nn.Module, chunk: int | None = None
              ) -> tuple[nn.Module, Callable[[str], str]]:
    """The model as (x1, x2) → (F, G), and how its parameter names map back to ``model``'s.

    Args:
        chunk: forward the samples in chunks of this many (``Chunked``); None, or a model
            holding batch norm (whose statistics are of the whole batch): in one batch.
    """
    if chunk is not None and chunk < 1:
        raise ArgumentError(f"chunk must be a positive number of samples or None, got {chunk}")
    if isinstance(model, DualEncoder):
        dual, back = model, (lambda name: name)
    elif isinstance(model, nn.Module):
        dual, back = Shared(model), (lambda name: name.removeprefix("encoder."))
    else:
        raise ArgumentError(f"model must be a torch.nn.Module (your encoder) or a DualEncoder, "
                            f"got {type(model).__name__}")
    if chunk is None or has_batch_norm(model):
        return dual, back
    return Chunked(dual, chunk), lambda name: back(name.removeprefix("dual."))


__all__ = ["CHUNK", "Chunked", "Shared", "dual_view"]
