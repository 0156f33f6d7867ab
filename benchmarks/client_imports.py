"""What a ClientApp process without a node worker imports, split by top-level package:
``python -X importtime -c "import dcco.flower.app.handlers"`` (the ClientApp's handlers; the
ClientApp module itself imports Flower only, and imports them for its first message when
``flower.worker`` is off) in --repeats new processes, each
package's cumulative import time summed over its outermost imports (dcco's own modules: their
self time, as they import torch, flwr and kornia inside them).

    python benchmarks/client_imports.py [--repeats 3] [--out benchmarks/results]

A Flower SuperNode starts a ClientApp process for every message (docs/flower.md), so this is
paid per message. Writes OUT/client_imports.json (every run, and the min and max per part).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

PACKAGES = ("torch", "flwr", "kornia", "numpy")


def one_run() -> dict[str, float]:
    """Seconds per part of one fresh process's import of the client app."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           "import dcco.flower.app.handlers"], capture_output=True, text=True,
                          check=True)
    rows = []  # (self µs, cumulative µs, depth, module)
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, total, name = line[len("import time:"):].split("|")
        depth = (len(name) - len(name.lstrip())) // 2
        rows.append((int(own), int(total), depth, name.strip()))
    parts = {"all": max(t for _, t, _, n in rows if n == "dcco.flower.app.handlers") / 1e6}
    for package in PACKAGES:  # outermost imports of the package only: no double counting
        depths = [d for _, _, d, n in rows if n == package]
        parts[package] = sum(t for _, t, d, n in rows if n == package and d == min(depths)) / 1e6
    parts["dcco_own"] = sum(s for s, _, _, n in rows if n.split(".")[0] == "dcco") / 1e6
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    runs = [one_run() for _ in range(args.repeats)]
    ranges = {k: [min(r[k] for r in runs), max(r[k] for r in runs)] for k in runs[0]}
    for part, (low, high) in ranges.items():
        print(f"{part:9s} {low:.3f}–{high:.3f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"command": "python benchmarks/client_imports.py " + " ".join(sys.argv[1:]),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "runs": runs,
              "seconds_min_max": ranges}
    (args.out / "client_imports.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
