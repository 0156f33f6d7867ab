"""Shared fixtures: tiny data sets written in the real on-disk formats."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

if os.environ.get("PYTEST_XDIST_WORKER"):  # three workers share 2 cores: one thread each, for
    os.environ["OMP_NUM_THREADS"] = "1"  # torch here and the processes the tests start

import numpy as np
import pytest


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array as a gzipped IDX file (the MNIST / Fashion-MNIST format)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", n) for n in array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def make_fashion_mnist(folder: Path, n_train: int = 300, n_test: int = 100, size: int = 12,
                       classes: int = 10, seed: int = 0) -> Path:
    """Fashion-MNIST-format files whose classes carry distinct patterns (learnable)."""
    rng = np.random.default_rng(seed)
    patterns = rng.uniform(0, 255, size=(classes, size, size))
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = np.arange(n) % classes
        rng.shuffle(labels)
        noise = rng.uniform(0, 255, size=(n, size, size))
        images = (0.6 * patterns[labels] + 0.4 * noise).astype(np.uint8)
        write_idx(folder / f"{split}-images-idx3-ubyte.gz", images)
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", labels.astype(np.uint8))
    return folder


@pytest.fixture
def tiny_fmnist(tmp_path: Path) -> Path:
    """A folder with tiny Fashion-MNIST-format files (10 learnable classes, 12×12 images)."""
    return make_fashion_mnist(tmp_path / "data")


TINY_CONFIG = """
[data]
dataset = "fashion_mnist"
data_dir = "{data_dir}"
alpha = 0.0
samples_per_client = 2

[model]
widths = [4, 8, 8]
projector = [16, 16, 16]

[augment]
blur_p = [0.0, 0.0]

[train]
method = "{method}"
rounds = {rounds}
clients_per_round = 4
log_every = 2
checkpoint_every = {checkpoint_every}
knn_every = 0

[optim]
lr = 0.005

[eval]
labels = 40
probe_steps = 30
probe_batch = 32
finetune_steps = 5
finetune_batch = 16
scratch_epochs = 2
scratch_batch = 16
knn_k = 5
"""


@pytest.fixture
def tiny_config(tmp_path: Path, tiny_fmnist: Path):
    """A factory of tiny run configs on ``tiny_fmnist``: tiny_config(method=..., rounds=...)."""

    def make(method: str = "dcco", rounds: int = 6, checkpoint_every: int = 3) -> Path:
        path = tmp_path / f"{method}-{rounds}.toml"
        path.write_text(TINY_CONFIG.format(data_dir=tiny_fmnist, method=method, rounds=rounds,
                                           checkpoint_every=checkpoint_every))
        return path

    return make
