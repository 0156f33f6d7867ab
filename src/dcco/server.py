"""The server side of a round, framework-free: check client replies, aggregate what survives.

Real clients (a Flower deployment, phones) fail, time out and send garbage. Every reply is
validated before it touches the model: a malformed one is rejected with a reason that is
counted, and the round carries on with the rest.

Dropout rule for DCCO's two exchanges:

- the aggregate S_A is the sum of the statistics of the clients that answered phase 1;
- the update is the sample-weighted average of the phase-2 updates of the survivors, weighted
  by their own counts; clients that sent statistics and then vanished contribute to S_A but
  not to the update;
- a phase with fewer than ``min_clients`` valid replies skips the round (no model change).

When every phase-1 client also answers phase 2, the round equals one centralized step on the
pooled batch, as in the paper. When some drop out, the update is the gradient of L(S_A)
through the survivors' samples only, rescaled to their share: an unbiased-in-expectation but
not exact estimate of that step, with the statistics still describing the full phase-1 batch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dcco.client import ClientUpdate
from dcco.stats import EncodingStats

MAX_ABS = 1e12
"""Largest magnitude accepted in a reply; anything beyond is 'absurd' (it would swamp Adam)."""


class ReplyError(ValueError):
    """A client reply that cannot be used; ``kind`` names the problem for the metrics."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _check_tensor(name: str, value: object, shape: tuple[int, ...], max_abs: float) -> Tensor:
    if not isinstance(value, Tensor):
        raise ReplyError("dtype", f"{name} is not an array but {type(value).__name__}")
    if not value.is_floating_point():
        raise ReplyError("dtype", f"{name} has dtype {value.dtype}, expected floating point")
    if tuple(value.shape) != shape:
        raise ReplyError("shape", f"{name} has shape {tuple(value.shape)}, expected {shape}")
    if not torch.isfinite(value).all():
        raise ReplyError("nonfinite", f"{name} holds NaN or Inf")
    if value.numel() and float(value.abs().max()) > max_abs:
        raise ReplyError("magnitude", f"{name} holds values beyond ±{max_abs:g}")
    return value


def check_count(count: object, max_count: int = 1 << 31) -> int:
    """A sample count: a positive integer (floats with an integral value are accepted)."""
    if isinstance(count, Tensor):
        count = count.item() if count.numel() == 1 else None
    if isinstance(count, bool) or not isinstance(count, (int, float)):
        raise ReplyError("count", f"sample count {count!r} is not a number")
    if isinstance(count, float) and (not math.isfinite(count) or count != int(count)):
        raise ReplyError("count", f"sample count {count!r} is not an integer")
    if not 0 < count <= max_count:
        raise ReplyError("count", f"sample count {count!r} must be in [1, {max_count}]")
    return int(count)


def validate_statistics(reply: dict[str, object], d_f: int, d_g: int,
                        max_abs: float = MAX_ABS) -> EncodingStats:
    """Phase-1 reply → ``EncodingStats`` (float64), or ``ReplyError``."""
    shapes = {"sum_f": (d_f,), "sum_g": (d_g,), "sum_ff": (d_f,), "sum_gg": (d_g,),
              "sum_fg": (d_f, d_g)}
    missing = [k for k in ("count", *shapes) if k not in reply]
    if missing:
        raise ReplyError("missing_key", f"statistics reply lacks {', '.join(missing)}")
    n = check_count(reply["count"])
    sums = {k: _check_tensor(k, reply[k], s, max_abs).to(torch.float64) for k, s in shapes.items()}
    if (sums["sum_ff"] < 0).any() or (sums["sum_gg"] < 0).any():
        raise ReplyError("magnitude", "a sum of squares is negative")
    return EncodingStats(count=torch.tensor(float(n), dtype=torch.float64), **sums)


def validate_update(reply: dict[str, object], count: object, shapes: dict[str, tuple[int, ...]],
                    max_abs: float = MAX_ABS) -> ClientUpdate:
    """Phase-2 reply (a delta per parameter name) → ``ClientUpdate``, or ``ReplyError``."""
    missing = [k for k in shapes if k not in reply]
    if missing:
        raise ReplyError("missing_key", f"update lacks {len(missing)} parameters, e.g. "
                                        f"{missing[0]}")
    n = check_count(count)
    delta = {k: _check_tensor(k, reply[k], s, max_abs) for k, s in shapes.items()}
    return ClientUpdate(delta=delta, num_samples=n, loss=float("nan"))


def aggregate_updates(updates: list[ClientUpdate],
                      params: dict[str, Tensor]) -> dict[str, Tensor]:
    """The pseudo-gradient −Σ_k (N_k/N)·Δ_k, in each parameter's dtype and device."""
    total = sum(u.num_samples for u in updates)
    out = {}
    for name, p in params.items():
        acc = torch.zeros_like(p)
        for u in updates:
            acc -= (u.num_samples / total) * u.delta[name].to(p.device, p.dtype)
        out[name] = acc
    return out

