"""Image data sets as uint8 tensors: Fashion-MNIST (IDX) and CIFAR-10/100 (python pickle).

Only this layer touches data files. Images stay uint8 (N, C, H, W) so a whole data set sits on
the device and a round gathers its samples by index. Every problem with a file raises
``DataError`` naming the file.

An explicit ``data_dir`` is the only place looked in: it must exist, and files missing from
it are downloaded into it (or the error says how to get them), never taken from elsewhere.
Without one, files are looked for, in order, in ``$DCCO_DATA``, ``~/.cache/dcco`` and, for
Fashion-MNIST only, ``/usr/share/datasets/fashion-mnist`` (Debian package
``dataset-fashion-mnist``). When they are nowhere, the official download is tried into
``$DCCO_DATA`` (or ``~/.cache/dcco``), with a short timeout so an offline machine fails fast.

A split, once decoded, is kept as a verified memory-mappable cache next to its files
(``dcco.data.cache``; ``DCCO_DATA_CACHE=0`` turns it off).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import pickle
import tarfile
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from dcco.data.cache import cached_arrays
from dcco.errors import UserError, shown
from dcco.files import atomic_writer, umask_mode

DatasetName = Literal["fashion_mnist", "cifar10", "cifar100"]
Split = Literal["train", "test"]

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FASHION_MNIST_FILES = MappingProxyType({
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
})
FASHION_MNIST_MD5 = MappingProxyType({  # from the Fashion-MNIST README
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
})
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot")
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/"
DOWNLOAD_TIMEOUT_S = 10.0


class DataError(UserError):
    """A data file is missing, corrupt or inconsistent; the message names the file."""


@dataclass(frozen=True)
class CifarSpec:
    """Where and how one CIFAR variant is stored (python pickle version)."""

    title: str
    folder: str
    archive: str
    md5: str
    label_key: bytes
    train: tuple[str, ...]
    test: tuple[str, ...]
    meta: str
    names_key: bytes
    num_classes: int


CIFAR = MappingProxyType({
    "cifar10": CifarSpec("CIFAR-10", "cifar-10-batches-py", "cifar-10-python.tar.gz",
                         "c58f30108f718f92721af3b95e74349a", b"labels",
                         tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",),
                         "batches.meta", b"label_names", 10),
    "cifar100": CifarSpec("CIFAR-100", "cifar-100-python", "cifar-100-python.tar.gz",
                          "eb9058c3a382ffc7106e4002c42a8d85", b"fine_labels", ("train",),
                          ("test",), "meta", b"fine_label_names", 100),
})


@dataclass(frozen=True, eq=False)
class ImageDataset:
    """Images and labels of one split.

    Equality is identity (the fields are tensors).

    Attributes:
        name: the data set, e.g. ``"fashion_mnist"``.
        images: uint8 (N, C, H, W), contiguous (made so if given otherwise).
        labels: int64 (N,), in [0, num_classes).
        num_classes: number of classes.
        class_names: one name per class.
        clients: int64 (N,), each image's client (a patient, a lesion, a writer) as an index
            into ``client_names``, for data that comes in natural clients (client tables, TFF
            files); None for data that has none.
        client_names: the name of each client index (one split holds a subset of them).
    """

    name: str
    images: Tensor
    labels: Tensor
    num_classes: int
    class_names: tuple[str, ...]
    clients: Tensor | None = None
    client_names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.ndim != 4:
            raise ValueError(f"ImageDataset.images must be uint8 (N, C, H, W), got "
                             f"{self.images.dtype} {tuple(self.images.shape)}")
        if self.labels.dtype != torch.int64 or self.labels.shape != self.images.shape[:1]:
            raise ValueError(f"ImageDataset.labels must be int64 ({self.images.shape[0]},), got "
                             f"{self.labels.dtype} {tuple(self.labels.shape)}")
        if len(self.class_names) != self.num_classes:
            raise ValueError(f"ImageDataset.class_names has {len(self.class_names)} names for "
                             f"num_classes = {self.num_classes}")
        if (self.clients is None) != (self.client_names is None):
            raise ValueError("ImageDataset.clients and client_names go together")
        if self.clients is not None:
            if self.clients.dtype != torch.int64 or self.clients.shape != self.labels.shape:
                raise ValueError(f"ImageDataset.clients must be int64 ({len(self.labels)},), "
                                 f"got {self.clients.dtype} {tuple(self.clients.shape)}")
            if self.clients.numel() and not (0 <= int(self.clients.min()) and int(
                    self.clients.max()) < len(self.client_names)):
                raise ValueError("ImageDataset.clients must index client_names")
        if not self.images.is_contiguous():
            object.__setattr__(self, "images", self.images.contiguous())

    paired = False
    """Whether the samples are pairs of two modalities (``dcco.data.paired.PairedDataset``)."""

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def inputs(self, tower: int = 0) -> Tensor:
        """The images, for either tower (both views of a sample come from its image)."""
        if tower not in (0, 1):
            raise ValueError(f"tower must be 0 or 1, got {tower!r}")
        return self.images

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shape of one image, for each of the two views."""
        shape = tuple(self.images.shape[1:])
        return shape, shape

    def subset(self, indices: Tensor | np.ndarray | list[int]) -> ImageDataset:
        """The samples ``indices`` (int (M,), in that order) as a new data set."""
        idx = torch.as_tensor(indices, dtype=torch.int64, device=self.images.device)
        clients = None if self.clients is None else self.clients[idx.to(self.clients.device)]
        return ImageDataset(self.name, self.images[idx].contiguous(),
                            self.labels[idx.to(self.labels.device)], self.num_classes,
                            self.class_names, clients, self.client_names)


def search_dirs(data_dir: str | Path | None) -> list[Path]:
    """Where data is looked for, in order: an explicit ``data_dir`` alone (it must exist), or
    else ``$DCCO_DATA`` and ``~/.cache/dcco``.

    Raises:
        DataError: ``data_dir`` is given but is not a folder.
    """
    if data_dir is not None:
        folder = Path(data_dir).expanduser()
        if not folder.is_dir():
            what = "is not a folder" if folder.exists() else "does not exist"
            raise DataError(f"the data directory {shown(data_dir)} (data.data_dir or --data-dir) "
                            f"{what}; "
                            f"give the folder that holds the data set's files, or leave it out "
                            f"to search $DCCO_DATA, ~/.cache/dcco and the system copy")
        return [folder]
    dirs = []
    if os.environ.get("DCCO_DATA"):
        dirs.append(Path(os.environ["DCCO_DATA"]).expanduser())
    dirs.append(Path.home() / ".cache" / "dcco")
    return list(dict.fromkeys(dirs))  # without repeats, order kept


def download_dir(data_dir: str | Path | None = None) -> Path:
    """Where downloads go: an explicit ``data_dir``, else ``$DCCO_DATA`` when set, else
    ``~/.cache/dcco``."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get("DCCO_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dcco"


def load_dataset(name: DatasetName, split: Split, data_dir: str | Path | None = None,
                 download: bool = True) -> ImageDataset:
    """Load one split of a data set, searching the usual places and downloading if possible.

    Args:
        name: ``"fashion_mnist"`` (1×28×28), ``"cifar10"`` or ``"cifar100"`` (3×32×32).
        split: ``"train"`` or ``"test"``.
        data_dir: the folder of the files, and the only one searched (it must exist); None
            searches ``$DCCO_DATA``, ``~/.cache/dcco`` and, for Fashion-MNIST,
            ``/usr/share/datasets/fashion-mnist``.
        download: try the official download when the files are nowhere to be found.

    Raises:
        DataError: files missing (the message says how to get them) or corrupt (it names the
            file).
        ValueError: unknown ``name`` or ``split``.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if name == "fashion_mnist":
        return _load_fashion_mnist(split, data_dir, download)
    if name in CIFAR:
        return _load_cifar(CIFAR[name], name, split, data_dir, download)
    raise ValueError(f"unknown data set {name!r}; choose fashion_mnist, cifar10 or cifar100")


# ---------------------------------------------------------------- Fashion-MNIST (IDX format)


def _load_fashion_mnist(split: Split, data_dir: str | Path | None,
                        download: bool) -> ImageDataset:
    dirs = search_dirs(data_dir) + ([DEBIAN_FASHION_MNIST] if data_dir is None else [])
    found = _find_fashion_mnist(dirs, split)
    if found is None:
        failure = "download=False, so no download was tried"
        if download:
            try:
                _download_fashion_mnist(split, download_dir(data_dir))
                found = _find_fashion_mnist([download_dir(data_dir)], split)
            except (OSError, http.client.HTTPException, DataError) as e:
                failure = f"the download from {FASHION_MNIST_URL} failed: {e}"
    if found is None:
        img_stem, lbl_stem = FASHION_MNIST_FILES[split]
        raise DataError(
            f"Fashion-MNIST {split} files {img_stem}.gz and {lbl_stem}.gz (or uncompressed, "
            f"directly or in a fashion-mnist/ subfolder) not found in: "
            f"{', '.join(map(shown, dirs))} ({failure}). To get them: `apt-get install "
            f"dataset-fashion-mnist` (Debian/Ubuntu; installs into {DEBIAN_FASHION_MNIST}), or "
            f"download the four .gz files from {FASHION_MNIST_URL} into one of those folders "
            f"(e.g. $DCCO_DATA or data_dir)")
    img_path, lbl_path = found

    def decode() -> tuple[np.ndarray, np.ndarray]:
        images = read_idx(img_path, expected_ndim=3)
        labels = read_idx(lbl_path, expected_ndim=1)
        if images.shape[0] != labels.shape[0]:
            raise DataError(f"{img_path} holds {images.shape[0]} images but {lbl_path} holds "
                            f"{labels.shape[0]} labels")
        return images[:, None], _checked_labels(labels, len(FASHION_MNIST_CLASSES), lbl_path)

    images, labels = cached_arrays(f"fashion_mnist-{split}", [img_path, lbl_path],
                                   _cache_folders(img_path.parent, data_dir), decode)
    return ImageDataset("fashion_mnist", torch.from_numpy(np.array(images)),
                        torch.from_numpy(np.array(labels)), len(FASHION_MNIST_CLASSES),
                        FASHION_MNIST_CLASSES)


def _cache_folders(source: Path, data_dir: str | Path | None) -> list[Path]:
    """Where a split's decoded cache may go (``dcco.data.cache``): next to its files, unless
    they are the system's (the Debian package's folder), then the download folder."""
    own = [] if source.resolve().is_relative_to(DEBIAN_FASHION_MNIST.resolve()) else [source]
    return [*own, download_dir(data_dir)]


def _find_fashion_mnist(dirs: list[Path], split: Split) -> tuple[Path, Path] | None:
    """The (images, labels) files of ``split`` in the first folder of ``dirs`` holding both."""
    for directory in dirs:
        for folder in (directory, directory / "fashion-mnist"):
            pair = [next((p for p in (folder / f"{stem}.gz", folder / stem) if p.is_file()), None)
                    for stem in FASHION_MNIST_FILES[split]]
            if pair[0] is not None and pair[1] is not None:
                return pair[0], pair[1]
    return None


def read_idx(path: Path, expected_ndim: int) -> np.ndarray:
    """An IDX file of unsigned bytes (the MNIST format; gzipped if the name ends in .gz).

    Args:
        path: the file.
        expected_ndim: its number of dimensions (3 for images, 1 for labels).

    Returns:
        uint8 array of the shape in the header, read-only (a view of the file's bytes).

    Raises:
        DataError: unreadable or bad gzip, bad magic number, wrong number of dimensions, or a
            payload that does not match the header.
    """
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"cannot read {path}: {type(e).__name__}: {e}") from None
    if len(raw) < 4 or raw[:3] != b"\x00\x00\x08":
        raise DataError(f"{path} is not an IDX file of unsigned bytes (bad magic number "
                        f"{raw[:4].hex() or 'none'}, expected 000008..)")
    if raw[3] != expected_ndim:
        raise DataError(f"{path} has {raw[3]} dimensions, expected {expected_ndim}")
    header = 4 + 4 * expected_ndim
    if len(raw) < header:
        raise DataError(f"{path} is truncated: {len(raw)} bytes, the header alone needs {header}")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=expected_ndim, offset=4))
    size = int(np.prod(shape))
    if len(raw) - header != size:
        raise DataError(f"{path} is truncated or padded: the header says {shape} = {size} bytes, "
                        f"the payload has {len(raw) - header}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _download_fashion_mnist(split: Split, into: Path) -> None:
    target = into / "fashion-mnist"
    for stem in FASHION_MNIST_FILES[split]:
        name = f"{stem}.gz"
        if not (target / name).is_file():
            _download(FASHION_MNIST_URL + name, target / name, FASHION_MNIST_MD5[name])


def _download(url: str, path: Path, md5: str) -> None:
    """Fetch ``url`` to ``path`` atomically (temporary file, then ``os.replace``), checking md5.

    Raises:
        OSError, http.client.HTTPException: the download failed.
        DataError: the file arrived with the wrong md5.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.md5(usedforsecurity=False)
    with atomic_writer(path) as out, \
            urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
        if digest.hexdigest() != md5:  # in the block: the file is then not replaced
            raise DataError(f"{url} arrived with md5 {digest.hexdigest()}, expected {md5}")


# ---------------------------------------------------------------- CIFAR (python pickle format)


def _load_cifar(spec: CifarSpec, name: str, split: Split, data_dir: str | Path | None,
                download: bool) -> ImageDataset:
    dirs = search_dirs(data_dir)
    folder = _find_cifar(spec, dirs)
    failure = "download=False, so no download was tried"
    if folder is None and download:
        try:
            _download(CIFAR_URL + spec.archive, download_dir(data_dir) / spec.archive, spec.md5)
            folder = _find_cifar(spec, [download_dir(data_dir)])
        except (OSError, http.client.HTTPException, DataError) as e:
            failure = f"the download from {CIFAR_URL}{spec.archive} failed: {e}"
    if folder is None:
        raise DataError(
            f"{spec.title}: folder {spec.folder} (or archive {spec.archive}) not found in: "
            f"{', '.join(map(str, dirs))} ({failure}). To get it: download "
            f"{CIFAR_URL}{spec.archive} and put the archive, or the {spec.folder} folder "
            f"extracted from it, into one of those folders (e.g. $DCCO_DATA or data_dir)")
    files = [folder / file for file in getattr(spec, split)]

    def decode() -> tuple[np.ndarray, np.ndarray]:
        parts = [_read_cifar_batch(file, spec) for file in files]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    images, labels = cached_arrays(f"{name}-{split}", files,
                                   _cache_folders(folder, data_dir), decode)
    return ImageDataset(name, torch.from_numpy(np.array(images)),
                        torch.from_numpy(np.array(labels)), spec.num_classes,
                        _cifar_class_names(folder / spec.meta, spec))


def _find_cifar(spec: CifarSpec, dirs: list[Path]) -> Path | None:
    """The first ``spec.folder`` in ``dirs``; an archive found first is extracted."""
    for d in dirs:
        if (d / spec.folder).is_dir():
            return d / spec.folder
        if (d / spec.archive).is_file():
            return _extract(d / spec.archive, spec.folder)
    return None


def _extract(archive: Path, folder: str) -> Path:
    """Extract ``folder`` from ``archive`` next to it (or, if that folder is read-only, into
    ``download_dir()``), atomically: a crash never leaves a half-extracted folder behind."""
    errors = []
    for target in dict.fromkeys((archive.parent, download_dir())):
        if (target / folder).is_dir():
            return target / folder
        try:
            target.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target, prefix=f".{folder}.") as tmp:
                _safe_extract_all(archive, Path(tmp))
                if not (Path(tmp) / folder).is_dir():
                    raise DataError(f"{archive} does not contain the folder {folder}")
                os.chmod(Path(tmp) / folder, umask_mode(0o777))
                os.replace(Path(tmp) / folder, target / folder)
            return target / folder
        except (tarfile.TarError, EOFError, zlib.error) as e:
            raise DataError(f"cannot extract {archive}: {type(e).__name__}: {e}") from None
        except OSError as e:
            errors.append(f"into {target}: {e}")
    raise DataError(f"cannot extract {archive}: {'; '.join(errors)}")


def _safe_extract_all(archive: Path, target: Path) -> None:
    """Extract regular files and folders only, none outside ``target``."""
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 / 3.10.12
            tar.extractall(target, filter="data")
            return
        for member in tar.getmembers():
            if not (member.isfile() or member.isdir()) or member.name.startswith(("/", "\\")) \
                    or ".." in Path(member.name).parts:
                raise DataError(f"{archive} holds an unsafe member {member.name!r}")
        tar.extractall(target)  # members checked above


def _read_cifar_batch(path: Path, spec: CifarSpec) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 (n, 3, 32, 32) and labels int64 (n,) of one CIFAR batch file.

    A row of ``data`` is 3072 bytes: the 32×32 red plane row-major, then green, then blue.
    """
    batch = _unpickle(path)
    data = np.asarray(_field(batch, b"data", path))
    labels = np.asarray(_field(batch, spec.label_key, path))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{path}: 'data' must be uint8 of shape (n, 3072), got {data.dtype} "
                        f"{data.shape}")
    if labels.ndim != 1 or labels.shape[0] != data.shape[0]:
        raise DataError(f"{path} holds {data.shape[0]} images but {labels.size} labels "
                        f"({spec.label_key.decode()!r} of shape {labels.shape})")
    labels = _checked_labels(labels, spec.num_classes, path)
    return np.ascontiguousarray(data.reshape(-1, 3, 32, 32)), labels


def _cifar_class_names(path: Path, spec: CifarSpec) -> tuple[str, ...]:
    """Class names from the meta file; generic names if it is absent."""
    if not path.is_file():
        return tuple(f"class_{i}" for i in range(spec.num_classes))
    names = _field(_unpickle(path), spec.names_key, path)
    if not isinstance(names, (list, tuple)) or len(names) != spec.num_classes:
        raise DataError(f"{path}: {spec.names_key.decode()!r} must list {spec.num_classes} "
                        f"class names, got {type(names).__name__} of length "
                        f"{len(names) if hasattr(names, '__len__') else '?'}")
    return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            obj = pickle.load(fh, encoding="bytes")
    except FileNotFoundError:
        raise DataError(f"{path} is missing") from None
    except Exception as e:  # noqa: BLE001 (unpickling garbage raises almost any type)
        raise DataError(f"{path} is not a readable CIFAR pickle: {type(e).__name__}: {e}") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path} holds a {type(obj).__name__}, not a CIFAR batch dictionary")
    return obj


def _field(batch: dict, key: bytes, path: Path) -> Any:
    """``batch[key]``; pickles written by Python 3 may have str keys instead of bytes."""
    for k in (key, key.decode()):
        if k in batch:
            return batch[k]
    raise DataError(f"{path} lacks the key {key.decode()!r}")


def _checked_labels(labels: np.ndarray, num_classes: int, path: Path) -> np.ndarray:
    """Labels as int64, each in [0, num_classes)."""
    if labels.size and labels.dtype.kind not in "iu":
        raise DataError(f"{path}: labels must be integers, got dtype {labels.dtype}")
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        bad = labels[(labels < 0) | (labels >= num_classes)]
        raise DataError(f"{path}: labels must lie in [0, {num_classes}), found {bad.size} outside "
                        f"(e.g. {int(bad[0])})")
    return labels
