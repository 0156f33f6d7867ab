"""Case-level evaluation (the paper's DERM protocol, §4): a case's image encodings
average-pooled before the classifier, scored per case."""

from __future__ import annotations

import copy
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcco.config import EvalConfig, OptimConfig
from dcco.core.optim import build_optimizer, scheduled_lr, set_lr
from dcco.core.seeding import derive_seed, generator
from dcco.data.augment import flip_view
from dcco.data.datasets import ImageDataset
from dcco.data.partition import natural_partition
from dcco.errors import UserError
from dcco.evaluate.features import (
    StepCallback,
    _accuracy,
    _batch_order,
    _batched,
    extract_features,
    labelled_subset,
)
from dcco.evaluate.finetune import Classifier, _classifier
from dcco.evaluate.probe import linear_probe_features
from dcco.evaluate.settings import EvalResult


def case_features(features: Tensor, case_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Average-pool image encodings per case (the paper's DERM protocol, §4).

    Args:
        features: float (N, D) image encodings.
        case_ids: int (N,), the case of each image (any integers, any order).

    Returns:
        The distinct case ids, sorted, int64 (M,), and each case's mean encoding (M, D), both
        on the features' device.
    """
    if case_ids.shape != features.shape[:1]:
        raise ValueError(f"case_ids must be ({features.shape[0]},), got {tuple(case_ids.shape)}")
    keys, slot = torch.unique(case_ids.to(features.device), return_inverse=True)
    sums = torch.zeros(keys.numel(), features.shape[1], dtype=features.dtype,
                       device=features.device).index_add_(0, slot, features)
    counts = torch.bincount(slot, minlength=keys.numel()).to(features.dtype)
    return keys.long(), sums / counts[:, None]


def case_labels(labels: Tensor, case_ids: Tensor) -> tuple[Tensor, Tensor]:
    """The label of each case, from per-image labels.

    Args:
        labels: int64 (N,), each image's label.
        case_ids: int (N,), each image's case.

    Returns:
        The distinct case ids, sorted, int64 (M,) (as ``case_features``), and their labels
        int64 (M,).

    Raises:
        ValueError: the images of one case carry different labels.
    """
    keys, slot = torch.unique(case_ids.to(labels.device), return_inverse=True)
    first = torch.full((keys.numel(),), -1, dtype=torch.int64, device=labels.device)
    first.scatter_(0, slot, labels.long())  # some image's label per case
    clash = first[slot] != labels
    if bool(clash.any()):
        case = int(keys[slot[clash.nonzero()[0, 0]]])
        raise ValueError(f"the images of case {case} carry different labels")
    return keys.long(), first


def linear_probe_cases(model: nn.Module, train_set: ImageDataset, train_cases: Tensor,
                       test_set: ImageDataset, test_cases: Tensor, cfg: EvalConfig, seed: int,
                       device: torch.device) -> EvalResult:
    """Case-level linear evaluation: each case's image encodings average-pooled, then the
    linear probe on the pooled encodings, scored per test case (paper §4, DERM).

    Args:
        model: a ``DualEncoder`` or a backbone, on ``device`` (left untouched).
        train_set: the labelled training images (every image of every labelled case; pick
            the cases first and ``subset`` the images).
        train_cases, test_cases: int (N,) and (M,), each image's case id.
        test_set: the test images.
        cfg, seed, device: as for ``linear_probe``.
    """
    start = time.perf_counter()
    pooled = []
    for split, cases in ((train_set, train_cases), (test_set, test_cases)):
        feats = extract_features(model, split.images, cfg.feature_batch, device)
        _, x = case_features(feats, cases)
        _, y = case_labels(split.labels.to(device), cases)
        pooled.append((x, y))
    (train_x, train_y), (test_x, test_y) = pooled
    result = linear_probe_features(train_x, train_y, test_x, test_y, train_set.num_classes, cfg,
                                   seed, protocol="case_linear")
    return replace(result, seconds=time.perf_counter() - start)


def labelled_cases(labels: Tensor, cases: Tensor, n: int, num_classes: int, seed: int) -> Tensor:
    """The image ids of ``n`` labelled cases, class-balanced over the cases' labels as
    ``labelled_subset`` picks images (every case when ``n`` covers them all).

    Args:
        labels: int64 (N,), each image's label.
        cases: int (N,), each image's case.
        n: labelled cases wanted, ≥ 1.
        num_classes, seed: as for ``labelled_subset``.

    Returns:
        int64 image ids, sorted, on the CPU: all the images of the chosen cases.
    """
    labels, cases = labels.cpu(), cases.cpu()
    keys, case_y = case_labels(labels, cases)
    if n >= keys.numel():
        return torch.arange(labels.numel())
    chosen = keys[labelled_subset(case_y, n, num_classes, seed)]
    return torch.nonzero(torch.isin(cases, chosen)).flatten()


def _pooled_logits(net: Classifier, x: Tensor, slot: Tensor, num_cases: int) -> Tensor:
    """The head's logits of each case's average-pooled backbone features: x (N, C, H, W),
    slot int64 (N,) the case of each image in [0, num_cases)."""
    features = net.backbone(x)
    sums = torch.zeros(num_cases, features.shape[1], dtype=features.dtype,
                       device=features.device).index_add(0, slot, features)
    counts = torch.bincount(slot, minlength=num_cases).to(features.dtype)
    return net.head(net.norm(sums / counts[:, None]))


def finetune_cases(model: nn.Module, train_set: ImageDataset, label_ids: Tensor,
                   test_set: ImageDataset, cfg: EvalConfig, seed: int, device: torch.device,
                   progress: StepCallback | None = None) -> EvalResult:
    """Case-level full finetuning: a copy of the backbone and a linear head on each case's
    average-pooled image features (the paper's DERM classifier), trained with Adam on the
    labelled cases' images (flips only) and scored per test case.

    Each step takes a seeded draw of cases holding about ``finetune_batch`` images (the
    batch divided by the mean case size); ``finetune_steps`` steps, ``finetune_lr`` with
    cosine decay, as ``finetune``.

    Args:
        model: a ``DualEncoder`` (its first backbone) or a backbone; left untouched.
        train_set, test_set: images with their cases (``clients``).
        label_ids: int64 image ids of the labelled cases (``labelled_cases``).
        cfg, seed, device, progress: as for ``finetune``.
    """
    if train_set.clients is None or test_set.clients is None:
        raise UserError("case-level evaluation needs a case (client) id per image; this data "
                        "set has none")
    start = time.perf_counter()
    net = _classifier(copy.deepcopy(getattr(model, "backbone", model)).to(device),
                      train_set.num_classes, seed, "case_finetune")
    p = next(net.parameters())
    images = train_set.images[label_ids].to(p.device)
    keys, slot = torch.unique(train_set.clients[label_ids], return_inverse=True)
    _, case_y = case_labels(train_set.labels[label_ids], train_set.clients[label_ids])
    members = natural_partition(slot)
    per_step = max(1, round(cfg.finetune_batch * keys.numel() / label_ids.numel()))
    order = _batch_order(keys.numel(), per_step, cfg.finetune_steps,
                         generator(seed, "case_finetune", "batches"))
    opt = build_optimizer(net.named_parameters(), OptimConfig(optimizer="adam", lr=cfg.finetune_lr))
    flip_seed = derive_seed(seed, "case_finetune", "flip")
    ids = label_ids.to(p.device)
    net.train()
    for step in range(cfg.finetune_steps):
        set_lr(opt, scheduled_lr(step, cfg.finetune_steps, cfg.finetune_lr))
        picked = order[step]
        rows, within = members.gather(picked)
        x = flip_view(images[rows.to(p.device)], ids[rows.to(p.device)], flip_seed, step,
                      p.dtype)
        logits = _pooled_logits(net, x, within.to(p.device), picked.numel())
        loss = F.cross_entropy(logits, case_y[picked].to(p.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if progress is not None:
            progress("case finetune step", step + 1, cfg.finetune_steps)
    net.eval()
    test_keys, test_slot = torch.unique(test_set.clients, return_inverse=True)
    _, test_y = case_labels(test_set.labels, test_set.clients)
    feats = _batched(net.backbone, net, test_set.images, cfg.feature_batch, p.device, p.dtype,
                     progress)
    sums = torch.zeros(test_keys.numel(), feats.shape[1], device=feats.device).index_add(
        0, test_slot.to(feats.device), feats)
    counts = torch.bincount(test_slot.to(feats.device), minlength=test_keys.numel()).float()
    with torch.no_grad():
        logits = net.head(net.norm((sums / counts[:, None]).to(p.dtype)))
    return EvalResult(protocol="case_finetune", accuracy=_accuracy(logits, test_y),
                      num_labels=int(keys.numel()), steps=cfg.finetune_steps,
                      seconds=time.perf_counter() - start, num_test=int(test_keys.numel()))
