"""Labelled subsets, features of un-augmented inputs, and the pieces every classifier
shares (batch order, head initialisation, accuracy)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from dcco.core.seeding import generator
from dcco.data.augment import model_input
from dcco.errors import UserError


def labelled_subset(labels: Tensor, n: int, num_classes: int, seed: int) -> Tensor:
    """``n`` training sample ids, class-balanced and seeded; all of them when ``n`` is at
    least the split's size (the rule of every protocol: the case protocols count cases).

    Class c gets ⌊n / num_classes⌋ samples, plus one for the first ``n mod num_classes``
    classes. Each class's picks are the head of a seeded permutation of its samples (stream
    ``(seed, "labels")``), so a smaller subset is nearly always contained in a larger one.

    Args:
        labels: int (N,), the training split's labels in [0, num_classes).
        n: how many labelled samples, 1 ≤ n.
        num_classes: number of classes.
        seed: the run seed.

    Returns:
        int64 (n,) sample ids, sorted, on the CPU.

    Raises:
        UserError: ``n`` is out of range, or a class has fewer samples than its share (too
            many labels asked for).
        ValueError: a label is out of range.
    """
    labels = torch.as_tensor(labels).cpu()
    if labels.ndim != 1 or labels.dtype.is_floating_point:
        raise ValueError(f"labels must be an integer vector, got {labels.dtype} "
                         f"{tuple(labels.shape)}")
    if n < 1 or num_classes < 1:
        raise UserError(f"labelled subset needs n >= 1 and num_classes >= 1, got n={n}, "
                         f"num_classes={num_classes}")
    if labels.numel() and not 0 <= int(labels.min()) <= int(labels.max()) < num_classes:
        raise ValueError(f"labels must lie in [0, {num_classes}), got "
                         f"[{int(labels.min())}, {int(labels.max())}]")
    if n >= labels.numel():  # as many as there are: all of them (every protocol's rule)
        return torch.arange(labels.numel())
    gen = generator(seed, "labels")
    chosen = []
    for c in range(num_classes):
        share = n // num_classes + (1 if c < n % num_classes else 0)
        pool = torch.nonzero(labels == c).flatten()
        if pool.numel() < share:
            raise UserError(f"a class-balanced subset of {n} labels needs {share} samples of "
                             f"class {c}, but the training split has {pool.numel()}")
        chosen.append(pool[torch.randperm(pool.numel(), generator=gen)[:share]])
    return torch.sort(torch.cat(chosen)).values


def _default_dtype(model: nn.Module) -> torch.dtype:
    param = next(model.parameters(), None)
    return torch.float32 if param is None else param.dtype


StepCallback = Callable[[str, int, int], None]
"""``progress(phase, done, total)``, called as a long evaluation advances (e.g. ``("probe
step", 120, 300)``), so that a caller can show progress; the library itself prints nothing."""


@torch.no_grad()
def _batched(fn: Callable[[Tensor], Tensor], model: nn.Module, images: Tensor, batch_size: int,
             device: torch.device, dtype: torch.dtype,
             progress: StepCallback | None = None) -> Tensor:
    """``fn`` of the un-augmented images (or other inputs, ``model_input``), in batches, with
    ``model`` in eval mode (its mode is restored afterwards): float32 (N, ·) on ``device``."""
    if images.shape[0] == 0:
        raise ValueError("cannot compute features of an empty image set")
    was_training = model.training
    model.eval()
    starts = range(0, images.shape[0], batch_size)
    out = []
    try:
        for done, i in enumerate(starts, 1):
            out.append(fn(model_input(images[i:i + batch_size].to(device), dtype)).float())
            if progress is not None:
                progress("feature batch", done, len(starts))
    finally:
        model.train(was_training)
    return torch.cat(out)


def extract_features(model: nn.Module, images: Tensor, batch_size: int, device: torch.device,
                     dtype: torch.dtype | None = None, tower: int = 0,
                     progress: StepCallback | None = None) -> Tensor:
    """Backbone features of un-augmented images, the projector discarded.

    Args:
        model: a ``DualEncoder`` (its ``features(x, tower)``) or a backbone ((B, C, H, W) →
            (B, D)), on ``device``.
        images: uint8 (N, C, H, W), or a modality's other inputs (``model_input``), on any
            device; moved to ``device`` a batch at a time.
        batch_size: images per forward pass.
        device: where the model runs.
        dtype: input dtype; default the model's parameter dtype.
        tower: which tower of a two-tower dual encoder (0: the first).
        progress: told of each batch done.

    Returns:
        float32 (N, D) on ``device``.
    """
    encode = (lambda x: model.features(x, tower)) if hasattr(model, "features") else model
    return _batched(encode, model, images, batch_size, device, dtype or _default_dtype(model),
                    progress)


def _accuracy(logits: Tensor, labels: Tensor) -> float:
    return float((logits.argmax(1) == labels.to(logits.device)).double().mean())


def _batch_order(n: int, batch: int, steps: int, gen: torch.Generator) -> Tensor:
    """Sample positions for every step: int64 (steps, min(batch, n)), consecutive slices of a
    stream of seeded permutations of range(n), so each sample is drawn once per epoch."""
    size = min(batch, n)
    epochs = -(-steps * size // n)
    stream = torch.cat([torch.randperm(n, generator=gen) for _ in range(epochs)])
    return stream[: steps * size].view(steps, size)


def _linear_head(in_dim: int, num_classes: int, gen: torch.Generator | None,
                 device: torch.device, dtype: torch.dtype) -> nn.Linear:
    """A linear layer initialised from ``gen`` (uniform ±1/√in_dim, PyTorch's scale) or to
    zero when ``gen`` is None; the global RNG is not touched."""
    head = nn.utils.skip_init(nn.Linear, in_dim, num_classes, device=device, dtype=dtype)
    with torch.no_grad():
        for p in (head.weight, head.bias):
            if gen is None:
                p.zero_()
            else:
                bound = in_dim ** -0.5
                p.copy_(torch.empty(p.shape, dtype=torch.float64).uniform_(-bound, bound,
                                                                           generator=gen))
    return head
