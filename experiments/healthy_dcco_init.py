"""The health figures of the healthy-DCCO study's network at initialisation (issue 97;
docs/results/healthy-dcco.md): the collapse figures of round 1's pooled batch, encoded by the
untrained model of a cell of experiments/healthy_dcco.toml, before any server step. They say
where the encodings' scale starts, against which each recipe's rounds are read.

    python experiments/healthy_dcco_init.py --cell non-iid-4-dcco-r1-s0
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dcco.core.collapse import collapse_figures
from dcco.core.stats import encoding_stats
from dcco.reproduce import load_grid, plan_cells
from dcco.run.planning import plan_round
from dcco.run.pretraining import Pretraining
from dcco.run.splits import load_splits

GRID = Path(__file__).resolve().parent / "healthy_dcco.toml"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cell", default="non-iid-4-dcco-r1-s0", help="a cell's folder name")
    args = ap.parse_args(argv)
    cells = {c.path.name: c for c in plan_cells(load_grid(GRID, "study"), Path("unused"))}
    if args.cell not in cells:
        raise SystemExit(f"{args.cell} is not a cell of {GRID.name}")
    cfg = cells[args.cell].cfg
    pt = Pretraining.of(cfg, load_splits(cfg)[0], rounds_to_run=1)
    x1, x2 = pt.views(plan_round(pt.cfg, pt.partition, 0), 0)
    with torch.no_grad():
        f, g = pt.model(x1, x2)
    eps = pt.method.variance_eps()
    figures = {k: float(v) for k, v in collapse_figures(
        encoding_stats(f.double(), g.double()).moments(), eps=eps).items()}
    print(f"{args.cell} at initialisation, round 1's {x1.shape[0]} images: C_ii "
          f"{figures['corr_diag']:.2f}, median variance {figures['median_var'] / eps:.3g} ε, "
          f"largest {figures['max_var'] / eps:.3g} ε, effective rank {figures['eff_rank']:.1f} "
          f"(ε = {eps:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
