"""Clients from the Flower ecosystem: a Hugging Face ``datasets.Dataset`` split by a
``flwr-datasets`` partitioner (``NaturalIdPartitioner``, ``DirichletPartitioner``, ...), as
``dcco.fit``'s mapping of clients or a Flower node's samples (docs/own_code.md).

Needs ``pip install 'dcco[datasets]'`` (``flwr-datasets``, which brings ``datasets``); imported
only when used.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from dcco.data.datasets import DataError


def column_tensor(dataset: Any, column: str = "image") -> Tensor:
    """One column of a ``datasets.Dataset`` as a tensor with one row per sample: images (the
    ``Image`` feature, or uint8 arrays (H, W) or (H, W, C)) as uint8 (N, C, H, W), which dcco's
    augmentation and ``fit`` take; any other numeric column with its stored dtype, (N, ...).

    Images of 8-bit modes go to grey (L) or RGB (palette and alpha images to RGB); 16-bit,
    32-bit and float images are refused rather than cut to 8 bits.

    Raises:
        DataError: no such column, an empty dataset, text, rows of different shapes, or
            images of more than 8 bits.
    """
    names = list(getattr(dataset, "column_names", []) or [])
    if column not in names:
        raise DataError(f"the dataset has no column {column!r}; its columns are "
                        f"{', '.join(names) or 'none'}")
    if len(dataset) == 0:
        raise DataError("the dataset (or partition) holds no samples")
    feature = getattr(dataset, "features", {}).get(column)
    if type(feature).__name__ == "Image":
        return _images(dataset, column)
    rows = dataset.with_format("numpy", columns=[column])[0:len(dataset)][column]
    try:  # one array, or (rows of different shapes) a list or object array
        array = rows if isinstance(rows, np.ndarray) and rows.dtype != object else np.stack(
            [np.asarray(r) for r in rows])
    except ValueError as e:
        raise DataError(f"column {column!r} holds rows of different shapes ({e})") from None
    if array.dtype.kind not in "biuf":
        raise DataError(f"column {column!r} holds {array.dtype} values, not numbers")
    stored = _stored_dtype(feature)
    if stored is not None:  # numpy hands Array2D/3D and lists back as int64 or float32
        array = array.astype(stored, copy=False)
    if array.dtype == np.uint8 and array.ndim in (3, 4):  # images stored as arrays
        return torch.from_numpy(np.ascontiguousarray(_nchw(array)))
    return torch.from_numpy(np.ascontiguousarray(array))


def _stored_dtype(feature: Any) -> np.dtype | None:
    """The numpy dtype a feature stores (Value, Array2D/3D, or a list of them), or None."""
    while feature is not None:
        dtype = getattr(feature, "dtype", None)
        if isinstance(dtype, str) and dtype not in ("string", "large_string", "list"):
            try:
                return np.dtype(dtype)
            except TypeError:
                return None
        feature = getattr(feature, "feature", None)
    return None


def _nchw(array: np.ndarray) -> np.ndarray:
    """(N, H, W) → (N, 1, H, W); (N, H, W, C) with C = 1 or 3 → (N, C, H, W)."""
    if array.ndim == 3:
        return array[:, None]
    if array.shape[-1] in (1, 3) and array.shape[1] not in (1, 3):
        return array.transpose(0, 3, 1, 2)
    return array


def _images(dataset: Any, column: str) -> Tensor:
    """An ``Image`` column as uint8 (N, C, H, W): grey when every image is, else RGB."""
    images = dataset.with_format(None)[0:len(dataset)][column]
    modes = {im.mode for im in images}
    deep = sorted(m for m in modes if m.startswith(("I", "F")))
    if deep:
        raise DataError(f"column {column!r} holds {deep[0]} images (more than 8 bits a "
                        f"channel); convert them to 8 bits (L or RGB) as your data needs")
    grey = modes <= {"L", "1"}
    try:
        arrays = [np.asarray(im.convert("L" if grey else "RGB"), dtype=np.uint8)
                  for im in images]
        array = np.stack(arrays)
    except ValueError as e:
        raise DataError(f"column {column!r} holds images of different sizes ({e})") from None
    return torch.from_numpy(np.ascontiguousarray(_nchw(array)))


def clients_of_partitioner(partitioner: Any, column: str = "image",
                           dataset: Any | None = None) -> dict[int, Tensor]:
    """Every non-empty partition of a ``flwr-datasets`` partitioner as one client: partition
    id → its samples of ``column`` (``column_tensor``), for ``dcco.fit``.

    Args:
        partitioner: e.g. ``DirichletPartitioner(num_partitions=100, partition_by="label",
            alpha=0.1)`` or ``NaturalIdPartitioner(partition_by="writer_id")``.
        column: the samples' column.
        dataset: the ``datasets.Dataset`` to split, if the partitioner has none yet.
    """
    if dataset is not None:
        partitioner.dataset = dataset
    out = {}
    for pid in range(partitioner.num_partitions):
        part = partitioner.load_partition(pid)
        if len(part):
            out[pid] = column_tensor(part, column)
    if not out:
        raise DataError("every partition of the partitioner is empty")
    return out


__all__ = ["clients_of_partitioner", "column_tensor"]
