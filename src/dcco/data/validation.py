"""A validation split held out of the training split (``data.validation``): the samples a
recipe is chosen on, so that choosing never reads the test split.

The rule: class c gives ⌊n / C⌋ samples, plus one for the first ``n mod C`` classes, the head
of a permutation of its samples drawn from the stream ``(seed, "validation")``, a stream no
other draw of dcco's uses (the probe's labels draw from ``(seed, "labels")``, and from the
samples left over). The same ``n`` and seed hold out the same samples of the same files on
every machine: ``fingerprint`` names them in the run's ``split.json``.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from dcco.core.seeding import generator
from dcco.data.datasets import DataError


def validation_ids(labels: Tensor, n: int, num_classes: int, seed: int) -> Tensor:
    """The held-out samples' ids: ``n`` of them, class-balanced, seeded (module docstring).

    Args:
        labels: int (N,), the training split's labels in [0, num_classes).
        n: how many samples to hold out, 1 ≤ n < N.
        num_classes: number of classes.
        seed: ``data.validation_seed``.

    Returns:
        int64 (n,) sample ids, sorted, on the CPU.

    Raises:
        DataError: ``n`` leaves no training samples, or a class has fewer samples than its
            share.
    """
    labels = torch.as_tensor(labels).cpu()
    if not 1 <= n < labels.numel():
        raise DataError(f"data.validation = {n} must hold out at least 1 and fewer than the "
                        f"training split's {labels.numel()} samples")
    gen = generator(seed, "validation")
    chosen = []
    for c in range(num_classes):
        share = n // num_classes + (1 if c < n % num_classes else 0)
        pool = torch.nonzero(labels == c).flatten()
        if pool.numel() < share:
            raise DataError(f"data.validation = {n} holds out {share} samples of class {c}, "
                            f"but the training split has {pool.numel()}")
        chosen.append(pool[torch.randperm(pool.numel(), generator=gen)[:share]])
    return torch.sort(torch.cat(chosen)).values


def fingerprint(held) -> str:
    """A short hash of the held-out samples (their inputs and labels, in order), recorded in
    ``split.json`` so that two runs can be seen to hold out the same samples of the same
    files."""
    digest = hashlib.sha256()
    for t in (held.inputs(0), held.inputs(1) if held.paired else None, held.labels):
        if t is not None:
            digest.update(t.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def hold_out(train, n: int, seed: int):
    """``train`` split in two: (the samples left for training, the ``n`` held out), each of
    ``train``'s own type (``subset``); the held-out samples by ``validation_ids``."""
    held = validation_ids(train.labels, n, train.num_classes, seed)
    keep = torch.ones(len(train), dtype=torch.bool)
    keep[held] = False
    return train.subset(torch.nonzero(keep).flatten()), train.subset(held)


__all__ = ["fingerprint", "hold_out", "validation_ids"]
