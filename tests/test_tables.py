"""Naturally partitioned data: client tables (HAM10000's CSV and JPEGs, Hugging Face
Parquet), TFF's h5 files, their splits by client, every bad input named, and the decoded
cache."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.client_tables import (
    HAM_CLASSES,
    ham_histogram,
    jpeg_bytes,
    make_ham10000,
    make_parquet,
    make_tff,
)

from dcco.config import ConfigError, TableConfig, load_config
from dcco.data import DataError, load_split
from dcco.data.partition import natural_partition
from dcco.data.tables import client_split

SMALL = TableConfig(image_size=(12, 12))


@pytest.fixture(scope="module")
def ham(tmp_path_factory) -> Path:
    return make_ham10000(tmp_path_factory.mktemp("ham") / "HAM10000")


def _rows(folder: Path) -> list[dict]:
    with open(folder / "HAM10000_metadata.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_ham10000__lesions_of_1_to_6_images_split_by_lesion(ham):
    train = load_split("ham10000", "train", ham, table=SMALL)
    test = load_split("ham10000", "test", ham, table=SMALL)
    rows = _rows(ham)
    assert len(train) + len(test) == len(rows)
    assert train.images.shape[1:] == (3, 12, 12) and train.images.dtype == torch.uint8
    assert train.class_names == tuple(sorted(HAM_CLASSES)) == HAM_CLASSES
    # the real 1–6 histogram, lesion by lesion
    sizes = {}
    for split in (train, test):
        counts = torch.bincount(split.clients)
        for size in counts[counts > 0].tolist():
            sizes[size] = sizes.get(size, 0) + 1
    assert sizes == ham_histogram(120)
    # no lesion on both sides; about a fifth of the lesions tested
    train_lesions = set(train.clients.unique().tolist())
    test_lesions = set(test.clients.unique().tolist())
    assert not train_lesions & test_lesions
    assert abs(len(test_lesions) / (len(train_lesions) + len(test_lesions)) - 0.2) < 0.02
    # each image keeps its lesion and diagnosis
    by_image = {r["image_id"]: r for r in rows}
    lesion_of = {r["lesion_id"]: r["dx"] for r in rows}
    for split in (train, test):
        for c, y in zip(split.clients.tolist(), split.labels.tolist()):
            assert lesion_of[split.client_names[c]] == split.class_names[y]
    assert len(by_image) == len(rows)


def test_ham10000__the_split_is_the_same_for_every_run_and_seeded(ham):
    a = load_split("ham10000", "test", ham, table=SMALL)
    b = load_split("ham10000", "test", ham, table=SMALL)
    assert torch.equal(a.clients, b.clients)
    other = load_split("ham10000", "test", ham, table=replace(SMALL, split_seed=1))
    assert set(other.clients.tolist()) != set(a.clients.tolist())
    names = np.array([f"c{i}" for i in range(50)])
    assert client_split(names, 0.2, 0).sum() == 10
    assert np.array_equal(client_split(names, 0.2, 0), client_split(names, 0.2, 0))


def test_client_table__decoded_once_into_the_cache_and_rebuilt_when_an_image_changes(
        ham, tmp_path):
    folder = tmp_path / "copy"
    make_ham10000(folder, lesions=20, seed=3)
    first = load_split("ham10000", "train", folder, table=SMALL)
    caches = list(folder.glob(".dcco-cache-table-*"))
    assert len(caches) == 1
    stamp = (caches[0] / "meta.json").stat().st_mtime_ns
    again = load_split("ham10000", "train", folder, table=SMALL)
    assert torch.equal(first.images, again.images)
    assert (caches[0] / "meta.json").stat().st_mtime_ns == stamp  # read, not rebuilt
    # another image size is another cache; an edited image rebuilds
    load_split("ham10000", "train", folder, table=replace(SMALL, image_size=(8, 8)))
    assert len(list(folder.glob(".dcco-cache-table-*"))) == 2
    image = next((folder / "HAM10000_images_part_1").glob("*.jpg"))
    image.write_bytes(jpeg_bytes(np.zeros((18, 24, 3), np.uint8)))
    rebuilt = load_split("ham10000", "train", folder, table=SMALL)
    assert (caches[0] / "meta.json").stat().st_mtime_ns != stamp
    assert rebuilt.images.shape == first.images.shape


@pytest.mark.parametrize("hf_metadata", [True, False])
def test_parquet__hugging_face_layout_with_and_without_its_metadata(tmp_path, hf_metadata):
    table = make_parquet(tmp_path / "t.parquet", hf_metadata=hf_metadata)
    cfg = replace(SMALL, file=str(table), client_column="patient")
    train = load_split("client_table", "train", None, table=cfg)
    test = load_split("client_table", "test", None, table=cfg)
    assert train.class_names == ("benign", "malignant", "other")
    assert len(train) + len(test) == 60 and len(train.client_names) == 15
    assert not set(train.clients.tolist()) & set(test.clients.tolist())
    for split in (train, test):  # patient k has class k mod 3
        for c, y in zip(split.clients.tolist(), split.labels.tolist()):
            assert int(split.client_names[c].split("-")[1]) % 3 == y


def test_parquet__a_path_column_and_a_test_file(tmp_path):
    train_file = make_parquet(tmp_path / "data" / "train.parquet", embed=False, seed=1)
    test_file = make_parquet(tmp_path / "data" / "test.parquet", rows=12, clients=15, seed=2)
    cfg = replace(SMALL, file="train.parquet", test_file="test.parquet",
                  client_column="patient")
    # the same 15 patients in both files: refused, naming one
    with pytest.raises(DataError, match="client 'patient-000' has images in both"):
        load_split("client_table", "train", tmp_path / "data", table=cfg)
    make_parquet(test_file, rows=12, clients=3, seed=2)
    import pyarrow.parquet as pq

    t = pq.read_table(test_file)
    renamed = t.set_column(2, "patient", [[f"new-{v}" for v in t.column("patient").to_pylist()]])
    pq.write_table(renamed, test_file)
    train = load_split("client_table", "train", tmp_path / "data", table=cfg)
    test = load_split("client_table", "test", tmp_path / "data", table=cfg)
    assert len(train) == 60 and len(test) == 12
    assert all(train_file.parent.joinpath(f"img_{i}.jpg").is_file() for i in range(60))


@pytest.mark.parametrize("name", ["fed_cifar100", "fed_emnist"])
def test_tff__both_h5_layouts_with_their_clients(tmp_path, name):
    for split in ("train", "test"):
        make_tff(tmp_path, name, split, clients=4 if split == "train" else 2)
    train = load_split(name, "train", tmp_path)
    test = load_split(name, "test", tmp_path)
    channels, side = (3, 32) if name == "fed_cifar100" else (1, 28)
    assert train.images.shape == (20, channels, side, side) and len(test) == 10
    assert train.num_classes == (100 if name == "fed_cifar100" else 62)
    assert len(train.client_names) == 4 and torch.bincount(train.clients).tolist() == [5] * 4
    partition = natural_partition(train.clients)
    assert partition.num_clients == 4 and partition.sizes.tolist() == [5] * 4


def test_tff__offline_error_names_the_files_and_where_to_put_them(tmp_path):
    with pytest.raises(DataError, match=r"fed_emnist_train\.h5 not found .*tff-datasets-public/"
                                        r"fed_emnist\.tar\.bz2"):
        load_split("fed_emnist", "train", tmp_path, download=False)


# ------------------------------------------------------------------------------ bad input


def _csv_table(folder: Path, rows: list[dict], columns=("image", "label", "client"),
               images: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for r in rows if images else []:
        if r.get("image") and not (folder / r["image"]).exists():
            (folder / r["image"]).write_bytes(jpeg_bytes(np.full((8, 8, 3), 100, np.uint8)))
    with open(folder / "t.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns) + ["split"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return folder / "t.csv"


GOOD = [{"image": f"{i}.jpg", "label": "ab"[i % 2], "client": f"c{i // 2}",
         "split": "train" if i < 4 else "test"} for i in range(8)]
"""Four clients of two images: c0, c1 in training, c2, c3 tested."""


@pytest.mark.parametrize("change, message", [
    (lambda rows, f: None, None),
    (lambda rows, f: rows[3].update(client=""), r"t\.csv, line 5: column 'client' is empty"),
    (lambda rows, f: rows[2].update(label=""), r"t\.csv, line 4: column 'label' is empty"),
    (lambda rows, f: rows[1].update(image="nowhere.jpg"),
     r"t\.csv, line 3, column 'image': image 'nowhere\.jpg' not found"),
    (lambda rows, f: (f / "5.jpg").write_bytes(b"not a jpeg"),
     r"5\.jpg \(from .*t\.csv, line 7\): not a readable image"),
    (lambda rows, f: rows[4].update(split="val"),
     r"t\.csv, line 6: column 'split' is 'val'; it must be 'train' or 'test'"),
    (lambda rows, f: rows[0].update(split="test"),
     r"^/.*/t\.csv: client 'c0' has images in both the train and the test split"),
])
def test_client_table__every_bad_row_is_named(tmp_path, change, message):
    rows = [dict(r) for r in GOOD]
    folder = tmp_path / "t"
    _csv_table(folder, rows)
    change(rows, folder)
    table = _csv_table(folder, rows, images=False)
    cfg = replace(SMALL, file=str(table), split_column="split")
    if message is None:
        test = load_split("client_table", "test", None, table=cfg)
        assert sorted(test.client_names[c] for c in test.clients.unique().tolist()) == [
            "c2", "c3"]
        return
    with pytest.raises(DataError, match=message):
        load_split("client_table", "train", None, table=cfg)
    assert not list(folder.glob(".dcco-cache-*"))  # a table that fails leaves no cache


def test_client_table__missing_and_misnamed_columns_and_files(tmp_path):
    table = _csv_table(tmp_path / "t", [dict(r) for r in GOOD])
    with pytest.raises(DataError, match=r"no column 'patient' \(table\.client_column\); its "
                                        r"columns are image, label, client, split"):
        load_split("client_table", "train", None,
                   table=replace(SMALL, file=str(table), client_column="patient"))
    with pytest.raises(DataError, match="the table .*missing.csv does not exist"):
        load_split("client_table", "train", None,
                   table=replace(SMALL, file=str(tmp_path / "missing.csv")))
    with pytest.raises(DataError, match="needs table.file"):
        load_split("client_table", "train", None, table=SMALL)
    (tmp_path / "t.xlsx").write_text("x")
    with pytest.raises(DataError, match=r"must be \.csv or \.parquet"):
        load_split("client_table", "train", None, table=replace(SMALL, file=str(
            tmp_path / "t.xlsx")))
    with pytest.raises(DataError, match="HAM10000 is not downloaded automatically: get it "
                                        "from Harvard Dataverse, doi:10.7910/DVN/DBW86T"):
        load_split("ham10000", "train", tmp_path, table=SMALL)


def test_config__table_keys_and_natural_partitions_checked(tmp_path):
    with pytest.raises(ConfigError, match="data.partition = 'natural' takes the clients"):
        load_config(None, ["data.partition=\"natural\""])
    with pytest.raises(ConfigError, match=r"\[table\] describes a client table"):
        load_config(None, ["table.image_size=[16, 16]"])
    with pytest.raises(ConfigError, match="table.file is for data.dataset = 'client_table'"):
        load_config(None, ['data.dataset="ham10000"', 'table.file="x.csv"'])
    with pytest.raises(ConfigError, match="table.channels must be 1 or 3"):
        load_config(None, ['data.dataset="client_table"', "table.channels=2"])
    cfg = load_config(None, ['data.dataset="ham10000"', 'data.partition="natural"',
                             "table.image_size=[16, 16]", 'train.method="cco_fedavg"',
                             "data.samples_per_client=1"])
    assert cfg.table.image_size == (16, 16)
    json.dumps(cfg.table.__dict__)


def test_client_table__a_client_on_both_sides_is_named_with_the_tables_full_path(tmp_path,
                                                                                 monkeypatch):
    rows = [dict(r) for r in GOOD]
    rows[0]["split"] = "test"
    _csv_table(tmp_path / "t", rows)
    monkeypatch.chdir(tmp_path)
    cfg = replace(SMALL, file="t.csv", split_column="split")
    with pytest.raises(DataError, match=f"^{tmp_path}/t/t\\.csv: client 'c0'"):
        load_split("client_table", "train", "t", table=cfg)  # a relative data folder
    assert not list((tmp_path / "t").glob(".dcco-cache-*"))
