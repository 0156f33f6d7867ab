"""Images in natural clients, from a table: one row per image, with its label and its client
(a patient, a lesion, a writer, a phone).

Two formats (section ``[table]`` of a run config, ``TableConfig``):

- **CSV plus image files**: the image column holds a file name or a path, relative to each
  of ``image_folders`` in turn (relative to the table's folder) with ``image_suffix``
  appended; e.g. HAM10000's ``image_id`` ``ISIC_0027419`` →
  ``HAM10000_images_part_1/ISIC_0027419.jpg``.
- **Parquet** (``.parquet``; needs ``pyarrow``, the ``tables`` extra) in the Hugging Face
  layout: the image column a ``struct{bytes, path}`` (the encoded file, or a path when the
  bytes are null) or a plain path column; a label column of names or integers, whose names
  come from the Hugging Face metadata's ``ClassLabel`` when the file carries it.

``data.dataset = "ham10000"`` reads HAM10000 (``HAM10000_metadata.csv``, images in
``HAM10000_images_part_{1,2}``) with its columns (``image_id``, ``dx``, ``lesion_id``): the
open counterpart of the paper's DERM data.

Every image is decoded (Pillow), converted to ``channels`` and resized to ``image_size``
once, into the verified memory-mappable cache of ``dcco.data.cache`` next to the table, so
later runs and every Flower message load in milliseconds. Class indices are the sorted label
names (integers sorted as numbers); client indices the sorted client ids.

Splits never share a client. A ``split_column`` (values ``train`` and ``test``) or a
``test_file`` gives the split, and a client on both sides is an error naming it; otherwise a
seeded share of the clients (``test_fraction``, ``split_seed``) is the test split, the same
for every run (``split_record`` describes it for the run directory). Every problem with the
table names the file, and where it is about one row, the row and the column.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dcco.config import TableConfig
from dcco.config.table_config import ham10000_table
from dcco.data.cache import cached_arrays
from dcco.data.datasets import DataError, ImageDataset, Split, search_dirs, shown

TABLE_ARRAYS = ("images", "labels", "clients", "splits", "class_names", "client_names")
"""What a decoded table holds: uint8 (N, C, H, W) images; int64 labels and client indices;
uint8 splits (0 none given, 1 train, 2 test); the class and client names (unicode)."""
SPLITS = {"train": 1, "test": 2}

HAM10000 = "ham10000"
HAM10000_SOURCE = ("Harvard Dataverse, doi:10.7910/DVN/DBW86T (also ISIC 2018 Task 3): "
                   "HAM10000_metadata.csv and the folders HAM10000_images_part_1 and "
                   "HAM10000_images_part_2")


# ------------------------------------------------------------------------------ reading


@dataclass
class _Rows:
    """A table's columns as Python lists (one entry per row) and where they came from."""

    path: Path
    images: list[Any]
    """Paths (str) or encoded bytes, per row."""
    labels: list[Any]
    clients: list[Any]
    splits: list[Any] | None
    label_names: list[str] | None = None
    """The label column's class names, when the file says them (Hugging Face ClassLabel)."""


def _locate(name: str, data_dir: str | Path | None, what: str) -> Path:
    path = Path(name).expanduser()
    if path.is_absolute():
        if not path.is_file():
            raise DataError(f"{what} {path} does not exist")
        return path
    dirs = search_dirs(data_dir)
    for folder in dirs:
        if (folder / path).is_file():
            return folder / path
    where = ("the data directory (data.data_dir or --data-dir), the only place searched when "
             "it is given" if data_dir is not None else
             "the places searched without a data directory: $DCCO_DATA, then ~/.cache/dcco")
    raise DataError(f"{what} {name!r} is not in {' or '.join(map(shown, dirs))}: "
                    f"{where}")


def _columns_check(path: Path, have: list[str], want: dict[str, str | None]) -> None:
    for key, column in want.items():
        if column is not None and column not in have:
            raise DataError(f"{path}: no column {column!r} (table.{key}); its columns are "
                            f"{', '.join(have)}")


def _read_csv(path: Path, cfg: TableConfig) -> _Rows:
    import csv

    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            have = list(reader.fieldnames or [])
            _columns_check(path, have, _wanted(cfg))
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path} is not a readable CSV file: {e}") from None
    get = (lambda c: [r[c] for r in rows] if c is not None else None)
    return _Rows(path, get(cfg.image_column), get(cfg.label_column), get(cfg.client_column),
                 get(cfg.split_column))


def _read_parquet(path: Path, cfg: TableConfig) -> _Rows:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow (pip install 'dcco[tables]')"
                        ) from None
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as e:  # pyarrow's ArrowIOError, ArrowInvalid
        raise DataError(f"{path} is not a readable Parquet file: {e}") from None
    _columns_check(path, table.column_names, _wanted(cfg))
    images = []
    for value in table.column(cfg.image_column).to_pylist():
        if isinstance(value, dict):  # Hugging Face Image: {"bytes": ..., "path": ...}
            value = value.get("bytes") or value.get("path")
        images.append(value)
    get = (lambda c: table.column(c).to_pylist() if c is not None else None)
    return _Rows(path, images, get(cfg.label_column), get(cfg.client_column),
                 get(cfg.split_column), _hf_label_names(table.schema.metadata or {},
                                                        cfg.label_column))


def _hf_label_names(metadata: dict, column: str) -> list[str] | None:
    """The ClassLabel names of ``column`` in a Hugging Face Parquet file's metadata."""
    raw = metadata.get(b"huggingface")
    if raw is None:
        return None
    try:
        features = json.loads(raw)["info"]["features"]
        feature = features[column]
    except (ValueError, KeyError, TypeError):
        return None
    if isinstance(feature, dict) and feature.get("_type") == "ClassLabel":
        return [str(n) for n in feature.get("names", [])] or None
    return None


def _wanted(cfg: TableConfig) -> dict[str, str | None]:
    return {"image_column": cfg.image_column, "label_column": cfg.label_column,
            "client_column": cfg.client_column, "split_column": cfg.split_column}


def read_rows(path: Path, cfg: TableConfig) -> _Rows:
    if path.suffix.lower() == ".parquet":
        return _read_parquet(path, cfg)
    if path.suffix.lower() in (".csv", ".tsv", ".txt"):
        return _read_csv(path, cfg)
    raise DataError(f"{path}: a table must be .csv or .parquet, got {path.suffix or 'no suffix'}")


# ------------------------------------------------------------------------------ values


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (
        isinstance(value, str) and not value.strip())


def _text(value: Any) -> str:
    """A label or client id as text (integers written as integers)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def _sorted_names(values: set[str]) -> list[str]:
    """Names sorted as numbers when they all are integers, else as text."""
    if all(v.lstrip("-").isdigit() for v in values):
        return sorted(values, key=int)
    return sorted(values)


def _label_names(tables: list[_Rows], cfg: TableConfig) -> list[str]:
    named = next((t.label_names for t in tables if t.label_names), None)
    values = set()
    for t in tables:
        for row, value in enumerate(t.labels):
            if _missing(value):
                raise DataError(f"{t.path}, {_row(t, row)}: column {cfg.label_column!r} is "
                                f"empty; every image needs a label")
            if named is not None and isinstance(value, int):
                if not 0 <= value < len(named):
                    raise DataError(f"{t.path}, {_row(t, row)}: label {value} in column "
                                    f"{cfg.label_column!r} has no class (the file's ClassLabel "
                                    f"names {len(named)})")
                value = named[value]
            values.add(_text(value))
    return _sorted_names(values)


def _row(t: _Rows, i: int) -> str:
    """How the error messages name data row ``i`` (0-based): a CSV's line number (the header
    is line 1), a Parquet table's row index."""
    return f"line {i + 2}" if t.path.suffix.lower() != ".parquet" else f"row {i}"


def _image_bytes(t: _Rows, i: int, cfg: TableConfig) -> tuple[bytes, str]:
    """Row ``i``'s encoded image and what names it (its path, or the row)."""
    value = t.images[i]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), f"{t.path}, {_row(t, i)}, column {cfg.image_column!r}"
    if _missing(value):
        raise DataError(f"{t.path}, {_row(t, i)}: column {cfg.image_column!r} is empty")
    name = str(value).strip() + cfg.image_suffix
    for folder in cfg.image_folders:
        path = (t.path.parent / folder / name)
        if path.is_file():
            try:
                return path.read_bytes(), f"{path} (from {t.path}, {_row(t, i)})"
            except OSError as e:
                raise DataError(f"{path} (from {t.path}, {_row(t, i)}) cannot be read: {e}"
                                ) from None
    raise DataError(f"{t.path}, {_row(t, i)}, column {cfg.image_column!r}: image {name!r} not "
                    f"found in {', '.join(str(t.path.parent / f) for f in cfg.image_folders)}")


def _image_paths(t: _Rows, cfg: TableConfig) -> list[Path]:
    """The image files a table refers to (those found), for the cache's identity."""
    found = []
    for value in t.images:
        if isinstance(value, (bytes, bytearray, memoryview)) or _missing(value):
            continue
        name = str(value).strip() + cfg.image_suffix
        for folder in cfg.image_folders:
            path = t.path.parent / folder / name
            if path.is_file():
                found.append(path)
                break
    return found


def decode_image(data: bytes, where: str, size: tuple[int, int], channels: int) -> np.ndarray:
    """An encoded image (JPEG, PNG, ...) as uint8 (channels, H, W), resized (bilinear, with
    antialiasing) to ``size``."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            img = img.convert("RGB" if channels == 3 else "L")
            img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            array = np.asarray(img, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise DataError(f"{where}: not a readable image ({type(e).__name__}: {e})") from None
    return array[None] if channels == 1 else array.transpose(2, 0, 1)


def _decode(tables: list[_Rows], cfg: TableConfig) -> tuple[np.ndarray, ...]:
    names = _label_names(tables, cfg)
    index = {n: i for i, n in enumerate(names)}
    named = next((t.label_names for t in tables if t.label_names), None)
    clients: set[str] = set()
    for t in tables:
        for i, value in enumerate(t.clients):
            if _missing(value):
                raise DataError(f"{t.path}, {_row(t, i)}: column {cfg.client_column!r} is "
                                f"empty; every image needs a client id")
            clients.add(_text(value))
    client_names = _sorted_names(clients)
    client_index = {n: i for i, n in enumerate(client_names)}
    n = sum(len(t.labels) for t in tables)
    images = np.empty((n, cfg.channels, *cfg.image_size), np.uint8)
    labels, owners, splits = (np.empty(n, np.int64), np.empty(n, np.int64),
                              np.zeros(n, np.uint8))
    row = 0
    for k, t in enumerate(tables):
        for i in range(len(t.labels)):
            data, where = _image_bytes(t, i, cfg)
            images[row] = decode_image(data, where, cfg.image_size, cfg.channels)
            label = t.labels[i]
            if named is not None and isinstance(label, int):
                label = named[label]
            labels[row] = index[_text(label)]
            owners[row] = client_index[_text(t.clients[i])]
            if t.splits is not None:
                value = _text(t.splits[i]).lower() if not _missing(t.splits[i]) else ""
                if value not in SPLITS:
                    raise DataError(f"{t.path}, {_row(t, i)}: column {cfg.split_column!r} is "
                                    f"{t.splits[i]!r}; it must be 'train' or 'test'")
                splits[row] = SPLITS[value]
            elif len(tables) > 1:
                splits[row] = SPLITS["test" if k == 1 else "train"]
            row += 1
    return (images, labels, owners, splits, np.array(names, dtype=str),
            np.array(client_names, dtype=str))


# ------------------------------------------------------------------------------ splits


def _check_split(splits: np.ndarray, owners: np.ndarray, client_names: np.ndarray,
                 where: str) -> None:
    """No client on both sides of a given split."""
    train = set(np.unique(owners[splits == SPLITS["train"]]).tolist())
    test = set(np.unique(owners[splits == SPLITS["test"]]).tolist())
    both = sorted(train & test)
    if both:
        names = [str(client_names[c]) for c in both[:3]]
        raise DataError(f"{where}: client {names[0]!r} has images in both the train and the "
                        f"test split ({len(both)} client{'s' if len(both) > 1 else ''} do"
                        f"{'' if len(both) > 1 else 'es'}: {', '.join(names)}"
                        f"{', ...' if len(both) > 3 else ''}); a client's images must stay "
                        f"on one side")


def client_split(client_names: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """bool (K,): whether each client is in the test split: the first ⌈fraction·K⌉ clients of
    a seeded permutation of the sorted client names (a function of the names and the seed
    alone, so every run of a table tests on the same clients)."""
    from dcco.core.seeding import generator

    k = len(client_names)
    order = torch.randperm(k, generator=generator(seed, "client-split")).numpy()
    test = np.zeros(k, bool)
    test[order[:max(1, math.ceil(fraction * k))] if k > 1 else []] = True
    return test


# ------------------------------------------------------------------------------ loading


def _settings(cfg: TableConfig) -> dict:
    keep = {k: v for k, v in asdict(cfg).items() if k not in ("test_fraction", "split_seed")}
    return json.loads(json.dumps(keep))  # tuples as lists, as the cache's JSON holds them


def decoded_table(cfg: TableConfig, data_dir: str | Path | None) -> tuple[np.ndarray, ...]:
    """The table's arrays (``TABLE_ARRAYS``), from the cache or decoded once."""
    if cfg.file is None:
        raise DataError("data.dataset = 'client_table' needs table.file: a .csv or .parquet "
                        "table of images with label and client columns (docs/data.md)")
    paths = [_locate(cfg.file, data_dir, "the table")]
    if cfg.test_file is not None:
        paths.append(_locate(cfg.test_file, data_dir, "the test table"))
    if cfg.split_column is not None and cfg.test_file is not None:
        raise DataError("give the split either as table.split_column or as table.test_file, "
                        "not both")
    tables: list[_Rows] = []

    where = " and ".join(str(p.resolve()) for p in paths)

    def decode() -> tuple[np.ndarray, ...]:
        rows = tables or [read_rows(p, cfg) for p in paths]
        arrays = _decode(rows, cfg)
        _check_given_split(arrays, where)  # before the cache keeps a table that fails it
        return arrays

    # the cache is keyed by the tables and the image files they name, so an edited table or a
    # replaced image rebuilds it; a missing image is the decoder's to report, by row
    tables.extend(read_rows(p, cfg) for p in paths)
    sources = paths + [p for t in tables for p in _image_paths(t, cfg)]
    digest = hashlib.sha256(json.dumps(_settings(cfg), sort_keys=True).encode()).hexdigest()
    arrays = cached_arrays(f"table-{paths[0].stem}-{digest[:12]}", sources,
                           [paths[0].parent], decode, TABLE_ARRAYS, _settings(cfg))
    _check_given_split(arrays, where)
    return arrays


def _check_given_split(arrays: tuple[np.ndarray, ...], where: str) -> None:
    """``_check_split`` for a table with a given split (a split column or a test table)."""
    _, _, owners, splits, _, client_names = arrays
    if (splits != 0).any():
        _check_split(splits, owners, client_names, where)


def load_table(name: str, cfg: TableConfig, split: Split,
               data_dir: str | Path | None = None) -> ImageDataset:
    """One split of a client table (``data.dataset = "client_table"``, or ``ham10000`` with
    its columns): the images of the clients on that side.

    Raises:
        DataError: a missing file or column, an empty or bad value, an unreadable image, a
            client on both sides of the table's split (each named with file, row and
            column).
    """
    if name == HAM10000:
        cfg = ham10000_table(cfg)
        try:
            _locate(cfg.file, data_dir, "HAM10000's metadata")
        except DataError as e:
            raise DataError(f"{e}. HAM10000 is not downloaded automatically: get it from "
                            f"{HAM10000_SOURCE}, and put them in one folder (data.data_dir, "
                            f"--data-dir or $DCCO_DATA)") from None
    images, labels, owners, splits, class_names, client_names = decoded_table(cfg, data_dir)
    if (splits != 0).any():  # checked by decoded_table
        side = splits == SPLITS[split]
    else:
        test_clients = client_split(client_names, cfg.test_fraction, cfg.split_seed)
        side = test_clients[owners] == (split == "test")
    rows = np.flatnonzero(side)
    return ImageDataset(name, torch.from_numpy(np.ascontiguousarray(images[rows])),
                        torch.from_numpy(np.asarray(labels[rows], np.int64)),
                        len(class_names), tuple(str(n) for n in class_names),
                        torch.from_numpy(np.asarray(owners[rows], np.int64)),
                        tuple(str(n) for n in client_names))


def split_record(name: str, cfg: TableConfig, train: ImageDataset, test: ImageDataset) -> dict:
    """How a table was split, for the run directory (``split.json``): the rule, and the
    clients and images on each side."""
    if name == HAM10000:
        cfg = ham10000_table(cfg)
    given = cfg.split_column is not None or cfg.test_file is not None
    sides = {}
    for side, data in (("train", train), ("test", test)):
        clients = sorted({data.client_names[c] for c in data.clients.unique().tolist()})
        sides[side] = {"images": len(data), "clients": len(clients)}
        if side == "test":
            sides[side]["client_ids"] = clients
    rule = ({"rule": "given", "split_column": cfg.split_column, "test_file": cfg.test_file}
            if given else {"rule": "seeded by client", "test_fraction": cfg.test_fraction,
                           "split_seed": cfg.split_seed})
    return {"table": cfg.file, "client_column": cfg.client_column, **rule, **sides}


__all__ = ["HAM10000", "TABLE_ARRAYS", "client_split", "decode_image",
           "ham10000_table", "load_table", "split_record"]
