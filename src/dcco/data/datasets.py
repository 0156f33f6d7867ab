"""Image data sets as uint8 tensors: Fashion-MNIST (IDX) and CIFAR-10/100 (python pickle).

Only this layer touches data files. Images stay uint8 (N, C, H, W) so a whole data set sits on
the device and a round gathers its samples by index. Every problem with a file raises
``DataError`` naming the file.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import shutil
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

DatasetName = Literal["fashion_mnist", "cifar10", "cifar100"]
Split = Literal["train", "test"]

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
FASHION_MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot")
CIFAR = {
    "cifar10": {"folder": "cifar-10-batches-py", "archive": "cifar-10-python.tar.gz",
                    "md5": "c58f30108f718f92721af3b95e74349a", "label_key": b"labels",
                    "train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"],
                    "meta": "batches.meta", "names_key": b"label_names", "classes": 10},
    "cifar100": {"folder": "cifar-100-python", "archive": "cifar-100-python.tar.gz",
                     "md5": "eb9058c3a382ffc7106e4002c42a8d85", "label_key": b"fine_labels",
                     "train": ["train"], "test": ["test"], "meta": "meta",
                     "names_key": b"fine_label_names", "classes": 100},
}
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/"
DOWNLOAD_TIMEOUT_S = 10


class DataError(ValueError):
    """A data file is missing, corrupt or inconsistent; the message names the file."""


@dataclass(frozen=True)
class ImageDataset:
    """Images and labels of one split.

    Attributes:
        name: the data set, e.g. ``"fashion_mnist"``.
        images: uint8 (N, C, H, W), contiguous.
        labels: int64 (N,).
        num_classes: number of classes.
        class_names: one name per class.
    """

    name: str
    images: Tensor
    labels: Tensor
    num_classes: int
    class_names: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def subset(self, indices: Tensor) -> ImageDataset:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return ImageDataset(self.name, self.images[idx].contiguous(), self.labels[idx],
                            self.num_classes, self.class_names)


def search_dirs(data_dir: str | Path | None) -> list[Path]:
    """Where data is looked for: data_dir, $DCCO_DATA, ~/.cache/dcco (in that order)."""
    dirs = []
    if data_dir is not None:
        dirs.append(Path(data_dir).expanduser())
    if os.environ.get("DCCO_DATA"):
        dirs.append(Path(os.environ["DCCO_DATA"]).expanduser())
    dirs.append(Path.home() / ".cache" / "dcco")
    return dirs


def download_dir() -> Path:
    """Where downloads go: $DCCO_DATA when set, else ~/.cache/dcco."""
    env = os.environ.get("DCCO_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dcco"


def load_dataset(name: DatasetName, split: Split, data_dir: str | Path | None = None,
                 download: bool = True) -> ImageDataset:
    """Load one split of a data set, searching the usual places and downloading if possible.

    Args:
        name: ``"fashion_mnist"``, ``"cifar10"`` or ``"cifar100"``.
        split: ``"train"`` or ``"test"``.
        data_dir: searched first; see ``search_dirs``.
        download: try the official download when the files are nowhere to be found.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if name == "fashion_mnist":
        return _load_fashion_mnist(split, data_dir, download)
    if name in CIFAR:
        return _load_cifar(name, split, data_dir, download)
    raise ValueError(f"unknown data set {name!r}; choose fashion_mnist, cifar10 or cifar100")


# ---------------------------------------------------------------- Fashion-MNIST (IDX format)


def _find_idx(directory: Path, stem: str) -> Path | None:
    for folder in (directory, directory / "fashion-mnist"):
        for candidate in (folder / f"{stem}.gz", folder / stem):
            if candidate.is_file():
                return candidate
    return None


def _load_fashion_mnist(split: Split, data_dir: str | Path | None,
                        download: bool) -> ImageDataset:
    img_stem, lbl_stem = FASHION_MNIST_FILES[split]
    dirs = search_dirs(data_dir) + [DEBIAN_FASHION_MNIST]
    for d in dirs:
        img, lbl = _find_idx(d, img_stem), _find_idx(d, lbl_stem)
        if img and lbl:
            break
    else:
        if not download or not _download_fashion_mnist():
            searched = ", ".join(str(d) for d in dirs)
            raise DataError(
                f"Fashion-MNIST files {img_stem}.gz and {lbl_stem}.gz not found in: {searched}. "
                f"Install them with `apt-get install dataset-fashion-mnist` (Debian), or download "
                f"them from {FASHION_MNIST_URL} into one of those folders or into --data-dir"
            )
        img = _find_idx(download_dir(), img_stem)
        lbl = _find_idx(download_dir(), lbl_stem)
    images = read_idx(img, expected_ndim=3)
    labels = read_idx(lbl, expected_ndim=1)
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{img} holds {images.shape[0]} images but {lbl} holds "
                        f"{labels.shape[0]} labels")
    return _dataset("fashion_mnist", images[:, None], labels, 10, FASHION_MNIST_CLASSES, lbl)


def read_idx(path: Path, expected_ndim: int) -> np.ndarray:
    """An IDX file (LeCun's MNIST format, gzipped or not) of unsigned bytes as a numpy array."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                raw = fh.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"cannot read {path}: {e}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path} is not an IDX file of unsigned bytes (bad magic number)")
    ndim = raw[3]
    if ndim != expected_ndim:
        raise DataError(f"{path} has {ndim} dimensions, expected {expected_ndim}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is truncated (incomplete header)")
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    size = int(np.prod(shape))
    if len(raw) - header != size:
        raise DataError(f"{path} is truncated or padded: header says {shape} = {size} bytes, "
                        f"payload has {len(raw) - header}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _download_fashion_mnist() -> bool:
    target = download_dir() / "fashion-mnist"
    try:
        for name, md5 in FASHION_MNIST_MD5.items():
            _download(FASHION_MNIST_URL + name, target / name, md5)
    except (OSError, DataError):
        return False
    return True


def _download(url: str, path: Path, md5: str) -> None:
    """Fetch ``url`` to ``path`` atomically, checking its md5."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as r:
            shutil.copyfileobj(r, out)
        digest = hashlib.md5(Path(tmp).read_bytes()).hexdigest()
        if digest != md5:
            raise DataError(f"download of {url} has md5 {digest}, expected {md5}")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


# ---------------------------------------------------------------- CIFAR (python pickle format)


def _load_cifar(name: str, split: Split, data_dir: str | Path | None,
                download: bool) -> ImageDataset:
    spec = CIFAR[name]
    dirs = search_dirs(data_dir)
    folder = _find_cifar_folder(spec, dirs)
    if folder is None and download:
        try:
            archive = download_dir() / spec["archive"]
            _download(CIFAR_URL + spec["archive"], archive, spec["md5"])
            folder = _find_cifar_folder(spec, [download_dir()])
        except (OSError, DataError):
            folder = None
    if folder is None:
        searched = ", ".join(str(d) for d in dirs)
        raise DataError(
            f"{name}: folder {spec['folder']} (or archive {spec['archive']}) not found in: "
            f"{searched}. Download {CIFAR_URL}{spec['archive']} and extract it into one of "
            f"those folders or into --data-dir"
        )
    chunks_x, chunks_y = [], []
    for file in spec[split]:
        batch = _unpickle(folder / file)
        data, labels = _field(batch, b"data", folder / file), _field(batch, spec["label_key"],
                                                                     folder / file)
        data = np.asarray(data)
        labels = np.asarray(labels)
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise DataError(f"{folder / file}: 'data' must be uint8 of shape (N, 3072), got "
                            f"{data.dtype} {data.shape}")
        if labels.shape != (data.shape[0],):
            raise DataError(f"{folder / file} holds {data.shape[0]} images but "
                            f"{labels.size} labels")
        chunks_x.append(data.reshape(-1, 3, 32, 32))
        chunks_y.append(labels)
    meta_path = folder / spec["meta"]
    classes = tuple(f"class_{i}" for i in range(spec["classes"]))
    if meta_path.is_file():
        names = _field(_unpickle(meta_path), spec["names_key"], meta_path)
        classes = tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)
    return _dataset(name, np.concatenate(chunks_x), np.concatenate(chunks_y), spec["classes"],
                    classes, folder / spec[split][0])


def _find_cifar_folder(spec: dict, dirs: list[Path]) -> Path | None:
    for d in dirs:
        if (d / spec["folder"]).is_dir():
            return d / spec["folder"]
        archive = d / spec["archive"]
        if archive.is_file():
            try:
                with tarfile.open(archive) as tar:
                    tar.extractall(d, filter="data")
            except (tarfile.TarError, OSError) as e:
                raise DataError(f"cannot extract {archive}: {e}") from None
            if (d / spec["folder"]).is_dir():
                return d / spec["folder"]
    return None


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            obj = pickle.load(fh, encoding="bytes")
    except FileNotFoundError:
        raise DataError(f"{path} is missing") from None
    except Exception as e:  # noqa: BLE001 (unpickling garbage raises almost any type)
        raise DataError(f"{path} is not a readable CIFAR pickle: {type(e).__name__}: {e}") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path} does not hold a CIFAR batch dictionary")
    return obj


def _field(batch: dict, key: bytes, path: Path):
    if key in batch:
        return batch[key]
    if key.decode() in batch:
        return batch[key.decode()]
    raise DataError(f"{path} lacks the key {key.decode()!r}")


def _dataset(name: str, images: np.ndarray, labels: np.ndarray, num_classes: int,
             class_names: tuple[str, ...], path: Path) -> ImageDataset:
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"{path}: labels must lie in [0, {num_classes}), found "
                        f"{labels.min()}..{labels.max()}")
    return ImageDataset(name, torch.from_numpy(np.array(images, dtype=np.uint8, order="C")),
                        torch.from_numpy(labels), num_classes, class_names)
