"""Loaders read tiny files in the real formats and reject corrupt ones naming the file."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_fashion_mnist, write_idx
from helpers.counting import LINES_WITHOUT_A_SAMPLE_LOOP, python_lines

from dcco.data import datasets
from dcco.data.datasets import DEBIAN_FASHION_MNIST, DataError, ImageDataset, load_dataset


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """No real home cache, no $DCCO_DATA, no Debian folder and never the network."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DCCO_DATA", raising=False)
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian")

    def offline(url, timeout=None):
        ATTEMPTS.append((url, timeout))
        raise urllib.error.URLError(f"offline test: {url}")

    ATTEMPTS.clear()
    monkeypatch.setattr(urllib.request, "urlopen", offline)


ATTEMPTS: list[tuple[str, float | None]] = []
"""Every download the current test attempted: (url, its timeout)."""


def _gunzip_idx(path: Path, header: int) -> np.ndarray:
    with gzip.open(path) as fh:
        return np.frombuffer(fh.read()[header:], np.uint8)


def test_load_dataset__reads_idx_gz_round_trip(tmp_path):
    folder = make_fashion_mnist(tmp_path / "fm", n_train=30, n_test=10, size=28)
    ds = load_dataset("fashion_mnist", "train", folder, download=False)
    assert ds.images.shape == (30, 1, 28, 28) and ds.images.dtype == torch.uint8
    assert ds.images.is_contiguous() and ds.labels.dtype == torch.int64
    assert ds.num_classes == 10 and len(ds) == 30 and ds.class_names[9] == "Ankle boot"
    raw = _gunzip_idx(folder / "train-images-idx3-ubyte.gz", 16).reshape(30, 28, 28)
    assert np.array_equal(ds.images[:, 0].numpy(), raw)
    raw_labels = _gunzip_idx(folder / "train-labels-idx1-ubyte.gz", 8)
    assert ds.labels.tolist() == raw_labels.tolist()
    test = load_dataset("fashion_mnist", "test", folder, download=False)
    assert len(test) == 10 and test.images.shape[1:] == (1, 28, 28)


def test_load_dataset__reads_uncompressed_idx(tmp_path):
    folder = make_fashion_mnist(tmp_path / "fm", n_train=8, n_test=4)
    for gz in folder.glob("*.gz"):
        gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
        gz.unlink()
    ds = load_dataset("fashion_mnist", "train", folder, download=False)
    assert ds.images.shape == (8, 1, 12, 12)


def test_load_dataset__debian_package_layout(tmp_path, monkeypatch):
    debian = make_fashion_mnist(tmp_path / "usr-share" / "fashion-mnist", n_train=14, n_test=6)
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", debian)
    assert len(load_dataset("fashion_mnist", "train", download=False)) == 14
    assert len(load_dataset("fashion_mnist", "test", download=False)) == 6


def test_load_dataset__explicit_data_dir_is_used_or_refused_never_bypassed(tmp_path,
                                                                          monkeypatch):
    """A data directory given by the user is the only place looked in: one that does not
    exist, or lacks the files, is an error naming it, even with the files elsewhere."""
    debian = make_fashion_mnist(tmp_path / "debian", n_train=13, n_test=2)
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", debian)
    monkeypatch.setenv("DCCO_DATA", str(debian))
    with pytest.raises(DataError, match="does not exist") as err:
        load_dataset("fashion_mnist", "train", tmp_path / "typo", download=False)
    assert str(tmp_path / "typo") in str(err.value)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(DataError, match="is not a folder"):
        load_dataset("fashion_mnist", "train", tmp_path / "a-file", download=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="not found in") as err:
        load_dataset("fashion_mnist", "train", tmp_path / "empty", download=False)
    searched = str(err.value).split("not found in: ")[1].split(" (")[0]
    assert searched == str(tmp_path / "empty")  # the given folder only
    with pytest.raises(DataError, match="not found in"):
        load_dataset("cifar10", "train", tmp_path / "empty", download=False)


def test_load_dataset__search_order_data_dir_then_env_then_home_then_debian(tmp_path,
                                                                            monkeypatch):
    home_cache = tmp_path / "home" / ".cache" / "dcco"
    make_fashion_mnist(home_cache / "fashion-mnist", n_train=11, n_test=2)  # subfolder
    debian = make_fashion_mnist(tmp_path / "debian", n_train=13, n_test=2)
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", debian)
    assert len(load_dataset("fashion_mnist", "train", download=False)) == 11  # home over Debian
    env = make_fashion_mnist(tmp_path / "env" / "fashion-mnist", n_train=20, n_test=2)
    monkeypatch.setenv("DCCO_DATA", str(env.parent))
    assert len(load_dataset("fashion_mnist", "train", download=False)) == 20  # env over home
    explicit = make_fashion_mnist(tmp_path / "explicit", n_train=12, n_test=2)
    assert len(load_dataset("fashion_mnist", "train", explicit, download=False)) == 12
    assert datasets.search_dirs(explicit) == [explicit]
    assert datasets.search_dirs(None) == [env.parent, home_cache]


def test_load_dataset__missing_files_say_how_to_get_them(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist") as err:
        load_dataset("fashion_mnist", "train", tmp_path / "empty", download=False)
    assert str(tmp_path / "empty") in str(err.value) and "no download" in str(err.value)
    with pytest.raises(DataError, match="cifar-100-python.tar.gz") as err:
        load_dataset("cifar100", "train", tmp_path / "empty", download=False)
    assert "https://www.cs.toronto.edu/~kriz/" in str(err.value)


def test_load_dataset__failed_download_is_reported_fast(tmp_path, monkeypatch):
    """Fast by what it does, not by the clock: one attempt a file, each with the short
    timeout, and no wait between attempts."""
    (tmp_path / "empty").mkdir()

    def no_wait(seconds):
        raise AssertionError(f"a failed download waited {seconds} s")

    monkeypatch.setattr(time, "sleep", no_wait)
    with pytest.raises(DataError, match="download from .* failed: .*offline test") as err:
        load_dataset("fashion_mnist", "test", tmp_path / "empty", download=True)
    assert "apt-get install dataset-fashion-mnist" in str(err.value)
    assert len(ATTEMPTS) == 1 and ATTEMPTS[0][0].endswith("t10k-images-idx3-ubyte.gz")
    with pytest.raises(DataError, match="cifar-10-python.tar.gz failed"):
        load_dataset("cifar10", "test", tmp_path / "empty", download=True)
    assert len(ATTEMPTS) == 2  # no retry of either
    assert all(timeout == datasets.DOWNLOAD_TIMEOUT_S <= 10 for _, timeout in ATTEMPTS)
    assert not [p for p in (tmp_path / "home" / ".cache" / "dcco").rglob("*")
                if p.name.startswith(".")]  # no temporary file left


def _serve(files: dict[str, bytes], monkeypatch) -> list[str]:
    """Make urlopen answer from ``files`` (by the URL's last component); returns the URLs."""
    asked = []

    def fake(url, timeout=None):
        asked.append(url)
        assert timeout is not None and timeout <= 30
        return io.BytesIO(files[url.rsplit("/", 1)[1]])

    monkeypatch.setattr(urllib.request, "urlopen", fake)
    return asked


def test_load_dataset__download_writes_checked_files_into_dcco_data(tmp_path, monkeypatch):
    src = make_fashion_mnist(tmp_path / "src", n_train=9, n_test=3)
    files = {p.name: p.read_bytes() for p in src.glob("*.gz")}
    monkeypatch.setattr(datasets, "FASHION_MNIST_MD5",
                        {k: hashlib.md5(v).hexdigest() for k, v in files.items()})
    asked = _serve(files, monkeypatch)
    monkeypatch.setenv("DCCO_DATA", str(tmp_path / "cache"))
    ds = load_dataset("fashion_mnist", "test", download=True)
    assert len(ds) == 3 and all(u.startswith(datasets.FASHION_MNIST_URL) for u in asked)
    saved = sorted(p.name for p in (tmp_path / "cache" / "fashion-mnist").iterdir())
    assert saved == [".dcco-cache-fashion_mnist-test",  # the decoded cache, beside them
                     "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]


def test_load_dataset__download_with_wrong_md5_leaves_nothing(tmp_path, monkeypatch):
    src = make_fashion_mnist(tmp_path / "src", n_train=9, n_test=3)
    _serve({p.name: p.read_bytes() for p in src.glob("*.gz")}, monkeypatch)
    monkeypatch.setenv("DCCO_DATA", str(tmp_path / "cache"))
    with pytest.raises(DataError, match="md5"):
        load_dataset("fashion_mnist", "train", download=True)  # the official md5s differ
    assert list((tmp_path / "cache").rglob("*")) == [tmp_path / "cache" / "fashion-mnist"]


@pytest.mark.parametrize(
    ("corrupt", "needle"),
    [
        (lambda p: p.write_bytes(b"not gzip at all"), "cannot read"),
        (lambda p: p.write_bytes(p.read_bytes()[:-20]), "cannot read"),  # truncated gzip
        (lambda p: write_idx(p, np.zeros((5, 28), np.uint8)), "dimensions"),
        (lambda p: p.write_bytes(gzip.compress(b"\x00\x00\x09\x03" + b"\x00" * 12)), "magic"),
        (lambda p: p.write_bytes(gzip.compress(b"\x08\x00\x00\x03" + b"\x00" * 12)), "magic"),
        (lambda p: p.write_bytes(gzip.compress(b"\x00\x00\x08\x03\x00\x00")), "truncated"),
        (lambda p: p.write_bytes(gzip.compress(gzip.decompress(p.read_bytes())[:-7])),
         "truncated"),
        (lambda p: p.write_bytes(gzip.compress(gzip.decompress(p.read_bytes()) + b"xx")),
         "padded"),
    ],
)
def test_load_dataset__corrupt_idx_names_the_file(tmp_path, corrupt, needle):
    folder = make_fashion_mnist(tmp_path / "fm", n_train=10, n_test=5)
    bad = folder / "train-images-idx3-ubyte.gz"
    corrupt(bad)
    with pytest.raises(DataError, match=needle) as err:
        load_dataset("fashion_mnist", "train", folder, download=False)
    assert str(bad) in str(err.value)


def test_load_dataset__count_mismatch_and_label_range_name_the_file(tmp_path):
    folder = make_fashion_mnist(tmp_path / "fm", n_train=10, n_test=5)
    labels = folder / "train-labels-idx1-ubyte.gz"
    write_idx(labels, np.zeros(9, np.uint8))
    with pytest.raises(DataError, match="10 images but .* 9 labels") as err:
        load_dataset("fashion_mnist", "train", folder, download=False)
    assert str(labels) in str(err.value)
    write_idx(labels, np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 12], np.uint8))
    with pytest.raises(DataError, match=r"labels must lie in \[0, 10\).*12") as err:
        load_dataset("fashion_mnist", "train", folder, download=False)
    assert str(labels) in str(err.value)


def _cifar_batch(n: int, rng: np.random.Generator, label_key: bytes, classes: int) -> dict:
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    return {b"data": data, label_key: [int(x) for x in rng.integers(0, classes, size=n)]}


def _write_pickle(path: Path, obj: object) -> None:
    with open(path, "wb") as fh:
        pickle.dump(obj, fh)


def _write_cifar10(root: Path, n: int = 3, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = [_cifar_batch(n, rng, b"labels", 10) for _ in range(6)]
    for i in range(5):
        _write_pickle(folder / f"data_batch_{i + 1}", batches[i])
    _write_pickle(folder / "test_batch", batches[5])
    _write_pickle(folder / "batches.meta", {b"label_names": [f"c{i}".encode() for i in range(10)]})
    return batches


def test_load_dataset__cifar10_planes_become_channels(tmp_path):
    batches = _write_cifar10(tmp_path)
    train = load_dataset("cifar10", "train", tmp_path, download=False)
    assert train.images.shape == (15, 3, 32, 32) and train.images.dtype == torch.uint8
    assert train.num_classes == 10 and train.class_names[3] == "c3"
    row = batches[1][b"data"][2]  # the third image of data_batch_2
    image = train.images[5].numpy()
    for channel in range(3):  # R, G, B planes of 1024 bytes, each 32 rows of 32
        assert np.array_equal(image[channel], row[1024 * channel:1024 * (channel + 1)]
                              .reshape(32, 32))
    assert image[1, 2, 5] == row[1024 + 2 * 32 + 5]  # green, row 2, column 5
    assert train.labels.tolist() == [y for b in batches[:5] for y in b[b"labels"]]
    test = load_dataset("cifar10", "test", tmp_path, download=False)
    assert torch.equal(test.images.flatten(1), torch.from_numpy(batches[5][b"data"]))


def test_load_dataset__cifar100_pickle_folder_and_archive(tmp_path):
    rng = np.random.default_rng(1)
    src = tmp_path / "src" / "cifar-100-python"
    src.mkdir(parents=True)
    train = _cifar_batch(4, rng, b"fine_labels", 100)
    train[b"fine_labels"] = [99, 0, 5, 42]
    _write_pickle(src / "train", train)
    _write_pickle(src / "test", _cifar_batch(2, rng, b"fine_labels", 100))
    _write_pickle(src / "meta", {b"fine_label_names": [f"f{i}".encode() for i in range(100)]})
    ds = load_dataset("cifar100", "train", tmp_path / "src", download=False)
    assert ds.num_classes == 100 and ds.labels.tolist() == [99, 0, 5, 42]
    assert ds.class_names[42] == "f42" and ds.images.shape == (4, 3, 32, 32)
    data = tmp_path / "data"
    data.mkdir()
    with tarfile.open(data / "cifar-100-python.tar.gz", "w:gz") as tar:
        tar.add(src, arcname="cifar-100-python")
    from_archive = load_dataset("cifar100", "train", data, download=False)
    assert torch.equal(from_archive.images, ds.images)
    assert (data / "cifar-100-python" / "train").is_file()  # extracted next to the archive
    assert len(load_dataset("cifar100", "test", data, download=False)) == 2


def test_load_dataset__corrupt_archive_names_the_file(tmp_path):
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(DataError, match="cannot extract") as err:
        load_dataset("cifar10", "train", tmp_path, download=False)
    assert str(tmp_path / "cifar-10-python.tar.gz") in str(err.value)
    assert not (tmp_path / "cifar-10-batches-py").exists()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"garbage", "not a readable CIFAR pickle"),
        (b"", "not a readable CIFAR pickle"),
        ([1, 2, 3], "not a CIFAR batch dictionary"),
        ({b"data": np.zeros((2, 3072), np.uint8)}, "lacks the key 'labels'"),
        ({b"labels": [0, 1]}, "lacks the key 'data'"),
        ({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, r"shape \(n, 3072\)"),
        ({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}, "must be uint8"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1, 2]}, "2 images but 3"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, "must lie in"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, -1]}, "must lie in"),
    ],
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


def test_load_dataset__cifar_errors_name_the_batch_at_fault(tmp_path):
    _write_cifar10(tmp_path)
    bad = tmp_path / "cifar-10-batches-py" / "data_batch_4"
    _write_pickle(bad, {b"data": np.zeros((1, 3072), np.uint8), b"labels": [11]})
    with pytest.raises(DataError, match="data_batch_4"):
        load_dataset("cifar10", "train", tmp_path, download=False)
    bad.unlink()
    with pytest.raises(DataError, match="data_batch_4 is missing"):
        load_dataset("cifar10", "train", tmp_path, download=False)


def test_image_dataset__subset_keeps_order_and_validates():
    images = torch.arange(5 * 3 * 2 * 2, dtype=torch.uint8).reshape(5, 3, 2, 2)
    ds = ImageDataset("toy", images, torch.tensor([0, 1, 0, 1, 1]), 2, ("a", "b"))
    sub = ds.subset(torch.tensor([4, 0, 4]))
    assert len(sub) == 3 and sub.labels.tolist() == [1, 0, 1]
    assert torch.equal(sub.images[1], images[0]) and sub.images.is_contiguous()
    with pytest.raises(ValueError, match="uint8"):
        ImageDataset("toy", images.float(), ds.labels, 2, ("a", "b"))
    with pytest.raises(ValueError, match="labels"):
        ImageDataset("toy", images, ds.labels[:4], 2, ("a", "b"))


def test_load_dataset__real_fashion_mnist_from_debian_package(monkeypatch):
    """CI installs dataset-fashion-mnist; this test fails (never skips) when it is missing."""
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", DEBIAN_FASHION_MNIST)
    assert (DEBIAN_FASHION_MNIST / "train-images-idx3-ubyte.gz").is_file(), \
        "install the Debian package dataset-fashion-mnist (.ci/run does)"
    ds, lines = python_lines(load_dataset, "fashion_mnist", "train", download=False)
    assert ds.images.shape == (60000, 1, 28, 28) and ds.images.dtype == torch.uint8
    assert ds.num_classes == 10 and ds.labels.bincount().tolist() == [6000] * 10
    # numpy frombuffer, no loop over the 60,000 samples: such a loop runs a line a sample
    assert lines < LINES_WITHOUT_A_SAMPLE_LOOP, lines


def test_download__a_file_with_the_wrong_md5_is_refused_and_not_kept(tmp_path, monkeypatch):
    """A download lands under its name only whole and with the expected md5; otherwise
    nothing is left, not even a temporary file."""
    import hashlib
    import io
    import urllib.request

    body = b"fashion" * 100_000  # several read chunks

    def serve(url, timeout):
        return io.BytesIO(body)

    monkeypatch.setattr(urllib.request, "urlopen", serve)
    path = tmp_path / "d" / "file.gz"
    with pytest.raises(DataError, match="arrived with md5 .*, expected 0+"):
        datasets._download("https://example.org/file.gz", path, "0" * 32)
    assert not path.exists() and not list(path.parent.iterdir())
    datasets._download("https://example.org/file.gz", path, hashlib.md5(body).hexdigest())
    assert path.read_bytes() == body and [p.name for p in path.parent.iterdir()] == ["file.gz"]
