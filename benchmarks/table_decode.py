"""What a client table costs to decode once, and to load from its cache afterwards.

Writes a HAM10000-format folder of ``--images`` JPEGs at HAM10000's size (600×450, quality 90,
lesions of 1–6 images in the real proportions) into ``--work``, then, in one run:

1. the first load of the training split: every JPEG read, decoded and resized to
   ``--size`` (Pillow), the cache written (images per second);
2. ``--repeats`` later loads from the verified cache (median seconds), and their ratio.

    python benchmarks/table_decode.py --images 2000 --size 224 --out benchmarks/results/table_decode.json

The numbers are this machine's; the command and machine go into the record.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SIZES = {1: 5514, 2: 1423, 3: 490, 4: 34, 5: 5, 6: 4}


def write_ham(folder: Path, images: int, seed: int = 0) -> None:
    """``images`` JPEGs of 600×450 (smooth colour fields and noise, JPEG-compressible as
    photographs are) in HAM10000's layout and lesion histogram."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    parts = [folder / "HAM10000_images_part_1", folder / "HAM10000_images_part_2"]
    for p in parts:
        p.mkdir(parents=True, exist_ok=True)
    sizes = [k for k, v in SIZES.items() for _ in range(v)]
    rows, i, lesion = [], 0, 0
    yy, xx = np.mgrid[0:450, 0:600]
    while i < images:
        size = min(int(rng.choice(sizes)), images - i)
        dx = ["akiec", "bcc", "bkl", "df", "mel", "nv", "vasc"][lesion % 7]
        for _ in range(size):
            base = np.stack([128 + 100 * np.sin(xx / (40 + c * 7) + lesion + c) * np.cos(
                yy / (55 + c * 5)) for c in range(3)], axis=-1)
            image = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
            buf = io.BytesIO()
            Image.fromarray(image).save(buf, format="JPEG", quality=90)
            name = f"ISIC_{i:07d}"
            (parts[i % 2] / f"{name}.jpg").write_bytes(buf.getvalue())
            rows.append({"lesion_id": f"HAM_{lesion:07d}", "image_id": name, "dx": dx})
            i += 1
        lesion += 1
    with open(folder / "HAM10000_metadata.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["lesion_id", "image_id", "dx"])
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--size", type=int, default=224, help="the decoded images' side")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--work", type=Path, default=None, help="default: a temporary folder")
    ap.add_argument("--out", type=Path, default=None, help="write the record (JSON) here")
    args = ap.parse_args(argv)

    import torch

    from dcco.config import TableConfig
    from dcco.data import load_split
    from dcco.run.rundir import code_version

    work = args.work or Path(tempfile.mkdtemp(prefix="table-decode-"))
    folder = work / "HAM10000"
    if folder.exists():
        shutil.rmtree(folder)
    start = time.perf_counter()
    write_ham(folder, args.images)
    print(f"wrote {args.images} JPEGs of 600×450 in {time.perf_counter() - start:.0f} s")
    cfg = TableConfig(image_size=(args.size, args.size))
    start = time.perf_counter()
    train = load_split("ham10000", "train", folder, table=cfg)
    first = time.perf_counter() - start
    loads = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        again = load_split("ham10000", "train", folder, table=cfg)
        loads.append(time.perf_counter() - start)
    assert torch.equal(train.images, again.images)
    cached = statistics.median(loads)
    info = code_version()
    record = {
        "command": "python benchmarks/table_decode.py " + shlex.join(
                sys.argv[1:] if argv is None else argv),
        "machine": {"cpu": info["cpu"], "torch": info["torch"], "python": info["python"],
                    "platform": platform.platform(), "threads": torch.get_num_threads()},
        "images": args.images, "jpeg": "600x450, quality 90", "decoded_size": args.size,
        "first_load_s": round(first, 3), "images_per_s_first": round(args.images / first, 1),
        "cached_load_s": round(cached, 4), "repeats": args.repeats,
        "speedup": round(first / cached, 1), "train_images": len(train),
    }
    print(json.dumps(record, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
