"""Generated data in the real formats of naturally partitioned data sets: HAM10000 (its
metadata CSV and JPEG folders), Hugging Face Parquet tables, and TFF's h5 client files.
Classes carry distinct colour patterns, so a small encoder can learn them."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np

HAM_CLASSES = ("akiec", "bcc", "bkl", "df", "mel", "nv", "vasc")
HAM_COLUMNS = ("lesion_id", "image_id", "dx", "dx_type", "age", "sex", "localization",
               "dataset")
HAM_SIZES = {1: 5514, 2: 1423, 3: 490, 4: 34, 5: 5, 6: 4}
"""Lesions of HAM10000 holding 1 to 6 images (the real histogram)."""


def ham_histogram(lesions: int) -> dict[int, int]:
    """HAM10000's lesion-size histogram scaled to about ``lesions`` lesions, every size kept."""
    total = sum(HAM_SIZES.values())
    return {k: max(1, round(lesions * v / total)) for k, v in HAM_SIZES.items()}


def _image(rng: np.random.Generator, label: int, shape=(18, 24)) -> np.ndarray:
    """An RGB image (H, W, 3) of class ``label``: a class colour plus noise."""
    base = np.array([(40 * label) % 256, (90 + 50 * label) % 256, (200 - 25 * label) % 256])
    noise = rng.integers(0, 60, size=(*shape, 3))
    return np.clip(base + noise - 30, 0, 255).astype(np.uint8)


def jpeg_bytes(array: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def make_ham10000(folder: Path, lesions: int = 120, seed: int = 0) -> Path:
    """A HAM10000-format folder: ``HAM10000_metadata.csv`` and JPEGs split over
    ``HAM10000_images_part_1`` and ``_2``, lesions of 1–6 images in the real proportions, each
    lesion one diagnosis."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    parts = [folder / "HAM10000_images_part_1", folder / "HAM10000_images_part_2"]
    for p in parts:
        p.mkdir(exist_ok=True)
    rows, image = [], 24300
    lesion = 0
    for size, count in ham_histogram(lesions).items():
        for _ in range(count):
            dx = int(rng.integers(0, len(HAM_CLASSES)))
            for _ in range(size):
                name = f"ISIC_{image:07d}"
                (parts[image % 2] / f"{name}.jpg").write_bytes(jpeg_bytes(_image(rng, dx)))
                rows.append({"lesion_id": f"HAM_{lesion:07d}", "image_id": name,
                             "dx": HAM_CLASSES[dx], "dx_type": "histo", "age": "50.0",
                             "sex": "male", "localization": "back", "dataset": "vidir_modern"})
                image += 1
            lesion += 1
    rng.shuffle(rows)
    with open(folder / "HAM10000_metadata.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=HAM_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return folder


def make_parquet(path: Path, rows: int = 60, clients: int = 15, hf_metadata: bool = True,
                 embed: bool = True, seed: int = 0) -> Path:
    """A Parquet table in the Hugging Face layout: ``image`` a struct{bytes, path} (or, with
    ``embed=False``, the path alone, the files beside the table), ``label`` integers with the
    ClassLabel names in the ``huggingface`` schema metadata (or, without it, names as
    strings), ``patient`` the client column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = ["benign", "malignant", "other"]
    images, labels, patients = [], [], []
    for i in range(rows):
        client = i % clients
        label = client % len(names)
        data = jpeg_bytes(_image(rng, label))
        if embed:
            images.append({"bytes": data, "path": f"img_{i}.jpg"})
        else:
            (path.parent / f"img_{i}.jpg").write_bytes(data)
            images.append(f"img_{i}.jpg")
        labels.append(label if hf_metadata else names[label])
        patients.append(f"patient-{client:03d}")
    table = pa.table({"image": images, "label": labels, "patient": patients})
    if hf_metadata:
        features = {"image": {"_type": "Image"},
                    "label": {"names": names, "_type": "ClassLabel"},
                    "patient": {"dtype": "string", "_type": "Value"}}
        meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
        table = table.replace_schema_metadata(meta)
    pq.write_table(table, path)
    return path


def make_tff(folder: Path, name: str, split: str, clients: int = 6, per_client: int = 5,
             seed: int = 0) -> Path:
    """A TFF client file ``<name>_<split>.h5``: ``examples/<client>/image`` uint8
    (n, 32, 32, 3) and ``label`` (fed_cifar100), or ``pixels`` float32 (n, 28, 28) in [0, 1]
    and ``label`` (fed_emnist)."""
    import h5py

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}_{split}.h5"
    with h5py.File(path, "w") as f:
        group = f.create_group("examples")
        for c in range(clients):
            g = group.create_group(f"{'f' if name == 'fed_emnist' else ''}{c:04d}_{split}")
            labels = rng.integers(0, 10, size=per_client)
            if name == "fed_cifar100":
                g["image"] = rng.integers(0, 256, size=(per_client, 32, 32, 3), dtype=np.uint8)
                g["coarse_label"] = labels // 5
            else:
                g["pixels"] = rng.random((per_client, 28, 28), dtype=np.float32)
            g["label"] = labels.astype(np.int64 if name == "fed_cifar100" else np.int32)
    return path
