"""The server side of a round, framework-free: check client replies, aggregate what survives.

Real clients (a Flower deployment, phones) fail, time out and send garbage. Every reply is
validated before it touches the model: a malformed one is rejected with a reason that is
counted, and the round carries on with the rest.

Dropout rule for DCCO's two exchanges:

- the aggregate S_A is the sum of the statistics of the clients that answered phase 1;
- the update is the sample-weighted average of the phase-2 updates of the survivors, weighted
  by their own counts; clients that sent statistics and then vanished contribute to S_A but
  not to the update;
- a phase with fewer than a minimum number of valid replies skips the round (no model
  change; ``skip_reason``).

When every phase-1 client also answers phase 2, the round equals one centralized step on the
pooled batch, as in the paper (appendix A). When some drop out, the update is the gradient of
L(S_A) through the survivors' samples only, rescaled to their share: with equal-size clients
that drop out independently of their data, an unbiased but noisier estimate of that step (a
smaller effective batch for the gradient), while the statistics still describe the full
phase-1 batch. It is no longer the exact centralized step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import Tensor

from dcco.core.client import ClientUpdate
from dcco.core.stats import CCO_STATS, EncodingStats, StatsSpec

T = TypeVar("T")
LOG = logging.getLogger(__name__)

REJECTION_KINDS = ("shape", "dtype", "nonfinite", "count", "missing_key", "magnitude")
"""The kinds of malformed reply, as counted in the metrics (``ReplyError.kind``)."""

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
                        max_abs: float = MAX_ABS, spec: StatsSpec = CCO_STATS) -> EncodingStats:
    """Statistics reply → ``EncodingStats`` (float64) with the sums of ``spec``, or
    ``ReplyError``: a key missing, a shape or dtype wrong, a value non-finite or beyond
    ``max_abs``, or a sum of squares (Σ F², or the diagonal of Σ F Fᵀ) negative."""
    shapes = spec.shapes(d_f, d_g)
    missing = [k for k in ("count", *shapes) if k not in reply]
    if missing:
        raise ReplyError("missing_key", f"statistics reply lacks {', '.join(missing)}")
    n = check_count(reply["count"])
    sums = {k: _check_tensor(k, reply[k], s, max_abs).to(torch.float64) for k, s in shapes.items()}
    for fld in spec.fields:
        if fld.left == fld.right:  # a second moment of one encoding
            squares = sums[f"sum_{fld.name}"]
            if (torch.diagonal(squares) if fld.form == "outer" else squares).lt(0).any():
                raise ReplyError("magnitude", f"sum_{fld.name}, a sum of squares, is negative")
            if fld.form == "outer":
                scale = float(squares.abs().max()) if squares.numel() else 0.0
                if float((squares - squares.T).abs().max()) > 1e-9 * scale:
                    raise ReplyError("magnitude", f"sum_{fld.name}, a sum of outer products "
                                                  f"of one encoding, is not symmetric")
    return EncodingStats({"count": torch.tensor(float(n), dtype=torch.float64)} | sums)


def check_loss(loss: object, max_abs: float = MAX_ABS) -> float:
    """A reported loss: a finite number of sane magnitude."""
    if isinstance(loss, Tensor):
        loss = loss.item() if loss.numel() == 1 else None
    if isinstance(loss, bool) or not isinstance(loss, (int, float)):
        raise ReplyError("dtype", f"loss {loss!r} is not a number")
    if not math.isfinite(loss):
        raise ReplyError("nonfinite", f"loss is {loss}")
    if abs(loss) > max_abs:
        raise ReplyError("magnitude", f"loss {loss:g} is beyond ±{max_abs:g}")
    return float(loss)


def validate_update(reply: dict[str, object], count: object, shapes: dict[str, tuple[int, ...]],
                    max_abs: float = MAX_ABS, loss: object = None) -> ClientUpdate:
    """Phase-2 reply (a delta per parameter name) → ``ClientUpdate``, or ``ReplyError``.

    Args:
        reply: parameter name → Δ_k, each of the parameter's shape and a floating dtype.
        count: N_k, the client's sample count.
        shapes: parameter name → expected shape.
        max_abs: the largest magnitude accepted.
        loss: the client's loss before its step, a finite number; None (the default) means
            "not reported" and gives a NaN loss.
    """
    missing = [k for k in shapes if k not in reply]
    if missing:
        raise ReplyError("missing_key", f"update lacks {len(missing)} parameters, e.g. "
                                        f"{missing[0]}")
    n = check_count(count)
    delta = {k: _check_tensor(k, reply[k], s, max_abs) for k, s in shapes.items()}
    return ClientUpdate(delta=delta, num_samples=n,
                        loss=math.nan if loss is None else check_loss(loss, max_abs))


def pooled_update(updates: list[ClientUpdate], params: dict[str, Tensor]) -> ClientUpdate:
    """Several clients' updates as one: Σ_k (N_k/N)·Δ_k, N = Σ_k N_k, and their
    sample-weighted loss (what a node hosting them replies, and a round's combination)."""
    total = sum(u.num_samples for u in updates)
    loss = sum(u.num_samples / total * u.loss for u in updates)
    delta = {k: -v for k, v in aggregate_updates(updates, params).items()}
    return ClientUpdate(delta, total, float(loss))


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



@dataclass
class ReplyTally:
    """What became of the requests of one exchange: the fault counters of the metrics.

    Attributes:
        sent: requests sent.
        accepted: valid replies.
        failed: replies that report an error (the client raised, crashed or was lost).
        missing: requests with no reply before the timeout.
        rejected: malformed replies by kind (see ``REJECTION_KINDS``).
        problems: what went wrong with each reply not accepted, one line each ("node 7
            failed: ...", "node 9 rejected (shape): ..."), for the log.
    """

    sent: int = 0
    accepted: int = 0
    failed: int = 0
    missing: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def reject(self, kind: str, why: str | None = None) -> None:
        self.rejected[kind] = self.rejected.get(kind, 0) + 1
        if why is not None:
            self.problems.append(f"rejected ({kind}): {why}")

    def __add__(self, other: ReplyTally) -> ReplyTally:
        kinds = {*self.rejected, *other.rejected}
        return ReplyTally(
            self.sent + other.sent, self.accepted + other.accepted, self.failed + other.failed,
            self.missing + other.missing,
            {k: self.rejected.get(k, 0) + other.rejected.get(k, 0) for k in sorted(kinds)},
            self.problems + other.problems,
        )

    def as_dict(self) -> dict[str, object]:
        return {"sent": self.sent, "accepted": self.accepted, "failed": self.failed,
                "missing": self.missing, "rejected": dict(sorted(self.rejected.items()))}


def accept_valid(replies: Iterable[object], validate: Callable[[object], T],
                 tally: ReplyTally, name: Callable[[int, object], str] | None = None
                 ) -> list[tuple[int, T]]:
    """The replies that pass ``validate``, with their positions; the others are counted.

    A ``ReplyError`` counts as a rejection of its kind; anything else raised by ``validate``
    (e.g. an undecodable payload) as a rejection of kind ``"dtype"``: a malformed reply never
    stops the round.

    Args:
        replies: the payloads of the replies that arrived without an error.
        validate: payload → checked value, raising ``ReplyError`` when malformed.
        tally: updated in place (``accepted``, ``rejected`` and ``problems``).
        name: (position, payload) → who sent it, for ``problems`` ("node 7"); None: the
            position ("reply 2").
    """
    valid = []
    for i, reply in enumerate(replies):
        who = name(i, reply) if name is not None else f"reply {i}"
        try:
            valid.append((i, validate(reply)))
        except ReplyError as e:
            kind, why = e.kind, str(e)
        except KeyError as e:  # a record or field the payload lacks
            kind, why = "missing_key", f"it lacks {e}"
        except (ValueError, TypeError) as e:  # undecodable, e.g. not a numeric array
            kind, why = "dtype", str(e)
        else:
            tally.accepted += 1
            continue
        tally.reject(kind)
        tally.problems.append(f"{who} rejected ({kind}): {why}")
        LOG.warning("%s rejected (%s): %s", who, kind, why)
    return valid


def skip_reason(phase: str, survivors: int, minimum: int) -> str | None:
    """Why a round must be skipped after ``phase``, or None when enough clients are left.

    A round needs ``minimum`` valid replies in each phase: fewer survivors would make the
    aggregate too noisy to trust (and under secure aggregation, too revealing).
    """
    if survivors < minimum:
        return f"{phase}: {survivors} valid replies, fewer than the minimum {minimum}"
    return None
