"""How fast a recipe's runs part when only the floating-point order changes: a short screen
of candidate recipes for issue 42 (docs/results/reruns.md).

Runs the first ``--rounds`` rounds of one cell of the Table 1 grid's ``small`` scale (by
default non-IID 4 DCCO, seed 0) once per thread count, each in its own process with
``OMP_NUM_THREADS`` set, for each candidate (a name and ``section.key=value`` overrides of
the cell's config), and records every ``--every`` rounds the relative distance between the
runs' weights, ‖w₁ − w₂‖ / ‖w₁‖, and their losses. Same config, same seed: only the order
of the sums differs, so the distance is rounding amplified by the training dynamics.

    python experiments/recipe_chaos.py --rounds 60 \\
        --out experiments/results/recipe_chaos.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from dcco.run.rundir import code_version, cpu_name

GRID = Path(__file__).resolve().parent / "table1_fmnist.toml"
CANDIDATES = {
    "current": [],
    "vector-lr-0.024": ["optim.vector_lr_scale=0.024"],
    "lr-0.75-warmup-30": ["optim.lr=0.75", "optim.warmup_rounds=30"],
    "vector-lr-0.024-warmup-30": ["optim.vector_lr_scale=0.024", "optim.warmup_rounds=30"],
}


def child(cell: str, overrides: list[str], rounds: int, every: int, data_dir: str,
          out: Path) -> None:
    """Train this process's run (its thread count is whatever OMP_NUM_THREADS says) and save
    its flat weights every ``every`` rounds, with its losses."""
    from dataclasses import replace

    import torch
    from grid_cells import cell_config

    from dcco.config import load_config, to_toml
    from dcco.run.pretraining import Pretraining
    from dcco.run.splits import load_splits

    cfg = cell_config(GRID, "small", cell, data_dir)
    if overrides:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "cell.toml"
            path.write_text(to_toml(cfg))
            cfg = load_config(path, overrides)
    cfg = replace(cfg, train=replace(cfg.train, rounds=max(rounds, cfg.train.rounds)))
    train, _ = load_splits(cfg)
    run = Pretraining.of(cfg, train)
    snapshots, losses = {}, []
    for r in range(1, rounds + 1):
        losses.append(float(run.step().loss))
        if r % every == 0:
            snapshots[str(r)] = torch.cat([p.detach().double().flatten()
                                           for _, p in run.params])
    torch.save({"weights": snapshots, "losses": losses}, out)


def distances(a: dict, b: dict) -> dict[str, float]:
    return {r: float((a[r] - b[r]).norm() / a[r].norm()) for r in a}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--threads", type=int, nargs=2, default=[1, 2])
    ap.add_argument("--cell", default="non-iid-4-dcco-s0")
    ap.add_argument("--candidates", nargs="+", default=list(CANDIDATES),
                    choices=list(CANDIDATES))
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        out, *overrides = args.child
        child(args.cell, overrides, args.rounds, args.every, args.data_dir, Path(out))
        return
    import torch

    record = {"command": "python experiments/recipe_chaos.py " + " ".join(sys.argv[1:]),
              "machine": f"{cpu_name()}, {platform.system()}", "code": code_version(),
              "cell": f"table1_fmnist.toml small {args.cell}", "threads": args.threads,
              "candidates": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.candidates:
            runs = []
            for threads in args.threads:
                path = Path(tmp) / f"{name}-{threads}.pt"
                subprocess.run(
                    [sys.executable, __file__, "--rounds", str(args.rounds), "--every",
                     str(args.every), "--cell", args.cell, "--data-dir", args.data_dir,
                     "--child", str(path), *CANDIDATES[name]],
                    check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
                runs.append(torch.load(path))
            d = distances(runs[0]["weights"], runs[1]["weights"])
            record["candidates"][name] = {
                "overrides": CANDIDATES[name], "weight_distance": d,
                "losses": {str(t): r["losses"] for t, r in zip(args.threads, runs)}}
            print(f"{name:28s} " + "  ".join(f"r{r}: {x:.2e}" for r, x in d.items()),
                  flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {args.out}")


if __name__ == "__main__":
    main()
