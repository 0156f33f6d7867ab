"""Samples that the user's code holds: any tensors, one row per sample, with the client each
belongs to (``data.dataset = "samples"``; ``dcco.fit``, docs/own_code.md).

Unlike a loaded data set, nothing here says what a sample is: uint8 (N, C, H, W) images with
C = 1 or 3 can take dcco's augmentation, and anything else (float images of any channel
count, spectrograms, token ids) goes to the user's own augmentation and encoder as stored.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dcco.data.datasets import DataError


@dataclass(frozen=True, eq=False)
class Samples:
    """One split of the user's samples and their clients.

    Equality is identity (the fields are tensors).

    Attributes:
        name: what the samples are, for records ("samples" by default).
        x: (N, ...), one row per sample, any real dtype.
        clients: int64 (N,), each sample's client as an index into ``client_names``.
        client_names: one name per client index.
        labels: int64 (N,) in [0, num_classes) for the k-NN monitor and probes, or all
            zeros with ``num_classes`` 1 when the samples have none.
        num_classes, class_names: the labels' classes.
    """

    name: str
    x: Tensor
    clients: Tensor
    client_names: tuple[str, ...]
    labels: Tensor
    num_classes: int = 1
    class_names: tuple[str, ...] = ("all",)

    paired = False
    """One modality: both views of a sample come from its row (``ImageDataset`` alike)."""

    def __post_init__(self) -> None:
        if not isinstance(self.x, Tensor) or self.x.ndim < 2 or self.x.dtype == torch.bool \
                or self.x.is_complex():
            raise ValueError(f"Samples.x must be a real tensor (N, ...) with one row per "
                             f"sample, got {getattr(self.x, 'dtype', type(self.x).__name__)} "
                             f"{tuple(getattr(self.x, 'shape', ()))}")
        n = self.x.shape[0]
        for key in ("clients", "labels"):
            t = getattr(self, key)
            if t.dtype != torch.int64 or t.shape != (n,):
                raise ValueError(f"Samples.{key} must be int64 ({n},), got {t.dtype} "
                                 f"{tuple(t.shape)}")
        if n and not 0 <= int(self.clients.min()) <= int(self.clients.max()) < len(
                self.client_names):
            raise ValueError("Samples.clients must index client_names")
        if n and not 0 <= int(self.labels.min()) <= int(self.labels.max()) < self.num_classes:
            raise ValueError(f"Samples.labels must lie in [0, {self.num_classes})")
        if len(self.class_names) != self.num_classes:
            raise ValueError(f"Samples.class_names has {len(self.class_names)} names for "
                             f"num_classes = {self.num_classes}")

    def __len__(self) -> int:
        return int(self.x.shape[0])

    @property
    def images(self) -> Tensor:
        """The samples (the name the image data sets use)."""
        return self.x

    def inputs(self, tower: int = 0) -> Tensor:
        if tower not in (0, 1):
            raise ValueError(f"tower must be 0 or 1, got {tower!r}")
        return self.x

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        shape = tuple(self.x.shape[1:])
        return shape, shape

    def subset(self, indices: Tensor | np.ndarray | list[int]) -> Samples:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return Samples(self.name, self.x[idx.to(self.x.device)].contiguous(),
                       self.clients[idx], self.client_names, self.labels[idx],
                       self.num_classes, self.class_names)


def non_finite(x: Tensor) -> tuple[int, str] | None:
    """The first sample (row) of ``x`` holding NaN or an infinity, and which ("NaN",
    "+inf", "-inf"); None when every value is finite (always, for integer samples). One
    vectorised pass, no loop over the samples."""
    if not x.is_floating_point() or x.numel() == 0:
        return None
    bad = ~torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1)
    if not bool(bad.any()):
        return None
    row = int(bad.nonzero()[0, 0])
    values = x[row].reshape(-1)
    value = values[~torch.isfinite(values)][0]
    return row, "NaN" if bool(value.isnan()) else ("+inf" if float(value) > 0 else "-inf")


def refuse_non_finite(x: Tensor, what: str, clients: Tensor | None = None,
                      client_names: tuple[str, ...] | None = None) -> None:
    """Refuse samples holding NaN or an infinity before anything trains on them, naming the
    first such sample, its client and which sample of that client it is.

    Args:
        x: the samples, one row each.
        what: what they are, for the message ("the training set 'samples'").
        clients, client_names: each sample's client index and the clients' names, if any.

    Raises:
        DataError: a sample holds NaN or an infinity.
    """
    found = non_finite(x)
    if found is None:
        return
    row, value = found
    where = f"sample {row}"
    if clients is not None and client_names is not None:
        own = clients[:row + 1] == clients[row]
        where = (f"client {client_names[int(clients[row])]!r}, its sample {int(own.sum()) - 1} "
                 f"(sample {row} of all)")
    count = int((~torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1)).sum())
    raise DataError(f"{what} holds {value} in {where}"
                    + (f", and {count - 1} more samples hold NaN or an infinity"
                       if count > 1 else "")
                    + ": training on it would turn every weight into NaN. Clean or drop "
                      "those samples (torch.isfinite tells which) before training")


def samples_of_clients(clients: Mapping[Hashable, Tensor], name: str = "samples",
                       labels: Mapping[Hashable, Tensor] | None = None,
                       num_classes: int | None = None) -> Samples:
    """The samples of a mapping from client id to that client's samples (a tensor (n_k, ...)
    each, of one shape and dtype), in the mapping's order.

    Args:
        clients: client id → its samples; ids are any hashable values, named by ``str``.
        labels: client id → int labels (n_k,) of its samples, or None (no labels).
        num_classes: the number of classes (default: the largest label + 1).

    Raises:
        DataError: no clients, a client of no samples, samples of different shapes or
            dtypes, or labels that do not match their samples (each naming the client).
    """
    if not isinstance(clients, Mapping) or not clients:
        raise DataError("the clients must be a non-empty mapping from client id to that "
                        "client's samples (a tensor with one row per sample)")
    rows, owners, tags = [], [], []
    first = None
    for k, (cid, x) in enumerate(clients.items()):
        if not isinstance(x, Tensor):
            try:
                array = np.asarray(x)
                if array.dtype.kind not in "biuf":
                    raise TypeError(f"dtype {array.dtype}")
                x = torch.from_numpy(array)
            except (TypeError, ValueError) as e:
                raise DataError(f"client {cid!r}: its samples are not a numeric array with one "
                                f"row per sample ({e})") from None
        if x.dtype == torch.bool or x.is_complex():
            raise DataError(f"client {cid!r} holds {x.dtype} samples; real numbers are needed")
        if x.ndim < 1 or x.shape[0] == 0:
            raise DataError(f"client {cid!r} has no samples (a tensor with one row per "
                            f"sample is needed, got shape {tuple(x.shape)})")
        if x.ndim == 1:
            x = x[:, None]
        if first is None:
            first = (tuple(x.shape[1:]), x.dtype)
        elif (tuple(x.shape[1:]), x.dtype) != first:
            raise DataError(f"client {cid!r} holds samples of {x.dtype} {tuple(x.shape[1:])}, "
                            f"the first client {first[1]} {first[0]}; every sample must have "
                            f"one shape and dtype")
        if labels is not None:
            if cid not in labels:
                raise DataError(f"labels are given, but not for client {cid!r}")
            try:
                y = torch.as_tensor(np.asarray(labels[cid], dtype=np.int64)).reshape(-1)
            except (TypeError, ValueError) as e:
                raise DataError(f"client {cid!r}: its labels are not integers ({e})") from None
            if y.shape[0] != x.shape[0]:
                raise DataError(f"client {cid!r} has {x.shape[0]} samples and {y.shape[0]} "
                                f"labels")
            if y.numel() and (int(y.min()) < 0 or (num_classes is not None
                                                   and int(y.max()) >= num_classes)):
                raise DataError(f"client {cid!r} has labels outside [0, "
                                f"{num_classes if num_classes is not None else '∞'})")
            tags.append(y)
        rows.append(x)
        owners.append(torch.full((x.shape[0],), k, dtype=torch.int64))
    names = tuple(str(c) for c in clients)
    if len(set(names)) != len(names):
        raise DataError("two client ids have the same name; client ids must differ as strings")
    y = torch.cat(tags) if tags else torch.zeros(sum(len(r) for r in rows), dtype=torch.int64)
    classes = num_classes if num_classes is not None else int(y.max()) + 1 if tags else 1
    return Samples(name, torch.cat(rows).contiguous(), torch.cat(owners), names, y, classes,
                   tuple(str(c) for c in range(classes)) if classes > 1 else ("all",))


__all__ = ["Samples", "samples_of_clients"]
