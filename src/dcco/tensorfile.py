"""Tensor files in safetensors' format (a little-endian header length, a JSON header of each
tensor's dtype, shape and byte range, then the bytes), written and read a tensor at a time.

A checkpoint of FedEMA at the paper's client counts holds thousands of clients' models (6.2
GiB at non-IID 4 by round 300). Stacking them into tensors to save them, and loading the
whole file to restore them, each held a second copy of the store for a moment. Here a
``Stacked`` tensor is written row by row from the tensors it stacks, and ``TensorFile``
reads one tensor when it is asked for, so a checkpoint costs no more than its largest
tensor beyond what the run holds. The files are ordinary safetensors files: safetensors'
own ``load_file`` reads them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from dcco.files import atomic_writer

CODES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
         torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
         torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
"""safetensors' name of each dtype a file of ours may hold."""


@dataclass(frozen=True)
class Stacked:
    """Tensors of one shape and dtype, saved as ``torch.stack(rows)`` without being stacked
    in memory.

    Raises:
        ValueError: no rows, or rows of different shapes or dtypes.
    """

    rows: tuple[Tensor, ...]

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError("a Stacked tensor needs at least one row")
        first = self.rows[0]
        for i, row in enumerate(self.rows):
            if row.shape != first.shape or row.dtype != first.dtype:
                raise ValueError(f"row {i} of a Stacked tensor is {row.dtype} "
                                 f"{tuple(row.shape)}, row 0 {first.dtype} "
                                 f"{tuple(first.shape)}: rows must match")

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.rows), *self.rows[0].shape))

    @property
    def dtype(self) -> torch.dtype:
        return self.rows[0].dtype

    def tensor(self) -> Tensor:
        """The stack itself (a copy of every row)."""
        return torch.stack(self.rows)


def _parts(value: Tensor | Stacked) -> tuple[Tensor, ...]:
    return value.rows if isinstance(value, Stacked) else (value,)


def _bytes(t: Tensor) -> memoryview:
    """``t``'s bytes in C order on the CPU (a view of them where ``t`` is already so)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def write_tensors(path: str | Path, tensors: Mapping[str, Tensor | Stacked],
                  metadata: Mapping[str, str] | None = None, sync: bool = True) -> None:
    """Write ``tensors`` to ``path`` as a safetensors file, atomically (a temporary file
    beside it, flushed to disk unless not ``sync``, then ``os.replace``), a row of a
    ``Stacked`` tensor at a time.

    The tensors go in order of element size, largest first, so that each one's bytes start
    at a multiple of its element size, as safetensors' own writer places them.

    Raises:
        ValueError: a dtype safetensors has no name for.
    """
    path = Path(path)
    order = sorted(tensors, key=lambda k: (-tensors[k].dtype.itemsize, k))
    header: dict[str, object] = {}
    offset = 0
    for name in order:
        value = tensors[name]
        if value.dtype not in CODES:
            raise ValueError(f"tensor {name!r} is {value.dtype}, which a safetensors file "
                             f"cannot hold")
        size = value.shape.numel() * value.dtype.itemsize
        header[name] = {"dtype": CODES[value.dtype], "shape": list(value.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with atomic_writer(path, sync) as fh:
        fh.write(len(head).to_bytes(8, "little"))
        fh.write(head)
        for name in order:
            for part in _parts(tensors[name]):
                fh.write(_bytes(part))


class TensorFile(Mapping[str, Tensor]):
    """The tensors of a safetensors file whose names start with ``prefix`` (the prefix
    dropped), each read from the file when it is asked for.

    Raises:
        SafetensorError, OSError: the file is missing or not a safetensors file (when it is
            opened, and on a read if it changed since).
    """

    def __init__(self, path: str | Path, prefix: str = "") -> None:
        self.path, self.prefix = Path(path), prefix
        with safe_open(self.path, framework="pt") as f:
            self._keys = [k[len(prefix):] for k in f.keys() if k.startswith(prefix)]  # noqa: SIM118
            self.metadata: dict[str, str] = f.metadata() or {}
        self._known = set(self._keys)

    def __getitem__(self, key: str) -> Tensor:
        if key not in self._known:
            raise KeyError(key)
        with safe_open(self.path, framework="pt") as f:
            return f.get_tensor(self.prefix + key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._known


__all__ = ["CODES", "SafetensorError", "Stacked", "TensorFile", "write_tensors"]
