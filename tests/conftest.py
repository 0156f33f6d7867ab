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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, each worker's first share starts with its own of the ``slow``
    tests (real deployments, minutes each), dealt round-robin in collection order.

    ``--dist worksteal`` hands the i-th worker the i-th contiguous third of the collection
    and lets an idle worker steal the *end* of a busy one's queue. In collection order the
    slow tests sat wherever their files fell, several in one worker's share, so one worker
    could still be running minutes of deployments after the others had run dry. Dealt to the
    front of every share, they start at once, side by side, and the short tests fill in
    around them. Every worker collects the same order (the hook is deterministic), as
    xdist requires."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 0))
    if workers < 2:
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    rest = [item for item in items if item.get_closest_marker("slow") is None]
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for i, item in enumerate(slow):
        shares[i % workers].append(item)
    # xdist's first split: the first worker takes n // workers, each next an even share of
    # what is left; fill each share with the short tests up to its size
    left, at = len(items), 0
    for i, share in enumerate(shares):
        size = left // (workers - i)
        take = max(0, size - len(share))
        share += rest[at:at + take]
        at += take
        left -= len(share)
    shares[-1] += rest[at:]
    items[:] = [item for share in shares for item in share]


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
