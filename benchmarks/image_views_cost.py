"""What ``dcco.ImageViews`` costs against the same augmentation composed of kornia's modules
(what ``ImageViews`` ran before it took dcco's batched pipeline): two views of a batch of
uint8 RGB images, CPU seconds, the median of ``--repeats`` (one thread unless OMP says).

    OMP_NUM_THREADS=1 python benchmarks/image_views_cost.py \\
        --record benchmarks/results/image_views_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def kornia_views():
    """ImageViews' defaults for RGB, composed of kornia's modules: a crop of 0.2-1 of the
    area, a flip, colour jitter (0.4, 0.4, 0.4, hue 0.1) with p 0.8, grayscale with p 0.2."""
    import kornia.augmentation as K
    import torch

    steps = torch.nn.Sequential(K.RandomResizedCrop((32, 32), scale=(0.2, 1.0)),
                                K.RandomHorizontalFlip(), K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=0.8),
                                K.RandomGrayscale(p=0.2))
    return lambda x: steps(x.float() / 255).clamp(0, 1) * 2 - 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=1600)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--record", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch

    from dcco.data.image_views import ImageViews
    from dcco.run.rundir import code_version, cpu_name

    x = torch.randint(0, 256, (args.images, 3, 32, 32), dtype=torch.uint8,
                      generator=torch.Generator().manual_seed(0))
    seconds = {}
    for name, views in (("kornia modules", kornia_views()), ("dcco.ImageViews", ImageViews())):
        views(x[:8])
        times = []
        for _ in range(args.repeats):
            start = time.process_time()
            views(x)
            views(x)
            times.append(time.process_time() - start)
        seconds[name] = statistics.median(times)
        print(f"{name}: two views of {args.images} RGB 32 x 32 images, "
              f"{seconds[name]:.3f} CPU s", flush=True)
    ratio = seconds["kornia modules"] / seconds["dcco.ImageViews"]
    print(f"kornia / ImageViews: {ratio:.1f} x")
    if args.record is not None:
        args.record.write_text(json.dumps({
            "command": "OMP_NUM_THREADS=1 python benchmarks/image_views_cost.py "
                       + " ".join(sys.argv[1:] if argv is None else argv),
            "images": args.images, "cpu_seconds": seconds, "ratio": ratio,
            "machine": {"cpu": cpu_name(), **{k: v for k, v in code_version().items()
                                              if k in ("torch", "threads", "git_commit")}}},
            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
