"""The linear probe: a frozen encoder, a LARS linear classifier on its cached features."""

from __future__ import annotations

import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcco.config import EvalConfig, OptimConfig
from dcco.core.optim import build_optimizer, scheduled_lr, set_lr
from dcco.core.seeding import generator
from dcco.data.paired import Dataset
from dcco.evaluate.features import (
    StepCallback,
    _accuracy,
    _batch_order,
    _linear_head,
    extract_features,
)
from dcco.evaluate.settings import EvalResult


def train_linear_classifier(features: Tensor, labels: Tensor, num_classes: int, steps: int,
                            batch: int, lr: float, momentum: float, seed: int,
                            progress: StepCallback | None = None) -> nn.Linear:
    """A linear classifier on fixed features: LARS, cosine decay (paper appendix B).

    The features are standardised with the training mean and standard deviation first, as
    a frozen batch norm would (our choice; the paper does not say), so one learning rate suits
    encoders whose feature scales differ. The standardisation is folded into the returned
    layer, which therefore applies to raw features. The layer starts at zero.

    Args:
        features: float (N, D) training features, on any device (training runs there).
        labels: int64 (N,) in [0, num_classes).
        num_classes: outputs of the classifier.
        steps: LARS steps; batches walk through seeded permutations (stream
            ``(seed, "probe")``).
        batch: samples per step (at most N).
        lr: initial learning rate.
        momentum: LARS momentum.
        seed: the run seed.
        progress: told of each step done.

    Returns:
        A linear layer (D → num_classes) on the features' device, in float32.
    """
    features = features.float()
    labels = labels.to(features.device)
    mean, std = features.mean(0), features.std(0, correction=0) + 1e-6
    z = (features - mean) / std
    head = _linear_head(z.shape[1], num_classes, None, z.device, z.dtype)
    opt = build_optimizer(head.named_parameters(),
                          OptimConfig(optimizer="lars", lr=lr, momentum=momentum))
    order = _batch_order(z.shape[0], batch, steps, generator(seed, "probe")).to(z.device)
    for step in range(steps):
        set_lr(opt, scheduled_lr(step, steps, lr))
        idx = order[step]
        loss = F.cross_entropy(head(z[idx]), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if progress is not None:
            progress("probe step", step + 1, steps)
    with torch.no_grad():  # W((x − μ)/σ) + b = (W/σ) x + (b − (W/σ) μ)
        head.weight.div_(std)
        head.bias.sub_(head.weight @ mean)
    return head


def linear_probe_features(train_features: Tensor, train_labels: Tensor, test_features: Tensor,
                          test_labels: Tensor, num_classes: int, cfg: EvalConfig, seed: int,
                          protocol: str = "linear",
                          progress: StepCallback | None = None) -> EvalResult:
    """The linear evaluation protocol on precomputed features (images or pooled cases).

    Args:
        train_features, test_features: float (N, D) and (M, D), on one device.
        train_labels, test_labels: int64 (N,) and (M,).
        num_classes: number of classes.
        cfg: ``probe_steps``, ``probe_batch``, ``probe_lr``, ``probe_momentum``.
        seed: the run seed.
        protocol: the name recorded in the result.
        progress: told of each step done.
    """
    start = time.perf_counter()
    head = train_linear_classifier(train_features, train_labels, num_classes, cfg.probe_steps,
                                   cfg.probe_batch, cfg.probe_lr, cfg.probe_momentum, seed,
                                   progress)
    with torch.no_grad():
        train_acc = _accuracy(head(train_features.float()), train_labels)
        acc = _accuracy(head(test_features.float()), test_labels)
    return EvalResult(protocol=protocol, accuracy=acc, num_labels=int(train_labels.numel()),
                      steps=cfg.probe_steps, seconds=time.perf_counter() - start,
                      train_accuracy=train_acc, num_test=int(test_labels.numel()))


def linear_probe(model: nn.Module, train_set: Dataset, test_set: Dataset,
                 label_ids: Tensor, cfg: EvalConfig, seed: int,
                 device: torch.device, progress: StepCallback | None = None,
                 tower: int = 0) -> EvalResult:
    """Linear evaluation: the encoder frozen (and untouched), a LARS-trained linear classifier
    on its features of the labelled images, scored on the whole test split.

    Args:
        model: a ``DualEncoder`` or a backbone, on ``device``.
        train_set, test_set: the splits.
        label_ids: int64 (n,) labelled sample ids of ``train_set`` (``labelled_subset``).
        cfg: the probe settings and ``feature_batch``.
        seed: the run seed.
        device: where features are computed and the classifier trained.
        progress: told of each feature batch and probe step done.
        tower: whose features: 0, the first tower on X (or on the images); 1, the second on Y
            (paired data; recorded as protocol ``linear_y``).
    """
    start = time.perf_counter()
    train_x = extract_features(model, train_set.inputs(tower)[label_ids], cfg.feature_batch,
                               device, tower=tower, progress=progress)
    test_x = extract_features(model, test_set.inputs(tower), cfg.feature_batch, device,
                              tower=tower, progress=progress)
    result = linear_probe_features(train_x, train_set.labels[label_ids], test_x,
                                   test_set.labels, train_set.num_classes, cfg, seed,
                                   protocol="linear_y" if tower else "linear",
                                   progress=progress)
    return replace(result, seconds=time.perf_counter() - start)
