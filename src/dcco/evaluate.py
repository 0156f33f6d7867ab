"""Evaluation protocols of the paper (§4, appendix B); the projector is discarded in all of them.

- linear probe: frozen encoder, a linear classifier trained with LARS on cached features;
- full finetuning: the whole backbone plus a linear head trained with Adam (flip augmentation);
- supervised from scratch: the same backbone, freshly initialised, trained on the same labels;
- case-level probe: image encodings of a case average-pooled before the classifier (DERM);
- k-NN monitor: weighted k-NN on L2-normalised features (Wu et al. 2018), for fast feedback.

Accuracy is always measured on the full test split.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcco.augment import eval_view, flip_view
from dcco.data.datasets import ImageDataset
from dcco.models import ModelConfig, build_backbone
from dcco.optim import LARS, scheduled_lr, set_lr
from dcco.seeding import derive_seed, generator


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation settings; defaults are the paper's CIFAR-100 protocols with 5,000 labels."""

    labels: int = 5000
    """Labelled training samples, class-balanced."""
    probe_steps: int = 1000
    probe_batch: int = 512
    probe_lr: float = 2.0
    probe_momentum: float = 0.9
    finetune_steps: int = 100
    finetune_batch: int = 256
    finetune_lr: float = 5e-3
    scratch_epochs: int = 100
    scratch_batch: int = 256
    scratch_lr: float = 0.01
    knn_k: int = 200
    knn_temperature: float = 0.1
    knn_bank: int | None = 10000
    """Training images in the k-NN bank; None = all."""
    knn_queries: int | None = 2000
    """Test images queried by the k-NN monitor; None = all."""
    feature_batch: int = 1024

    def __post_init__(self) -> None:
        for name in ("labels", "probe_steps", "probe_batch", "finetune_steps", "finetune_batch",
                     "scratch_epochs", "scratch_batch", "knn_k", "feature_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"eval.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("probe_lr", "finetune_lr", "scratch_lr", "knn_temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"eval.{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.probe_momentum < 1:
            raise ValueError(f"eval.probe_momentum must be in [0, 1), got {self.probe_momentum}")
        for name in ("knn_bank", "knn_queries"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"eval.{name} must be >= 1 or \"none\", got {getattr(self, name)}")

    @classmethod
    def for_labels(cls, labels: int, base: EvalConfig | None = None) -> EvalConfig:
        """``base`` with ``labels`` labels; 500 labels take the paper's 500-label probe
        (400 steps, batch 128, lr 2.5)."""
        base = base or cls()
        if labels == 500:
            return replace(base, labels=500, probe_steps=400, probe_batch=128, probe_lr=2.5)
        return replace(base, labels=labels)


@dataclass(frozen=True)
class EvalResult:
    """The outcome of one evaluation (written to summary.json)."""

    protocol: str
    accuracy: float
    """Top-1 accuracy on the full test split, in [0, 1]."""
    num_labels: int
    steps: int
    seconds: float


def labelled_subset(labels: Tensor, n: int, num_classes: int, seed: int) -> Tensor:
    """``n`` training sample ids, class-balanced (remainder to the lowest classes), seeded.

    Returns:
        int64 (n,), sorted.
    """
    labels = torch.as_tensor(labels)
    per = [n // num_classes + (1 if c < n % num_classes else 0) for c in range(num_classes)]
    gen = generator(seed, "labels")
    chosen = []
    for c, k in enumerate(per):
        pool = torch.nonzero(labels == c).flatten()
        if pool.numel() < k:
            raise ValueError(f"a class-balanced subset of {n} labels needs {k} samples of class "
                             f"{c}, but the training split has {pool.numel()}")
        chosen.append(pool[torch.randperm(pool.numel(), generator=gen)[:k]])
    return torch.sort(torch.cat(chosen)).values


@torch.no_grad()
def extract_features(encoder: nn.Module, images: Tensor, batch_size: int,
                     device: torch.device) -> Tensor:
    """Features of un-augmented images: float32 (N, D). ``encoder`` maps a batch to (B, D)."""
    was_training = encoder.training
    encoder.eval()
    dtype = next(encoder.parameters()).dtype
    out = [encoder(eval_view(images[i:i + batch_size].to(device), dtype)).float().cpu()
           for i in range(0, images.shape[0], batch_size)]
    encoder.train(was_training)
    return torch.cat(out)


def _encoder(model: nn.Module) -> nn.Module:
    """The backbone of a dual encoder (its first tower), or the module itself."""
    return model.backbone if hasattr(model, "backbone") else model


def _accuracy(logits: Tensor, labels: Tensor) -> float:
    return float((logits.argmax(1) == labels).double().mean())


def train_linear_classifier(features: Tensor, labels: Tensor, num_classes: int, steps: int,
                            batch: int, lr: float, momentum: float, seed: int) -> nn.Linear:
    """A linear classifier on fixed features, LARS with cosine decay (paper appendix B).

    Features are standardised with the training mean/std first (folded into the returned
    layer), as probes commonly do, so one learning rate suits every encoder.
    """
    mean, std = features.mean(0), features.std(0) + 1e-6
    z = (features - mean) / std
    head = nn.Linear(z.shape[1], num_classes)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    opt = LARS([{"params": [head.weight]}, {"params": [head.bias], "exclude": True}], lr=lr,
               momentum=momentum)
    gen = generator(seed, "probe")
    for step in range(steps):
        set_lr(opt, scheduled_lr(step, steps, lr))
        idx = torch.randint(0, z.shape[0], (min(batch, z.shape[0]),), generator=gen)
        loss = F.cross_entropy(head(z[idx]), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():  # fold the standardisation into the layer
        folded = nn.Linear(z.shape[1], num_classes)
        folded.weight.copy_(head.weight / std)
        folded.bias.copy_(head.bias - (head.weight * (mean / std)).sum(1))
    return folded


def linear_probe(model: nn.Module, train_set: ImageDataset, test_set: ImageDataset,
                 label_ids: Tensor, cfg: EvalConfig, seed: int,
                 device: torch.device) -> EvalResult:
    """Linear evaluation: frozen encoder, LARS-trained linear classifier on its features."""
    start = time.perf_counter()
    encoder = _encoder(model)
    train_x = extract_features(encoder, train_set.images[label_ids], cfg.feature_batch, device)
    test_x = extract_features(encoder, test_set.images, cfg.feature_batch, device)
    head = train_linear_classifier(train_x, train_set.labels[label_ids], train_set.num_classes,
                                   cfg.probe_steps, cfg.probe_batch, cfg.probe_lr,
                                   cfg.probe_momentum, seed)
    with torch.no_grad():
        acc = _accuracy(head(test_x), test_set.labels)
    return EvalResult("linear", acc, int(label_ids.numel()), cfg.probe_steps,
                      time.perf_counter() - start)


class Classifier(nn.Module):
    """A backbone with a linear head."""

    def __init__(self, backbone: nn.Module, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.backbone, self.head = backbone, nn.Linear(feature_dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone(x))


def _train_classifier(net: Classifier, train_set: ImageDataset, label_ids: Tensor, steps: int,
                      batch: int, lr: float, seed: int, device: torch.device) -> None:
    """Adam with cosine decay on the labelled subset, flip augmentation only."""
    params = list(net.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    dtype = params[0].dtype
    gen = generator(seed, "classifier")
    aug_seed = derive_seed(seed, "classifier-augment")
    net.train()
    for step in range(steps):
        set_lr(opt, scheduled_lr(step, steps, lr))
        pick = label_ids[torch.randint(0, label_ids.numel(), (min(batch, label_ids.numel()),),
                                       generator=gen)]
        x = flip_view(train_set.images[pick].to(device), pick.to(device), aug_seed, step, dtype)
        loss = F.cross_entropy(net(x), train_set.labels[pick].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


@torch.no_grad()
def _test_accuracy(net: nn.Module, test_set: ImageDataset, batch: int,
                   device: torch.device) -> float:
    logits = extract_features(net, test_set.images, batch, device)
    return _accuracy(logits, test_set.labels)


def finetune(model: nn.Module, train_set: ImageDataset, test_set: ImageDataset,
             label_ids: Tensor, cfg: EvalConfig, seed: int,
             device: torch.device) -> tuple[EvalResult, Classifier]:
    """Full finetuning of a copy of the pretrained backbone plus a linear head (Adam).

    Returns:
        The result and the finetuned network; ``model`` itself is left untouched.
    """
    start = time.perf_counter()
    backbone = copy.deepcopy(_encoder(model))
    net = Classifier(backbone, backbone.feature_dim, train_set.num_classes).to(device)
    net = net.to(next(backbone.parameters()).dtype)
    _train_classifier(net, train_set, label_ids, cfg.finetune_steps, cfg.finetune_batch,
                      cfg.finetune_lr, seed, device)
    acc = _test_accuracy(net, test_set, cfg.feature_batch, device)
    return (EvalResult("finetune", acc, int(label_ids.numel()), cfg.finetune_steps,
                       time.perf_counter() - start), net)


def supervised_from_scratch(model_cfg: ModelConfig, in_channels: int, train_set: ImageDataset,
                            test_set: ImageDataset, label_ids: Tensor, cfg: EvalConfig,
                            seed: int, device: torch.device) -> EvalResult:
    """The same backbone, freshly initialised, trained on the labelled subset (Adam, cosine)."""
    start = time.perf_counter()
    backbone = build_backbone(model_cfg, in_channels, derive_seed(seed, "scratch"))
    net = Classifier(backbone, backbone.feature_dim, train_set.num_classes).to(device)
    steps = max(1, cfg.scratch_epochs * -(-label_ids.numel() // cfg.scratch_batch))
    _train_classifier(net, train_set, label_ids, steps, cfg.scratch_batch, cfg.scratch_lr,
                      seed, device)
    acc = _test_accuracy(net, test_set, cfg.feature_batch, device)
    return EvalResult("supervised", acc, int(label_ids.numel()), steps,
                      time.perf_counter() - start)


def case_features(features: Tensor, case_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Average-pool image encodings per case (the paper's DERM protocol).

    Args:
        features: (N, D) image encodings.
        case_ids: int (N,), the case of each image.

    Returns:
        The sorted distinct case ids (M,) and their mean encodings (M, D).
    """
    keys, slot = torch.unique(case_ids, return_inverse=True)
    sums = torch.zeros(keys.numel(), features.shape[1], dtype=features.dtype)
    sums.index_add_(0, slot, features)
    counts = torch.bincount(slot, minlength=keys.numel()).to(features.dtype)
    return keys, sums / counts[:, None]


def case_linear_probe(train_features: Tensor, train_cases: Tensor, case_labels: dict[int, int],
                      test_features: Tensor, test_cases: Tensor, num_classes: int,
                      cfg: EvalConfig, seed: int) -> EvalResult:
    """Linear probe on case-pooled encodings; ``case_labels`` maps a case id to its label."""
    start = time.perf_counter()
    tr_keys, tr_x = case_features(train_features, train_cases)
    te_keys, te_x = case_features(test_features, test_cases)
    tr_y = torch.tensor([case_labels[int(k)] for k in tr_keys])
    te_y = torch.tensor([case_labels[int(k)] for k in te_keys])
    head = train_linear_classifier(tr_x, tr_y, num_classes, cfg.probe_steps, cfg.probe_batch,
                                   cfg.probe_lr, cfg.probe_momentum, seed)
    with torch.no_grad():
        acc = _accuracy(head(te_x), te_y)
    return EvalResult("case_linear", acc, int(tr_keys.numel()), cfg.probe_steps,
                      time.perf_counter() - start)


def knn_predict(bank: Tensor, bank_labels: Tensor, queries: Tensor, num_classes: int, k: int,
                temperature: float) -> Tensor:
    """Weighted k-NN (Wu et al. 2018): votes exp(cos/τ) of the k nearest bank features."""
    bank, queries = F.normalize(bank, dim=1), F.normalize(queries, dim=1)
    sims, idx = (queries @ bank.T).topk(min(k, bank.shape[0]), dim=1)
    votes = torch.zeros(queries.shape[0], num_classes)
    votes.scatter_add_(1, bank_labels[idx], torch.exp(sims / temperature))
    return votes.argmax(1)


def knn_accuracy(model: nn.Module, train_set: ImageDataset, test_set: ImageDataset, k: int,
                 temperature: float, bank_size: int | None, num_queries: int | None, seed: int,
                 device: torch.device) -> float:
    """k-NN top-1 accuracy of the encoder's features: a cheap monitor during pretraining."""
    gen = generator(seed, "knn")
    bank_ids = torch.randperm(len(train_set), generator=gen)[:bank_size or len(train_set)]
    query_ids = torch.randperm(len(test_set), generator=gen)[:num_queries or len(test_set)]
    encoder = _encoder(model)
    bank = extract_features(encoder, train_set.images[bank_ids], 1024, device)
    queries = extract_features(encoder, test_set.images[query_ids], 1024, device)
    pred = knn_predict(bank, train_set.labels[bank_ids], queries, train_set.num_classes, k,
                       temperature)
    return float((pred == test_set.labels[query_ids]).double().mean())
