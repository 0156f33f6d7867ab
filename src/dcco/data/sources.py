"""One split of any data set dcco knows, by name: the one entry point the rest of dcco loads
data through (``dcco.run.splits.load_splits``, the Flower nodes).

- images: ``fashion_mnist``, ``cifar10``, ``cifar100`` (``dcco.data.datasets``);
- images in natural clients: ``client_table`` and ``ham10000`` (``dcco.data.tables``),
  ``fed_cifar100`` and ``fed_emnist`` (``dcco.data.tff``);
- pairs of two modalities: ``fashion_mnist_halves``, ``paired_npz`` (``dcco.data.paired``).
"""

from __future__ import annotations

from pathlib import Path

from dcco.config import TableConfig
from dcco.data.datasets import DataError, Split, load_dataset
from dcco.data.paired import Dataset, halves, load_npz_pairs
from dcco.data.tables import load_table
from dcco.data.tff import TFF, load_tff


def load_split(name: str, split: Split, data_dir: str | Path | None = None,
               download: bool = True, table: TableConfig | None = None) -> Dataset:
    """One split of any data set dcco knows: images (``load_dataset``), images in natural
    clients (``dcco.data.tables``: ``client_table`` described by ``table``, ``ham10000``;
    ``dcco.data.tff``: ``fed_cifar100``, ``fed_emnist``) or pairs.

    Raises:
        DataError: files missing or malformed (the message names the file and the problem).
        ValueError: unknown ``name`` or ``split``.
    """
    if name in ("client_table", "ham10000"):
        return load_table(name, table or TableConfig(), split, data_dir)
    if name in TFF:
        return load_tff(name, split, data_dir, download)
    if name == "fashion_mnist_halves":
        return halves(load_dataset("fashion_mnist", split, data_dir, download))
    if name == "paired_npz":
        return load_npz_pairs(split, data_dir)
    if name == "pairs":
        raise DataError("data.dataset = 'pairs' trains on a PairedDataset that your code "
                        "passes to dcco.run.pretraining.Pretraining; nothing is loaded from files. To "
                        "train from files (the CLI, Flower) write train.npz and test.npz and "
                        "use data.dataset = 'paired_npz' (docs/multimodal.md)")
    if name == "samples":
        raise DataError("data.dataset = 'samples' trains on samples that your code passes to "
                        "dcco.fit (a mapping from client id to samples); nothing is loaded "
                        "from files, so continue such a run with dcco.fit(..., run_dir=RUN_DIR) "
                        "(docs/own_code.md)")
    return load_dataset(name, split, data_dir, download)  # type: ignore[arg-type]


__all__ = ["load_split"]
