"""Evaluation protocols of the paper (§4, appendix B); the projector is discarded in all of them.

- linear probe: the encoder frozen, a linear classifier trained with LARS on its features,
  which are computed once and cached (no augmentation, so every step would recompute them);
- full finetuning: a copy of the backbone plus a linear head trained with Adam, flips only;
- supervised from scratch: the same backbone freshly initialised, trained on the same labels;
- case-level probe: the image encodings of a case average-pooled before the linear classifier
  (the paper's DERM protocol, §4 "Networks");
- k-NN monitor: weighted k-NN on L2-normalised features (Wu et al. 2018), cheap enough to run
  during pretraining.

Every protocol trains on a class-balanced labelled subset of the training split
(``labelled_subset``) and reports top-1 accuracy on the full test split. Nothing here prints
or touches the disk; results are ``EvalResult`` values that the caller records.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcco.augment import flip_view, model_input
from dcco.data.datasets import ImageDataset
from dcco.data.paired import Dataset, PairedDataset
from dcco.errors import UserError
from dcco.models import ModelConfig, build_backbone
from dcco.optim import OptimConfig, build_optimizer, scheduled_lr, set_lr
from dcco.seeding import derive_seed, generator


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation settings (section ``[eval]``); defaults are the paper's CIFAR-100 protocols
    with 5,000 labels (appendix B). ``for_labels(500)`` gives the 500-label probe."""

    labels: int = 5000
    """Labelled training samples, class-balanced."""
    probe_steps: int = 1000
    """Linear probe: LARS steps (paper: 1000 for 5K labels, 400 for 500)."""
    probe_batch: int = 512
    """Linear probe batch (paper: 512 for 5K labels, 128 for 500)."""
    probe_lr: float = 2.0
    """Linear probe initial learning rate, cosine-decayed (paper: 2.0 for 5K, 2.5 for 500)."""
    probe_momentum: float = 0.9
    finetune_steps: int = 100
    """Full finetuning: Adam steps (paper: 100)."""
    finetune_batch: int = 256
    finetune_lr: float = 5e-3
    scratch_epochs: int = 100
    """Supervised from scratch: epochs over the labelled subset (paper: 100)."""
    scratch_batch: int = 256
    scratch_lr: float = 0.01
    knn_k: int = 200
    """Neighbours voting in the k-NN monitor (Wu et al. 2018 use 200)."""
    knn_temperature: float = 0.1
    """τ in the vote weight exp(cos / τ)."""
    knn_bank: int | None = 10000
    """Training images in the k-NN bank; None: all."""
    knn_queries: int | None = 2000
    """Test images the k-NN monitor classifies; None: all."""
    feature_batch: int = 1024
    """Images per forward pass when computing features or test predictions."""

    def __post_init__(self) -> None:
        for name in ("labels", "probe_steps", "probe_batch", "finetune_steps", "finetune_batch",
                     "scratch_epochs", "scratch_batch", "knn_k", "feature_batch"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"eval.{name} must be an integer >= 1, got {value!r}")
        for name in ("probe_lr", "finetune_lr", "scratch_lr", "knn_temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"eval.{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.probe_momentum < 1:
            raise ValueError(f"eval.probe_momentum must be in [0, 1), got {self.probe_momentum!r}")
        for name in ("knn_bank", "knn_queries"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ValueError(f"eval.{name} must be an integer >= 1 or none, got {value!r}")

    @classmethod
    def for_labels(cls, labels: int, base: EvalConfig | None = None) -> EvalConfig:
        """``base`` (default: the paper's settings) with ``labels`` labelled samples.

        The paper gives probe settings for two label counts: 5,000 (the defaults) and 500
        (400 steps, batch 128, lr 2.5). Exactly 500 labels takes the latter; every other count
        keeps ``base``'s probe settings.
        """
        base = base or cls()
        if labels == 500:
            return replace(base, labels=500, probe_steps=400, probe_batch=128, probe_lr=2.5)
        return replace(base, labels=labels)


@dataclass(frozen=True)
class EvalResult:
    """The outcome of one evaluation (recorded as JSON in a run's summary)."""

    protocol: str
    """``linear``, ``finetune``, ``supervised`` or ``case_linear``."""
    accuracy: float
    """Top-1 accuracy on the full test split, in [0, 1]."""
    num_labels: int
    """Labelled training samples (cases, for the case-level probe)."""
    steps: int
    """Optimiser steps taken."""
    seconds: float
    """Wall-clock time of the whole protocol, feature extraction and testing included."""
    num_test: int
    """Test samples (cases) scored."""
    train_accuracy: float | None = None
    """Top-1 accuracy on the labelled training samples, in [0, 1]: linear probes only, where
    the features are at hand (elsewhere it would cost another pass over the images)."""
    revision: int = 0
    """The protocol's revision (``PROTOCOL_REVISION``); 0 fills in the current one."""
    details: dict | None = None
    """What a protocol measures besides its headline accuracy (retrieval: recall@1 and @5 in
    both directions, and the similarity used)."""

    def __post_init__(self) -> None:
        if self.revision == 0:
            object.__setattr__(self, "revision", PROTOCOL_REVISION.get(self.protocol, 1))


PROTOCOL_REVISION = {"linear": 1, "linear_y": 1, "case_linear": 1, "finetune": 2,
                     "supervised": 2, "retrieval": 1}
"""Bumped whenever a protocol changes what its accuracy means, and recorded with each result,
so that harnesses re-run evaluations recorded under an older revision. Revision 2 of finetune
and supervised: the head reads batch-normalised features (``Classifier``); revision 1 (results
without a ``revision`` field) fed raw features to the head, which broke finetuning of encoders
with large features."""


def is_current(entry: dict) -> bool:
    """Whether a recorded evaluation (a summary's ``evaluations`` entry) was made under its
    protocol's current revision."""
    return entry.get("revision", 1) == PROTOCOL_REVISION.get(entry.get("protocol", ""), 1)


# ------------------------------------------------------------------------ labels and features


def labelled_subset(labels: Tensor, n: int, num_classes: int, seed: int) -> Tensor:
    """``n`` training sample ids, class-balanced and seeded.

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


# ------------------------------------------------------------------------------ linear probe


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
                          OptimConfig(name="lars", lr=lr, momentum=momentum))
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


# ------------------------------------------------------------------------------ cases (DERM)


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


# --------------------------------------------------------------- finetuning and from scratch


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
    opt = build_optimizer(net.named_parameters(), OptimConfig(name="adam", lr=lr))
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


# ------------------------------------------------------------------------------ k-NN monitor


def knn_predict(bank: Tensor, bank_labels: Tensor, queries: Tensor, num_classes: int, k: int,
                temperature: float, chunk: int = 1024) -> Tensor:
    """Weighted k-NN classification (Wu et al. 2018).

    Each query's k most cosine-similar bank features vote for their labels with weight
    exp(s / τ); the class with the largest vote wins.

    Args:
        bank: float (N, D) reference features.
        bank_labels: int64 (N,) their labels.
        queries: float (M, D), on the bank's device.
        num_classes: number of classes.
        k: neighbours (at most N are used).
        temperature: τ > 0.
        chunk: queries per similarity block, bounding memory to chunk × N.

    Returns:
        int64 (M,) predicted labels, on the queries' device.
    """
    bank = F.normalize(bank.float(), dim=1)
    bank_labels = bank_labels.to(bank.device)
    preds = []
    for q in F.normalize(queries.float(), dim=1).split(chunk):
        sims, idx = (q @ bank.T).topk(min(k, bank.shape[0]), dim=1)
        # subtracting each query's top similarity changes no argmax and keeps exp finite
        weights = torch.exp((sims - sims[:, :1]) / temperature)
        votes = torch.zeros(q.shape[0], num_classes, device=q.device)
        preds.append(votes.scatter_add_(1, bank_labels[idx], weights).argmax(1))
    return torch.cat(preds)


def knn_accuracy(model: nn.Module, train_set: Dataset, test_set: Dataset, k: int,
                 temperature: float, bank_size: int | None, num_queries: int | None, seed: int,
                 device: torch.device, batch_size: int = 1024) -> float:
    """Weighted k-NN top-1 accuracy of the encoder's features: the pretraining monitor.

    The bank (training images) and the queries (test images) are random subsets drawn from
    the stream ``(seed, "knn")``, the same ones at every call, so successive values during a
    run are comparable.

    Args:
        model: a ``DualEncoder`` or a backbone, on ``device``; its mode is restored.
        train_set, test_set: the splits.
        k, temperature: see ``knn_predict``.
        bank_size, num_queries: subset sizes; None (or more than the split holds): all.
        seed: the run seed.
        device: where features are computed.
        batch_size: images per forward pass.

    Returns:
        Accuracy in [0, 1] on the queried test images.
    """
    if k < 1 or not temperature > 0:
        raise ValueError(f"k-NN needs k >= 1 and temperature > 0, got k={k}, "
                         f"temperature={temperature}")
    gen = generator(seed, "knn")
    bank_ids = torch.randperm(len(train_set), generator=gen)[:bank_size or len(train_set)]
    query_ids = torch.randperm(len(test_set), generator=gen)[:num_queries or len(test_set)]
    bank = extract_features(model, train_set.inputs(0)[bank_ids], batch_size, device)
    queries = extract_features(model, test_set.inputs(0)[query_ids], batch_size, device)
    pred = knn_predict(bank, train_set.labels[bank_ids], queries, train_set.num_classes, k,
                       temperature)
    return float((pred == test_set.labels[query_ids].to(pred.device)).double().mean())


# ------------------------------------------------------------------- cross-modal retrieval


RETRIEVAL_KS = (1, 5)
Similarity = str
"""How retrieval compares encodings: "standardized", each projection dimension z-scored over
the gallery, then cosine (the space the CCO loss correlates: its encodings are batch-
standardised); "cosine", cosine of the projections as they are (the space a contrastive loss
compares in)."""


def retrieval_ranks(queries: Tensor, gallery: Tensor, chunk: int = 1024) -> Tensor:
    """The rank of each query's own partner among all of the gallery: query i's partner is
    gallery row i; rank 0 is best. Ties count in the query's favour (strictly more similar
    rows only).

    Args:
        queries, gallery: float (M, d), L2-normalised, on one device.
        chunk: queries per similarity block (memory chunk × M).

    Returns:
        int64 (M,) ranks.
    """
    if queries.shape != gallery.shape:
        raise ValueError(f"retrieval needs one partner per query, got {tuple(queries.shape)} "
                         f"queries and {tuple(gallery.shape)} gallery rows")
    ranks = []
    for start in range(0, queries.shape[0], chunk):
        q = queries[start:start + chunk]
        sims = q @ gallery.T
        own = sims[torch.arange(q.shape[0]), torch.arange(start, start + q.shape[0])]
        ranks.append((sims > own[:, None]).sum(1))
    return torch.cat(ranks)


def comparable(encodings: Tensor, similarity: Similarity) -> Tensor:
    """Encodings (M, d) mapped into ``similarity``'s space, L2-normalised (float64)."""
    z = encodings.double()
    if similarity == "standardized":
        z = (z - z.mean(0)) / (z.std(0, correction=0) + 1e-12)
    elif similarity != "cosine":
        raise ValueError(f"similarity must be 'standardized' or 'cosine', got {similarity!r}")
    return F.normalize(z, dim=1)


def retrieval(model: nn.Module, test_set: PairedDataset, gallery: int, seed: int,
              device: torch.device, similarity: Similarity = "standardized",
              batch_size: int = 1024, progress: StepCallback | None = None) -> EvalResult:
    """Cross-modal retrieval: each X of a gallery of test pairs finds its Y among the
    gallery's Ys, and each Y its X, by the similarity of their projections (the encodings the
    loss saw: tower 0 on X, tower 1 on Y).

    Args:
        model: a two-tower ``DualEncoder`` on ``device``.
        test_set: the test pairs.
        gallery: pairs in the gallery, drawn from the stream ``(seed, "retrieval")`` (all
            when at least the split's size).
        seed: the run seed.
        device: where the encodings are computed.
        similarity: see ``Similarity``.

    Returns:
        ``accuracy``: the mean of recall@1 X→Y and Y→X; ``details``: recall@1 and @5 of each
        direction and the similarity.
    """
    if not getattr(test_set, "paired", False):
        raise UserError("retrieval pairs two modalities; this data set holds images (use a "
                        "paired data set, e.g. data.dataset = 'fashion_mnist_halves')")
    start = time.perf_counter()
    n = min(gallery, len(test_set))
    ids = torch.randperm(len(test_set), generator=generator(seed, "retrieval"))[:n]
    f, g = (_batched(lambda x, t=t: model.encode(x, t), model, test_set.inputs(t)[ids],
                     batch_size, device, _default_dtype(model), progress) for t in (0, 1))
    f, g = comparable(f, similarity), comparable(g, similarity)
    details: dict = {"similarity": similarity, "gallery": n}
    for name, (q, r) in {"x_to_y": (f, g), "y_to_x": (g, f)}.items():
        ranks = retrieval_ranks(q, r)
        details[name] = {f"recall@{k}": float((ranks < k).double().mean()) for k in RETRIEVAL_KS}
    accuracy = (details["x_to_y"]["recall@1"] + details["y_to_x"]["recall@1"]) / 2
    return EvalResult(protocol="retrieval", accuracy=accuracy, num_labels=0, steps=0,
                      seconds=time.perf_counter() - start, num_test=n, details=details)
