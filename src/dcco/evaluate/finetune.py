"""Full finetuning of a pretrained backbone, and supervised training from scratch."""

from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcco.config import EvalConfig, ModelConfig, OptimConfig
from dcco.core.optim import build_optimizer, scheduled_lr, set_lr
from dcco.core.seeding import derive_seed, generator
from dcco.data.augment import flip_view
from dcco.data.datasets import ImageDataset
from dcco.evaluate.features import (
    StepCallback,
    _accuracy,
    _batch_order,
    _batched,
    _linear_head,
)
from dcco.evaluate.settings import EvalResult
from dcco.models import build_backbone


class Classifier(nn.Module):
    """A backbone with a linear head: images (B, C, H, W) → logits (B, num_classes).

    The head reads the features through a batch norm without affine parameters (as MAE's
    probes do, He et al. 2022), so that its Adam steps mean the same thing whatever the scale
    of the pretrained features. Without it, an encoder pretrained with LARS, whose
    group-norm gains grow large, gives features of norm ~10³: the randomly initialised head's
    first logits saturate and full finetuning ends far below the linear probe.
    """

    def __init__(self, backbone: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        self.backbone, self.head = backbone, head
        p = head.weight
        self.norm = nn.BatchNorm1d(head.in_features, affine=False, device=p.device,
                                   dtype=p.dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.norm(self.backbone(x)))


def _classifier(backbone: nn.Module, num_classes: int, seed: int, protocol: str) -> Classifier:
    """``backbone`` plus a head initialised from the stream ``(seed, protocol, "head")``."""
    p = next(backbone.parameters())
    head = _linear_head(backbone.feature_dim, num_classes, generator(seed, protocol, "head"),
                        p.device, p.dtype)
    return Classifier(backbone, head)


def _train_classifier(net: Classifier, train_set: ImageDataset, label_ids: Tensor, steps: int,
                      batch: int, lr: float, seed: int, protocol: str,
                      progress: StepCallback | None = None) -> None:
    """Adam with cosine decay on the labelled subset, random flips only (appendix B).

    Batches walk through seeded permutations (stream ``(seed, protocol, "batches")``); the
    flip of sample i at step t is a hash of ``(seed, protocol, "flip")``, t and i.
    """
    p = next(net.parameters())
    images = train_set.images[label_ids].to(p.device)  # the subset lives on the device
    labels = train_set.labels[label_ids].to(p.device)
    ids = label_ids.to(p.device)
    opt = build_optimizer(net.named_parameters(), OptimConfig(optimizer="adam", lr=lr))
    order = _batch_order(ids.numel(), batch, steps, generator(seed, protocol, "batches"))
    order = order.to(p.device)
    flip_seed = derive_seed(seed, protocol, "flip")
    net.train()
    for step in range(steps):
        set_lr(opt, scheduled_lr(step, steps, lr))
        pick = order[step]
        x = flip_view(images[pick], ids[pick], flip_seed, step, p.dtype)
        loss = F.cross_entropy(net(x), labels[pick])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if progress is not None:
            progress("supervised step" if protocol == "scratch" else f"{protocol} step",
                     step + 1, steps)
    net.eval()


def _scored(net: Classifier, protocol: str, test_set: ImageDataset, num_labels: int,
            steps: int, batch: int, start: float,
            progress: StepCallback | None = None) -> EvalResult:
    """The test accuracy of a trained classifier, as a result."""
    p = next(net.parameters())
    test_logits = _batched(net, net, test_set.images, batch, p.device, p.dtype, progress)
    return EvalResult(protocol=protocol, accuracy=_accuracy(test_logits, test_set.labels),
                      num_labels=num_labels, steps=steps, seconds=time.perf_counter() - start,
                      num_test=len(test_set))


def finetune(model: nn.Module, train_set: ImageDataset, test_set: ImageDataset,
             label_ids: Tensor, cfg: EvalConfig, seed: int,
             device: torch.device,
             progress: StepCallback | None = None) -> tuple[EvalResult, Classifier]:
    """Full finetuning: a copy of the pretrained backbone plus a linear head, trained with
    Adam (``finetune_steps``, ``finetune_batch``, ``finetune_lr``, cosine; appendix B).

    Args:
        model: a ``DualEncoder`` (its first backbone is used) or a backbone; left untouched.
        train_set, test_set, label_ids, cfg, seed: as for ``linear_probe``.
        device: where the copy is trained.
        progress: told of each step and test batch done.

    Returns:
        The result and the finetuned network (backbone copy + head, in eval mode).
    """
    start = time.perf_counter()
    backbone = copy.deepcopy(getattr(model, "backbone", model)).to(device)
    net = _classifier(backbone, train_set.num_classes, seed, "finetune")
    _train_classifier(net, train_set, label_ids, cfg.finetune_steps, cfg.finetune_batch,
                      cfg.finetune_lr, seed, "finetune", progress)
    result = _scored(net, "finetune", test_set, int(label_ids.numel()), cfg.finetune_steps,
                     cfg.feature_batch, start, progress)
    return result, net


def supervised_from_scratch(model_cfg: ModelConfig, in_channels: int, train_set: ImageDataset,
                            test_set: ImageDataset, label_ids: Tensor, cfg: EvalConfig,
                            seed: int, device: torch.device,
                            progress: StepCallback | None = None) -> EvalResult:
    """Supervised training from scratch: the configured backbone, freshly initialised
    (``build_backbone`` with seed ``derive_seed(seed, "scratch")``), plus a linear head,
    trained with Adam for ``scratch_epochs`` epochs of the labelled subset (appendix B).

    Args:
        model_cfg: the architecture of the pretrained encoders it is compared with.
        in_channels: image channels.
        train_set, test_set, label_ids, seed, device, progress: as for ``finetune``.
        cfg: ``scratch_epochs``, ``scratch_batch``, ``scratch_lr``, ``feature_batch``.
    """
    start = time.perf_counter()
    backbone = build_backbone(model_cfg, in_channels, derive_seed(seed, "scratch")).to(device)
    net = _classifier(backbone, train_set.num_classes, seed, "scratch")
    steps = cfg.scratch_epochs * -(-label_ids.numel() // cfg.scratch_batch)
    _train_classifier(net, train_set, label_ids, steps, cfg.scratch_batch, cfg.scratch_lr, seed,
                      "scratch", progress)
    return _scored(net, "supervised", test_set, int(label_ids.numel()), steps,
                   cfg.feature_batch, start, progress)
