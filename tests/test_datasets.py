"""Loaders read tiny files in the real formats and reject corrupt ones naming the file."""

from __future__ import annotations

import gzip
import pickle
import tarfile

import numpy as np
import pytest
from conftest import make_fashion_mnist, write_idx

from dcco.data.datasets import DEBIAN_FASHION_MNIST, DataError, load_dataset


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DCCO_DATA", raising=False)


def test_load_dataset__reads_idx_gz_round_trip(tmp_path):
    folder = make_fashion_mnist(tmp_path / "fm", n_train=30, n_test=10, size=28)
    ds = load_dataset("fashion_mnist", "train", folder, download=False)
    assert ds.images.shape == (30, 1, 28, 28) and ds.images.dtype.is_floating_point is False
    assert ds.labels.shape == (30,) and ds.num_classes == 10 and len(ds) == 30
    with gzip.open(folder / "train-images-idx3-ubyte.gz") as fh:
        raw = np.frombuffer(fh.read()[16:], np.uint8).reshape(30, 28, 28)
    assert np.array_equal(ds.images[:, 0].numpy(), raw)
    assert len(load_dataset("fashion_mnist", "test", folder, download=False)) == 10


def test_load_dataset__search_order_and_subfolder(tmp_path, monkeypatch):
    env = make_fashion_mnist(tmp_path / "env" / "fashion-mnist", n_train=20, n_test=5)
    monkeypatch.setenv("DCCO_DATA", str(env.parent))
    assert len(load_dataset("fashion_mnist", "train", download=False)) == 20  # subfolder
    first = make_fashion_mnist(tmp_path / "explicit", n_train=12, n_test=5)
    assert len(load_dataset("fashion_mnist", "train", first, download=False)) == 12  # wins


def test_load_dataset__missing_files_say_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setattr("dcco.data.datasets.DEBIAN_FASHION_MNIST", tmp_path / "nowhere")
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion_mnist", "train", tmp_path / "empty", download=False)
    with pytest.raises(DataError, match="cifar-100-python"):
        load_dataset("cifar100", "train", tmp_path / "empty", download=False)


@pytest.mark.parametrize(
    ("corrupt", "needle"),
    [
        (lambda p: p.write_bytes(b"not gzip at all"), "cannot read"),
        (lambda p: write_idx(p, np.zeros((5, 28), np.uint8)), "dimensions"),
        (lambda p: p.write_bytes(gzip.compress(b"\x00\x00\x09\x03" + b"\x00" * 12)), "magic"),
        (lambda p: p.write_bytes(gzip.compress(gzip.decompress(p.read_bytes())[:-7])),
         "truncated"),
    ],
)
def test_load_dataset__corrupt_idx_names_the_file(tmp_path, corrupt, needle):
    folder = make_fashion_mnist(tmp_path / "fm", n_train=10, n_test=5)
    bad = folder / "train-images-idx3-ubyte.gz"
    corrupt(bad)
    with pytest.raises(DataError, match=needle) as err:
        load_dataset("fashion_mnist", "train", folder, download=False)
    assert str(bad) in str(err.value)


def test_load_dataset__count_mismatch_and_label_range(tmp_path):
    folder = make_fashion_mnist(tmp_path / "fm", n_train=10, n_test=5)
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.zeros(9, np.uint8))
    with pytest.raises(DataError, match="9 labels"):
        load_dataset("fashion_mnist", "train", folder, download=False)
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.full(10, 12, np.uint8))
    with pytest.raises(DataError, match="labels must lie in"):
        load_dataset("fashion_mnist", "train", folder, download=False)


def _cifar_batch(n, rng, label_key):
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    return {b"data": data, label_key: list(rng.integers(0, 10, size=n))}


def _write_pickle(path, obj):
    with open(path, "wb") as fh:
        pickle.dump(obj, fh)


def test_load_dataset__cifar10_pickle_folder_layout(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batches = [_cifar_batch(3, rng, b"labels") for _ in range(6)]
    for i in range(5):
        _write_pickle(folder / f"data_batch_{i + 1}", batches[i])
    _write_pickle(folder / "test_batch", batches[5])
    _write_pickle(folder / "batches.meta", {b"label_names": [f"c{i}".encode() for i in range(10)]})
    train = load_dataset("cifar10", "train", tmp_path, download=False)
    assert train.images.shape == (15, 3, 32, 32) and train.class_names[3] == "c3"
    first = batches[0][b"data"][0]
    assert np.array_equal(train.images[0, 0].numpy().ravel(), first[:1024])  # red plane
    assert np.array_equal(train.images[0, 2].numpy().ravel(), first[2048:])  # blue plane
    assert train.labels[:3].tolist() == [int(x) for x in batches[0][b"labels"]]
    assert len(load_dataset("cifar10", "test", tmp_path, download=False)) == 3


def test_load_dataset__cifar100_from_archive(tmp_path):
    rng = np.random.default_rng(1)
    src = tmp_path / "src" / "cifar-100-python"
    src.mkdir(parents=True)
    for split, n in (("train", 4), ("test", 2)):
        batch = _cifar_batch(n, rng, b"fine_labels")
        batch[b"fine_labels"] = [99, 0, 5, 42][:n]
        _write_pickle(src / split, batch)
    data = tmp_path / "data"
    data.mkdir()
    with tarfile.open(data / "cifar-100-python.tar.gz", "w:gz") as tar:
        tar.add(src, arcname="cifar-100-python")
    ds = load_dataset("cifar100", "train", data, download=False)
    assert ds.num_classes == 100 and ds.labels.tolist() == [99, 0, 5, 42]


@pytest.mark.parametrize(
    ("content", "needle"),
    [(b"garbage", "not a readable CIFAR pickle"), ({b"data": np.zeros((2, 3072), np.uint8)},
                                                   "lacks the key"),
     ({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, "shape")],
)
def test_load_dataset__corrupt_cifar_names_the_file(tmp_path, content, needle):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    path = folder / "test_batch"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        _write_pickle(path, content)
    with pytest.raises(DataError, match=needle) as err:
        load_dataset("cifar10", "test", tmp_path, download=False)
    assert str(path) in str(err.value)


def test_load_dataset__real_fashion_mnist_from_debian_package():
    """CI installs dataset-fashion-mnist; this must not be skipped if it is missing."""
    assert (DEBIAN_FASHION_MNIST / "train-images-idx3-ubyte.gz").is_file(), \
        "install the Debian package dataset-fashion-mnist (.ci/run does)"
    ds = load_dataset("fashion_mnist", "train", download=False)
    assert ds.images.shape == (60000, 1, 28, 28) and ds.num_classes == 10
    assert ds.labels.bincount().tolist() == [6000] * 10
