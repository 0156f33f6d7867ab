"""The standard federated benchmarks of TensorFlow Federated, read from its h5 files (needs
``h5py``, the ``tables`` extra), with their natural clients:

- ``fed_cifar100``: ``fed_cifar100_{train,test}.h5``, CIFAR-100 split by the Pachinko
  allocation of Reddi et al. (2021): 500 training and 100 test clients of 100 images each;
  ``examples/<client>/image`` uint8 (n, 32, 32, 3) and ``label`` (the 100 fine classes).
- ``fed_emnist``: ``fed_emnist_{train,test}.h5``, EMNIST by writer (Caldas et al. 2019,
  3,400 writers, 62 classes); ``examples/<client>/pixels`` float (n, 28, 28) in [0, 1] and
  ``label``. Its test file holds other images of the same writers: that is the benchmark's
  split, so the two sides share clients by design.

Where a network exists the archive is downloaded from TFF's public bucket (SHA-256 checked)
and extracted; offline the error names the files and where to put them. Each file is
decoded once into the verified cache of ``dcco.data.cache`` next to it.
"""

from __future__ import annotations

import hashlib
import http.client
import tarfile
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import torch

from dcco.data.cache import cached_arrays
from dcco.data.datasets import (
    DOWNLOAD_TIMEOUT_S,
    DataError,
    ImageDataset,
    Split,
    download_dir,
    search_dirs,
)

TFF_URL = "https://storage.googleapis.com/tff-datasets-public/"
ARRAYS = ("images", "labels", "clients", "client_names")


@dataclass(frozen=True)
class TffSpec:
    archive: str
    sha256: str
    image_key: str
    num_classes: int
    title: str


TFF = MappingProxyType({
    "fed_cifar100": TffSpec("fed_cifar100.tar.bz2",
                            "e8575e22c038ecef1ce6c7d492d7abee7da13b1e1ba9b70a7fc18531ba7590de",
                            "image", 100, "Fed-CIFAR-100"),
    "fed_emnist": TffSpec("fed_emnist.tar.bz2",
                          "fe1ed5a502cea3a952eb105920bff8cffb32836b5173cb18a57a32c3606f3ea0",
                          "pixels", 62, "Fed-EMNIST"),
})


def _file(name: str, split: Split) -> str:
    return f"{name}_{split}.h5"


def _find(name: str, split: Split, dirs: list[Path]) -> Path | None:
    for folder in dirs:
        for candidate in (folder / _file(name, split), folder / name / _file(name, split)):
            if candidate.is_file():
                return candidate
    return None


def _download(spec: TffSpec, into: Path) -> None:
    """The archive from TFF's bucket, checked against its SHA-256, extracted into ``into``."""
    import urllib.request

    into.mkdir(parents=True, exist_ok=True)
    archive = into / spec.archive
    part = archive.with_suffix(archive.suffix + ".part")
    with urllib.request.urlopen(TFF_URL + spec.archive, timeout=DOWNLOAD_TIMEOUT_S) as r, \
            open(part, "wb") as fh:
        digest = hashlib.sha256()
        while chunk := r.read(1 << 20):
            digest.update(chunk)
            fh.write(chunk)
    if digest.hexdigest() != spec.sha256:
        part.unlink(missing_ok=True)
        raise DataError(f"the download of {TFF_URL + spec.archive} is corrupt (SHA-256 "
                        f"{digest.hexdigest()}, expected {spec.sha256})")
    part.rename(archive)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".h5")]
        for m in members:
            m.name = Path(m.name).name  # flat, and nothing outside ``into``
        tar.extractall(into, members=members)


def _decode(path: Path, spec: TffSpec) -> tuple[np.ndarray, ...]:
    try:
        import h5py
    except ImportError:
        raise DataError(f"{path}: reading TFF's h5 files needs h5py (pip install "
                        f"'dcco[tables]')") from None
    try:
        with h5py.File(path, "r") as f:
            if "examples" not in f:
                raise DataError(f"{path}: no group 'examples'; a TFF client file holds "
                                f"examples/<client>/{{{spec.image_key}, label}}")
            group = f["examples"]
            names = sorted(group.keys())
            images, labels, owners = [], [], []
            for k, client in enumerate(names):
                g = group[client]
                for key in (spec.image_key, "label"):
                    if key not in g:
                        raise DataError(f"{path}: client {client!r} has no {key!r} (it has "
                                        f"{', '.join(g.keys())})")
                x, y = np.asarray(g[spec.image_key]), np.asarray(g["label"]).reshape(-1)
                if x.shape[0] != y.shape[0]:
                    raise DataError(f"{path}: client {client!r} has {x.shape[0]} images but "
                                    f"{y.shape[0]} labels")
                images.append(_as_uint8(x, path, client))
                labels.append(y.astype(np.int64))
                owners.append(np.full(y.shape[0], k, np.int64))
    except (OSError, KeyError) as e:
        raise DataError(f"{path} is not a readable TFF h5 file: {e}") from None
    if not names:
        raise DataError(f"{path}: 'examples' holds no client")
    labels_all = np.concatenate(labels)
    if labels_all.size and not 0 <= labels_all.min() <= labels_all.max() < spec.num_classes:
        raise DataError(f"{path}: labels must lie in [0, {spec.num_classes}), found "
                        f"[{labels_all.min()}, {labels_all.max()}]")
    return (np.concatenate(images), labels_all, np.concatenate(owners),
            np.array(names, dtype=str))


def _as_uint8(x: np.ndarray, path: Path, client: str) -> np.ndarray:
    """(n, H, W[, C]) images as uint8 (n, C, H, W); floats in [0, 1] scaled to [0, 255]."""
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4:
        raise DataError(f"{path}: client {client!r}'s images are {x.shape}; expected "
                        f"(n, H, W) or (n, H, W, C)")
    if x.dtype.kind == "f":
        if x.size and not (np.isfinite(x).all() and x.min() >= 0 and x.max() <= 1):
            raise DataError(f"{path}: client {client!r}'s float images must lie in [0, 1]")
        x = np.rint(x * 255)
    return np.ascontiguousarray(x.astype(np.uint8).transpose(0, 3, 1, 2))


def load_tff(name: str, split: Split, data_dir: str | Path | None = None,
             download: bool = True) -> ImageDataset:
    """One split of a TFF benchmark with its clients (``TFF``)."""
    spec = TFF[name]
    dirs = search_dirs(data_dir)
    path = _find(name, split, dirs)
    failure = "download=False, so no download was tried"
    if path is None and download:
        try:
            _download(spec, download_dir(data_dir))
            path = _find(name, split, [download_dir(data_dir)])
        except (OSError, http.client.HTTPException, tarfile.TarError) as e:
            failure = f"the download from {TFF_URL + spec.archive} failed: {e}"
    if path is None:
        raise DataError(
            f"{spec.title} file {_file(name, split)} not found in {', '.join(map(str, dirs))} "
            f"({failure}). To get it: download {TFF_URL + spec.archive}, extract "
            f"{_file(name, 'train')} and {_file(name, 'test')}, and put them in one of those "
            f"folders (e.g. data.data_dir or $DCCO_DATA)")
    images, labels, owners, names = cached_arrays(
        f"{name}-{split}", [path], [path.parent, download_dir(data_dir)],
        lambda: _decode(path, spec), ARRAYS)
    return ImageDataset(name, torch.from_numpy(np.array(images)),
                        torch.from_numpy(np.array(labels)), spec.num_classes,
                        tuple(str(i) for i in range(spec.num_classes)),
                        torch.from_numpy(np.array(owners)), tuple(str(n) for n in names))


__all__ = ["TFF", "TFF_URL", "load_tff"]
