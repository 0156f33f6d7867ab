"""How far one cell's training moves with the number of CPU threads alone (docs/results/reruns.md).

Runs the first ``--rounds`` rounds of the local-steps grid's E = 1 cell at n = 16, seed 0
(experiments/local_steps_fmnist.toml, scale curve-e1), once per thread count, each in its own
process with ``OMP_NUM_THREADS`` set, and records every round's loss: the same config and seed,
only the order of floating-point sums differs.

    python experiments/thread_chaos.py --out experiments/results/thread_chaos.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from dcco.run.rundir import code_version, cpu_name

GRID = Path(__file__).resolve().parent / "local_steps_fmnist.toml"
CELL = ("curve-e1", "non-iid-16-dcco-s0")


def losses(rounds: int, data_dir: str) -> list[float]:
    """This process's losses (its thread count is whatever OMP_NUM_THREADS says)."""
    from grid_cells import cell_config

    from dcco.run.pretraining import Pretraining
    from dcco.run.splits import load_splits

    cfg = cell_config(GRID, *CELL, data_dir)
    train, _ = load_splits(cfg)
    pt = Pretraining.of(cfg, train)
    return [float(pt.step().loss) for _ in range(rounds)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(losses(args.rounds, args.data_dir)))
        return
    runs = {}
    for threads in args.threads:
        done = subprocess.run(
            [sys.executable, __file__, "--child", "--rounds", str(args.rounds),
             "--data-dir", args.data_dir], capture_output=True, text=True, check=True,
            env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        runs[str(threads)] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{threads} thread(s): " + ", ".join(f"{x:.3f}" for x in runs[str(threads)]),
              flush=True)
    record = {"command": "python experiments/thread_chaos.py " + " ".join(sys.argv[1:]),
              "machine": f"{cpu_name()}, {platform.system()}", "code": code_version(),
              "cell": f"local_steps_fmnist.toml {CELL[0]} {CELL[1]}",
              "loss_by_threads": runs}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {args.out}")


if __name__ == "__main__":
    main()
