"""Seconds per round of every pretraining cell of a reproduction grid, and what its round budget
would cost: the time to plan a scale (``full`` needs a GPU) before committing a machine to it.

For each pretraining cell of ``--grid`` at ``--scale`` (supervised cells have no rounds), builds
the cell's real ``Pretraining`` (its network, clients, augmentations, method and server
optimiser, on the device the config picks), runs ``--warmup`` rounds, then times ``--rounds``
rounds, and prints the seconds per round, the peak accelerator memory, and the hours the cell's
``train.rounds`` would take at that speed. The total is the pretraining time of the whole grid
(every seed); evaluations and the k-NN monitor come on top.

    python benchmarks/grid_cost.py experiments/table1_fmnist.toml --scale full --rounds 20

Each cell runs as its config says, ``train.precision`` and ``train.compile`` included (``auto``:
bf16 and torch.compile on CUDA, float32 eager on the CPU; ``dcco.core.precision.AUTO``); time
today's path with ``--set train.precision=\"float32\" --set train.compile=\"off\"``. A compiled
cell's warm-up rounds include its compilation.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch

from dcco.config import ConfigError
from dcco.reproduce import SUPERVISED, load_grid, plan_cells, select_cells
from dcco.run.pretraining import Pretraining
from dcco.run.rundir import cpu_name
from dcco.run.splits import load_splits


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("grid", type=Path, help="the grid file, e.g. experiments/table1_fmnist.toml")
    ap.add_argument("--scale", default="full")
    ap.add_argument("--cells", action="append", default=[], metavar="PATTERN",
                    help="only the cells whose name matches (repeatable); default every "
                         "pretraining cell of the first seed")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=20, help="timed rounds per cell")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override every cell's config, as dcco pretrain --set (repeatable)")
    args = ap.parse_args()
    if args.warmup < 0 or args.rounds < 1:
        ap.error("--warmup must be >= 0 and --rounds >= 1")

    try:
        grid = load_grid(args.grid, args.scale, args.set)
        cells = [c for c in plan_cells(grid, Path(tempfile.gettempdir()) / "grid-cost")
                 if c.na is None and c.method != SUPERVISED]
        if args.cells:
            cells = select_cells(cells, args.cells)
    except ConfigError as e:
        ap.error(str(e))
    else:
        cells = [c for c in cells if c.seed == grid.seeds[0]]
    train, _ = load_splits(grid.base)
    which = (f"{len(cells)} chosen cells" if args.cells else
             f"{len(cells)} pretraining cells per seed, {len(grid.seeds)} seed(s)")
    print(f"# {args.grid} --scale {args.scale}: {which}; {args.rounds} timed rounds after "
          f"{args.warmup} warm-up")
    print(f"# {cpu_name()} ({platform.machine()}), "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}; "
          f"torch {torch.__version__}")
    print("| cell | clients × samples | precision, compile | s / round | peak GPU memory (GiB) "
          "| rounds | hours for the rounds |")
    print("|---|---|---|---:|---:|---:|---:|")
    total_hours = 0.0
    for cell in cells:
        pt = Pretraining.of(cell.cfg, train)
        device = pt.device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(args.warmup):
            pt.step()
        _sync(device)
        start = time.perf_counter()
        for _ in range(args.rounds):
            pt.step()
        _sync(device)
        per_round = (time.perf_counter() - start) / args.rounds
        hours = per_round * cell.cfg.train.rounds / 3600
        total_hours += hours
        memory = (f"{torch.cuda.max_memory_allocated(device) / 2**30:.1f}"
                  if device.type == "cuda" else "n/a")
        t, d = cell.cfg.train, cell.cfg.data
        shape = (f"{t.clients_per_round} × {d.samples_per_client}" if pt.method.federated
                 else f"1 × {t.clients_per_round * d.samples_per_client} (pooled)")
        speed = f"{pt.speed.precision}, {pt.speed.compile}"
        print(f"| {cell.path.name} | {shape} | {speed} | {per_round:.4f} | {memory} | "
              f"{t.rounds} | {hours:.1f} |", flush=True)
        del pt
    seeds = 1 if args.cells else len(grid.seeds)
    print(f"\nPretraining, all {len(cells) * seeds} cells: {total_hours * seeds:.1f} hours "
          f"on this machine (evaluations and the k-NN monitor not included).")


if __name__ == "__main__":
    main()
