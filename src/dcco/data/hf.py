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
    """One column of a ``datasets.Dataset`` as a tensor with one row per sample: images
    (PIL, or arrays (H, W) or (H, W, C)) as uint8 (N, C, H, W), which dcco's augmentation and
    ``fit`` take; any other array column as stored, (N, ...).

    Raises:
        DataError: no such column, an empty dataset, or rows of different shapes.
    """
    names = list(getattr(dataset, "column_names", []) or [])
    if column not in names:
        raise DataError(f"the dataset has no column {column!r}; its columns are "
                        f"{', '.join(names) or 'none'}")
    if len(dataset) == 0:
        raise DataError("the dataset (or partition) holds no samples")
    rows = dataset.with_format("numpy", columns=[column])[0:len(dataset)][column]
    try:  # one array, or (rows of different shapes, or images) a list or object array
        array = rows if isinstance(rows, np.ndarray) and rows.dtype != object else np.stack(
            [np.asarray(r) for r in rows])
    except ValueError as e:
        raise DataError(f"column {column!r} holds rows of different shapes ({e})") from None
    feature = getattr(dataset, "features", {}).get(column)
    image = type(feature).__name__ == "Image"
    stored = getattr(feature, "dtype", None)  # Array2D/3D, Value: numpy hands back int64
    if isinstance(stored, str) and stored not in ("string", "large_string") and not image:
        try:
            array = array.astype(np.dtype(stored), copy=False)
        except TypeError:
            pass
    if image or (array.dtype == np.uint8 and array.ndim in (3, 4)):
        if array.ndim == 3:  # (N, H, W): one channel
            array = array[:, None]
        elif array.shape[-1] in (1, 3, 4) and array.shape[1] not in (1, 3):
            array = array[..., :3].transpose(0, 3, 1, 2)  # (N, H, W, C) → (N, C, H, W)
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.uint8))
    return torch.from_numpy(np.ascontiguousarray(array))


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
