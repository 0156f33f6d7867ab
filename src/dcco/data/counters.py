"""Counter-based randomness: a uniform number per (seed, round, sample, view, slot), a pure
function of them (a hash, no generator state). The augmentation's views draw from it
(``dcco.data.augment``): a sample gets the same views whether it is augmented alone or among a
thousand, in any order, and a resumed run needs nothing but the round number."""

from __future__ import annotations

import torch
from torch import Tensor

from dcco.core.devices import to_device

_M32 = 0xFFFFFFFF


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x · c) mod 2³² for int64 x in [0, 2³²) and c < 2³², with every product below 2⁴⁸."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _mix32(x: Tensor) -> Tensor:
    """lowbias32 (C. Wellons, "Prospecting for hash functions"): a bijection of [0, 2³²)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _check_counter(name: str, value: int, bound: int) -> None:
    if not 0 <= value < bound:
        raise ValueError(f"{name} must be an integer in [0, {bound}), got {value}")


def uniforms(seed: int, round_index: int, sample_ids: Tensor, view: int,
             slots: range | list[int]) -> Tensor:
    """``uniform`` for several slots at once: row ``s`` is ``uniform(..., slot=slots[s])``.

    The key is absorbed one 32-bit word at a time (low then high halves of the sample id, the
    round and the seed, then the view), each followed by a lowbias32 round; the slot comes last
    with two more rounds. Every step is a bijection of the state, so distinct sample ids below
    2³² never collide within one (seed, round, view, slot).

    Args:
        seed: the augmentation stream's seed, in [0, 2⁶⁴).
        round_index: the round, in [0, 2⁶⁴).
        sample_ids: integer (B,), data-set indices; its device is the output's.
        view: in [0, 2¹⁶).
        slots: each in [0, 2¹⁶).

    Returns:
        float64 (S, B) in [0, 1), multiples of 2⁻³².
    """
    _check_counter("seed", seed, 2**64)
    _check_counter("round_index", round_index, 2**64)
    _check_counter("view", view, 2**16)
    for slot in slots:
        _check_counter("slot", slot, 2**16)
    ids = sample_ids.to(torch.int64)
    h = _mix32((ids & _M32) ^ 0x9E3779B9)
    for word in ((ids >> 32) & _M32, round_index & _M32, round_index >> 32, seed & _M32,
                 seed >> 32, view):
        h = _mix32(h ^ word)
    if isinstance(slots, range):  # built on the device: a tensor from a list would be a copy
        slot_words = torch.arange(slots.start, slots.stop, slots.step, device=ids.device)
    else:
        slot_words = to_device(torch.tensor(list(slots), dtype=torch.int64), ids.device)
    slot_words = (slot_words * 0x85EBCA6B) & _M32
    h = _mix32(_mix32(h[None, :] ^ slot_words[:, None]) ^ 0xC2B2AE35)
    return h.to(torch.float64) * 2.0**-32


def uniform(seed: int, round_index: int, sample_ids: Tensor, view: int, slot: int) -> Tensor:
    """A uniform number in [0, 1) per sample, a pure function of all the arguments.

    Args:
        seed: the augmentation stream's seed, in [0, 2⁶⁴).
        round_index: the round, in [0, 2⁶⁴).
        sample_ids: integer (B,), data-set indices; any device.
        view: which view (0 or 1 for ``augment_pair``), in [0, 2¹⁶).
        slot: which random parameter (see ``Slot``), in [0, 2¹⁶).

    Returns:
        float64 (B,) on ``sample_ids``' device.
    """
    return uniforms(seed, round_index, sample_ids, view, [slot])[0]


# ------------------------------------------------------------------------- crop and flip


__all__ = ["uniform", "uniforms"]
