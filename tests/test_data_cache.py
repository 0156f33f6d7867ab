"""The decoded data cache (dcco.data.cache): written once next to the files, used instead of
decoding them, and rebuilt whenever it does not match its sources exactly."""

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_fashion_mnist

from dcco.data import cache as data_cache
from dcco.data import datasets
from dcco.data.datasets import DEBIAN_FASHION_MNIST, load_dataset


def _load(folder: Path):
    return load_dataset("fashion_mnist", "train", folder, download=False)


def _same(a, b) -> bool:
    return torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)


def _uncached(folder: Path, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv(data_cache.ENV, "0")
        return _load(folder)


def test_cache__written_once_then_used_instead_of_the_files(tiny_fmnist, monkeypatch):
    first = _load(tiny_fmnist)
    place = tiny_fmnist / ".dcco-cache-fashion_mnist-train"
    assert sorted(p.name for p in place.iterdir()) == ["images.npy", "labels.npy", "meta.json"]
    assert not list(tiny_fmnist.glob("*.part"))  # no temporary folder left behind

    def no_decoding(*args, **kwargs):
        raise AssertionError("the IDX files were decoded although the cache is valid")

    monkeypatch.setattr(datasets, "read_idx", no_decoding)
    second = _load(tiny_fmnist)
    assert _same(first, second)
    assert second.images.shape == (300, 1, 12, 12) and second.labels.dtype == torch.int64
    second.images[0, 0, 0, 0] = 7  # a private copy: the cache's file is not touched
    assert _same(first, _load(tiny_fmnist))


def test_cache__a_changed_source_is_decoded_again(tiny_fmnist, monkeypatch):
    before = _load(tiny_fmnist)
    make_fashion_mnist(tiny_fmnist, seed=5)  # new files, same names
    after = _load(tiny_fmnist)
    assert not _same(before, after)
    assert _same(after, _uncached(tiny_fmnist, monkeypatch))


def test_cache__a_corrupt_cache_is_detected_and_rebuilt(tiny_fmnist, monkeypatch):
    truth = _load(tiny_fmnist)
    images = tiny_fmnist / ".dcco-cache-fashion_mnist-train" / "images.npy"
    raw = bytearray(images.read_bytes())
    raw[-5] ^= 0xFF  # one flipped byte in the payload: same size, same header
    images.write_bytes(bytes(raw))
    assert data_cache.read_cache(images.parent, [tiny_fmnist / "train-images-idx3-ubyte.gz",
                                                 tiny_fmnist / "train-labels-idx1-ubyte.gz"]
                                 ) is None
    assert _same(_load(tiny_fmnist), truth)
    images.write_bytes(images.read_bytes()[:100])  # truncated
    assert _same(_load(tiny_fmnist), truth)
    assert data_cache.read_cache(images.parent, [tiny_fmnist / "train-images-idx3-ubyte.gz",
                                                 tiny_fmnist / "train-labels-idx1-ubyte.gz"]
                                 ) is not None  # rebuilt


def test_cache__off_with_the_environment_variable_and_never_needed(tiny_fmnist, monkeypatch):
    monkeypatch.setenv(data_cache.ENV, "0")
    _load(tiny_fmnist)
    assert not (tiny_fmnist / ".dcco-cache-fashion_mnist-train").exists()
    monkeypatch.delenv(data_cache.ENV)

    def read_only(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(data_cache, "write_cache", read_only)
    assert _same(_load(tiny_fmnist), _uncached(tiny_fmnist, monkeypatch))  # loads anyway


def test_cache__of_the_system_files_goes_to_the_download_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("DCCO_DATA", str(tmp_path / "mine"))
    assert datasets._cache_folders(DEBIAN_FASHION_MNIST, None) == [tmp_path / "mine"]
    assert datasets._cache_folders(tmp_path, None) == [tmp_path, tmp_path / "mine"]


def test_write_cache__replaces_a_stale_cache_in_one_rename(tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(b"x")
    place = tmp_path / ".dcco-cache-test"
    data_cache.write_cache(place, [source], (np.zeros((2, 3), np.uint8), np.arange(2)))
    source.write_bytes(b"yy")  # the source changed: the cache no longer matches
    assert data_cache.read_cache(place, [source]) is None
    data_cache.write_cache(place, [source], (np.ones((2, 3), np.uint8), np.arange(2)))
    images, labels = data_cache.read_cache(place, [source])
    assert images.sum() == 6 and list(labels) == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".dcco-cache-test", "source.bin"]
    with pytest.raises(ValueError):  # memory-mapped read-only
        images[0, 0] = 1
