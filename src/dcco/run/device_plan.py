"""Where a run computes: the device of ``train.device``, and how ``train.max_batch`` splits a
round's forward on it."""

from __future__ import annotations

import torch

from dcco.config import ConfigError


def resolve_device(name: str) -> torch.device:
    """``"auto"`` is CUDA when present, else CPU; anything else is checked to exist."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device = {name!r} but CUDA is not available on this machine")
    return device


def max_batch_of(max_batch: int | str | None, device: torch.device) -> int | None:
    """``train.max_batch`` on ``device``: "auto" is 256 samples on a CPU (a forward of a few
    thousand images there runs at about half the speed of its groups; docs/performance.md)
    and None (one forward) elsewhere."""
    if max_batch == "auto":
        return 256 if device.type == "cpu" else None
    return max_batch


def keeps_graphs(max_batch: int | str | None, device: torch.device) -> bool:
    """Whether ``train.max_batch``'s groups keep their graphs from the statistics to the
    update (one forward a group, ``dcco.core.simulator``): under "auto", whose groups on a CPU are
    for speed; not under a number, which bounds a forward's memory."""
    return max_batch == "auto" and max_batch_of(max_batch, device) is not None


__all__ = ["keeps_graphs", "max_batch_of", "resolve_device"]
