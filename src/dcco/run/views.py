"""The user's two views of a round's samples, from their own ``augment``, seeded by the round."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from dcco.core.seeding import derive_seed


def user_views(augment: Callable[[Tensor], Tensor], samples: Tensor, seed: int,
               round_index: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Two views of ``samples`` by the user's ``augment``, with torch's random state seeded
    from ``(seed, round_index)`` (``seed``: the run's augmentation seed) and restored after;
    floating views cast to ``dtype``."""
    # every CUDA device: manual_seed reseeds them all, and fork_rng restores those it is given
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(derive_seed(seed, "user", round_index))
        views = augment(samples), augment(samples)
    for v in views:
        if not isinstance(v, Tensor) or v.ndim < 1 or v.shape[0] != samples.shape[0]:
            raise ValueError(f"augment must return one view per sample, a tensor of "
                             f"{samples.shape[0]} rows; got "
                             f"{tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__}")
    return tuple(v.to(dtype) if v.is_floating_point() else v for v in views)


__all__ = ["user_views"]
