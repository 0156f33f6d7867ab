"""Paired data: each sample is a pair (X, Y) of two modalities, one per tower of a dual encoder.

``PairedDataset`` is the interface for data of two modalities (image–text, two camera
angles, two halves of an image): two sample tensors of their own shapes and dtypes, one label
per pair. dcco keeps both on the device, gathers a round's pairs by index, and turns each
modality into its tower's input (``dcco.data.augment.modality_view``):

- uint8 ``(N, C, H, W)`` images, C = 1 or 3: augmented with the modality's ``[augment]``
  (X) or ``[augment_y]`` (Y) section, or only normalised to [−1, 1] when it is disabled;
- anything else (float features, integer token ids): passed to the tower as stored, floats in
  the run's dtype. Such a modality takes no augmentation and needs a tower that reads it (the
  ``mlp`` backbone for flat float features, or the user's own module; docs/multimodal.md).

Labels are used to partition the clients non-IID and by the linear probes; pairs without
classes take one label for all (``num_classes = 1``), which makes every partition IID.

Two paired data sets come with dcco:

- ``fashion_mnist_halves``: the classic two-view benchmark of deep CCA (Andrew et al. 2013)
  on Fashion-MNIST: X the left half (1 × 28 × 14) of each image, Y the right half;
- ``paired_npz``: the user's own pairs, ``train.npz`` and ``test.npz`` in ``data.data_dir``,
  each holding arrays ``x`` (N, ...), ``y`` (N, ...) and ``labels`` (N,) (integers), and
  optionally ``class_names`` (strings).

``pairs`` names pairs that the user's code builds and hands to ``dcco.run.pretraining.Pretraining`` (or
``run_pretraining``) itself, with nothing loaded from files.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from dcco.config.sections import PAIRED_DATASETS
from dcco.data.datasets import DataError, ImageDataset, Split
from dcco.data.samples import Samples

NPZ_KEYS = ("x", "y", "labels")


@dataclass(frozen=True, eq=False)
class PairedDataset:
    """Pairs (X, Y) and a label per pair, of one split.

    Equality is identity (the fields are tensors).

    Attributes:
        name: the data set.
        x: the first modality, (N, ...): uint8 (N, C, H, W) images (C = 1 or 3), or features
            of any numeric dtype (an ``mlp`` tower casts integers to floats; a tower of the
            user's own gets them as stored).
        y: the second modality, (N, ...), likewise; its shape and dtype are its own.
        labels: int64 (N,), in [0, num_classes).
        num_classes: number of classes (1 for unlabelled pairs).
        class_names: one name per class.
    """

    name: str
    x: Tensor
    y: Tensor
    labels: Tensor
    num_classes: int
    class_names: tuple[str, ...]

    paired = True
    """Whether the samples are pairs of two modalities (an ``ImageDataset`` says False)."""

    def __post_init__(self) -> None:
        for key in ("x", "y"):
            t = getattr(self, key)
            if not isinstance(t, Tensor) or t.ndim < 2 or t.dtype in (torch.bool,) \
                    or t.is_complex():
                raise ValueError(f"PairedDataset.{key} must be a real tensor (N, ...) with one "
                                 f"row per pair, got "
                                 f"{getattr(t, 'dtype', type(t).__name__)} "
                                 f"{tuple(getattr(t, 'shape', ()))}")
            if t.shape[0] != self.labels.shape[0]:
                raise ValueError(f"PairedDataset.{key} holds {t.shape[0]} samples but labels "
                                 f"holds {self.labels.shape[0]}; every pair needs its x, y and "
                                 f"label")
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(f"PairedDataset.{key} holds NaN or infinite values")
            if not t.is_contiguous():
                object.__setattr__(self, key, t.contiguous())
        if self.labels.dtype != torch.int64 or self.labels.ndim != 1:
            raise ValueError(f"PairedDataset.labels must be int64 (N,), got "
                             f"{self.labels.dtype} {tuple(self.labels.shape)}")
        if self.num_classes < 1 or len(self.class_names) != self.num_classes:
            raise ValueError(f"PairedDataset.class_names has {len(self.class_names)} names for "
                             f"num_classes = {self.num_classes} (at least 1)")
        if self.labels.numel() and not (0 <= int(self.labels.min())
                                        and int(self.labels.max()) < self.num_classes):
            raise ValueError(f"PairedDataset.labels must lie in [0, {self.num_classes}), got "
                             f"[{int(self.labels.min())}, {int(self.labels.max())}]")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def inputs(self, tower: int) -> Tensor:
        """The samples of tower ``tower``'s modality: X for 0, Y for 1."""
        if tower not in (0, 1):
            raise ValueError(f"tower must be 0 (X) or 1 (Y), got {tower!r}")
        return self.x if tower == 0 else self.y

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shape of one X and of one Y."""
        return tuple(self.x.shape[1:]), tuple(self.y.shape[1:])

    def subset(self, indices: Tensor | np.ndarray | list[int]) -> PairedDataset:
        """The pairs ``indices`` (int (M,), in that order) as a new data set."""
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return PairedDataset(self.name, self.x[idx.to(self.x.device)],
                             self.y[idx.to(self.y.device)], self.labels[idx.to(self.labels.device)],
                             self.num_classes, self.class_names)


Dataset = ImageDataset | PairedDataset | Samples
"""What pretraining and evaluation take: images (two augmented views of each), pairs, or the
user's own samples (``dcco.data.samples``)."""


def is_paired(name: str) -> bool:
    """Whether data set ``name`` holds pairs of two modalities."""
    return name in PAIRED_DATASETS


def halves(images: ImageDataset) -> PairedDataset:
    """The two-view data set of an image data set: X the left half of every image (columns
    [0, W/2)), Y the right half ([W/2, W)), and the image's label."""
    w = images.images.shape[-1]
    if w < 2 or w % 2:
        raise ValueError(f"halves needs images of an even width, got {w}")
    return PairedDataset(f"{images.name}_halves", images.images[..., : w // 2].contiguous(),
                         images.images[..., w // 2:].contiguous(), images.labels,
                         images.num_classes, images.class_names)


def load_npz_pairs(split: Split, data_dir: str | Path | None) -> PairedDataset:
    """The user's pairs of one split: ``<data_dir>/<split>.npz`` with ``x``, ``y``, ``labels``
    and optionally ``class_names`` (see the module docs).

    Raises:
        DataError: no ``data_dir``, a missing or unreadable file, a missing array, or arrays
            that do not fit together (each named).
    """
    if data_dir is None:
        raise DataError("data.dataset = 'paired_npz' reads train.npz and test.npz from "
                        "data.data_dir (or --data-dir); none was given")
    path = Path(data_dir).expanduser() / f"{split}.npz"
    if not path.is_file():
        raise DataError(f"{path} does not exist; paired_npz needs train.npz and test.npz in "
                        f"{path.parent}, each with arrays x, y and labels (docs/multimodal.md)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in NPZ_KEYS if k not in npz.files]
            if missing:
                raise DataError(f"{path} lacks the array(s) {', '.join(missing)}; it has "
                                f"{', '.join(npz.files) or 'none'} (needed: x, y, labels)")
            arrays = {k: np.asarray(npz[k]) for k in npz.files}
    except DataError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise DataError(f"{path} is not a readable .npz file: {type(e).__name__}: {e}") from None
    labels = arrays["labels"]
    if labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise DataError(f"{path}: labels must be a vector of integers, got {labels.dtype} "
                        f"{labels.shape}")
    if labels.size and labels.min() < 0:
        raise DataError(f"{path}: labels must be >= 0, found {int(labels.min())}")
    if "class_names" in arrays:
        names = tuple(str(n) for n in arrays["class_names"].reshape(-1))
    else:
        names = tuple(f"class_{i}" for i in range(int(labels.max()) + 1 if labels.size else 1))
    if labels.size and int(labels.max()) >= len(names):
        raise DataError(f"{path}: a label is {int(labels.max())} but class_names names only "
                        f"{len(names)} classes")
    tensors = {}
    for key in ("x", "y"):
        a = arrays[key]
        if a.dtype.kind not in "uif" or a.ndim < 2:
            raise DataError(f"{path}: {key} must be a numeric array (N, ...) with one row per "
                            f"pair, got {a.dtype} {a.shape}")
        if a.shape[0] != labels.shape[0]:
            raise DataError(f"{path}: {key} holds {a.shape[0]} rows but labels holds "
                            f"{labels.shape[0]}")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise DataError(f"{path}: {key} holds NaN or infinite values")
        if a.dtype.kind == "u" and a.dtype != np.uint8:
            a = a.astype(np.int64)  # torch lacks most unsigned dtypes
        tensors[key] = torch.from_numpy(np.ascontiguousarray(a))
    return PairedDataset("paired_npz", tensors["x"], tensors["y"],
                         torch.from_numpy(labels.astype(np.int64)), len(names), names)


__all__ = ["PAIRED_DATASETS", "Dataset", "PairedDataset", "halves", "is_paired", "load_npz_pairs"]
