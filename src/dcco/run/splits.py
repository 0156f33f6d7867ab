"""A run's data: the training and test splits its config names (or, with ``data.validation``,
the training split and the samples held out of it), and the record of how they were split
(``split.json``: which clients each holds, for data in natural clients; which samples were held
out, for a validation split)."""

from __future__ import annotations

from dcco.config import RunConfig
from dcco.data.datasets import DataError
from dcco.data.paired import Dataset
from dcco.data.sources import load_split
from dcco.data.tables import split_record as table_split_record
from dcco.data.validation import fingerprint, hold_out
from dcco.run.setup import check_data


def training_split(cfg: RunConfig) -> Dataset:
    """The samples the run trains on: the configured data set's training split, less the
    validation samples when ``data.validation`` holds some out (``dcco.data.validation``)."""
    train = load_split(cfg.data.dataset, "train", cfg.data.data_dir, table=cfg.table)
    if cfg.data.validation:
        train = hold_out(train, cfg.data.validation, cfg.data.validation_seed)[0]
    return train


def load_splits(cfg: RunConfig) -> tuple[Dataset, Dataset]:
    """The training and test splits of the configured data set (images or pairs), checked
    against the config (``dcco.run.setup.check_data``; their values are scanned for NaN and
    infinities once, where a run starts: ``dcco.run.setup.check_run``).

    With ``data.validation = n`` the second split is the ``n`` training samples held out
    (``dcco.data.validation.hold_out``) and the first the rest: the test split's files are
    never opened, so every evaluation and monitor of the run scores the held-out samples."""
    train = load_split(cfg.data.dataset, "train", cfg.data.data_dir, table=cfg.table)
    if cfg.data.validation:
        train, held = hold_out(train, cfg.data.validation, cfg.data.validation_seed)
        check_data(cfg, train, scan=False)
        return train, held
    check_data(cfg, train, scan=False)
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
    directory), for data in natural clients; which samples were held out, for a validation
    split; None for other data."""
    if cfg.data.validation:
        return {"rule": f"validation: {cfg.data.validation} training samples held out, "
                        f"class-balanced, seed {cfg.data.validation_seed} "
                        f"(dcco.data.validation); the test split is not read",
                "train": {"samples": len(train)},
                "validation": {"samples": len(test), "sha256": fingerprint(test)}}
    if getattr(train, "clients", None) is None:
        return None
    if cfg.data.dataset in ("client_table", "ham10000"):
        return table_split_record(cfg.data.dataset, cfg.table, train, test)
    return {"rule": f"the files of {cfg.data.dataset} (its own split)",
            "train": {"images": len(train), "clients": int(train.clients.unique().numel())},
            "test": {"images": len(test), "clients": int(test.clients.unique().numel())}}
