"""Seeds derived from a run seed and a position, so every random stream is reproducible.

Each stream (initialisation, partitioning, client sampling, augmentation) gets its own seed
from ``(seed, stream name, round, ...)``; none of them depends on how much randomness another
stream consumed, which is what makes resuming and backend equivalence exact.
"""

from __future__ import annotations

import hashlib

import torch

_MASK63 = (1 << 63) - 1


def derive_seed(seed: int, *keys: int | str) -> int:
    """A 63-bit seed that is a pure function of ``seed`` and ``keys``.

    Args:
        seed: the run seed.
        *keys: positions in the run, e.g. ``("sample", round_index)``.

    Returns:
        A non-negative integer below 2**63, usable by ``torch.Generator.manual_seed`` and
        ``numpy.random.default_rng``.
    """
    text = "/".join([str(int(seed))] + [str(k) for k in keys])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _MASK63


def generator(seed: int, *keys: int | str, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` seeded with ``derive_seed(seed, *keys)``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(seed, *keys))
    return gen
