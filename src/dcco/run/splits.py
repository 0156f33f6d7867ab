"""A run's data: the training and test splits its config names, and the record of which
clients each holds (``split.json``, for data in natural clients)."""

from __future__ import annotations

from dcco.config import RunConfig
from dcco.data.datasets import DataError
from dcco.data.paired import Dataset
from dcco.data.sources import load_split
from dcco.data.tables import split_record as table_split_record
from dcco.run.setup import check_data


def load_splits(cfg: RunConfig) -> tuple[Dataset, Dataset]:
    """The training and test splits of the configured data set (images or pairs), checked
    against the config (``dcco.run.setup.check_data``)."""
    train = load_split(cfg.data.dataset, "train", cfg.data.data_dir, table=cfg.table)
    check_data(cfg, train)
    test = load_split(cfg.data.dataset, "test", cfg.data.data_dir, table=cfg.table)
    for tower in range(1 + train.paired):
        a, b = train.inputs(tower), test.inputs(tower)
        if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
            raise DataError(f"the test split's {'XY'[tower] if train.paired else 'images'} "
                            f"are {b.dtype} {tuple(b.shape[1:])}, the training split's "
                            f"{a.dtype} {tuple(a.shape[1:])}; both splits must match")
    return train, test


def split_record(cfg: RunConfig, train: Dataset, test: Dataset) -> dict | None:
    """How the data's clients were split into training and test (``split.json`` of a run
    directory), for data in natural clients; None for other data."""
    if getattr(train, "clients", None) is None:
        return None
    if cfg.data.dataset in ("client_table", "ham10000"):
        return table_split_record(cfg.data.dataset, cfg.table, train, test)
    return {"rule": f"the files of {cfg.data.dataset} (its own split)",
            "train": {"images": len(train), "clients": int(train.clients.unique().numel())},
            "test": {"images": len(test), "clients": int(test.clients.unique().numel())}}
