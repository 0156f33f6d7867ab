"""Moving small host tensors to the device without waiting for it.

A plain ``tensor.to("cuda")`` from pageable host memory synchronises the stream: the host
waits for every kernel queued before the copy. A round's sample ids, client segments and
weights are built on the host while the GPU still runs the previous round, so they travel
through pinned memory with ``non_blocking=True`` instead.
"""

from __future__ import annotations

import torch
from torch import Tensor


def to_device(x: Tensor, device: torch.device | str) -> Tensor:
    """``x`` on ``device``; host → CUDA through pinned memory, without a stream sync."""
    device = torch.device(device)
    if device.type != "cuda" or x.device.type == "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


__all__ = ["to_device"]
