"""Do DCCO's clients cancel because its loss is centred? The per-client gradient sums of the CCO
loss (centred) and of FedSC's spectral loss (uncentred), side by side.

For non-IID 4 and 16, trains the seed-0 cell of ``dcco`` (experiments/table1_claims_fmnist.toml,
scale small: the `small` recipe) and of ``fedsc`` (experiments/fedsc_fmnist.toml: the same
recipe with encodings clipped to norm 2), and at each of ``--rounds`` measures, on that
round's clients:

- ``encoding_coherence``: per client ‖Σ_{n∈k} ∂L/∂z_n‖ / Σ_{n∈k} ‖∂L/∂z_n‖
  (``experiments/diagnostics.py``), its median over the clients, and over the whole round (0 exactly
  for a centred loss);
- ``pooled_over_client``: the norm of the round's pooled parameter gradient over the clients'
  mean gradient norm (the measure of experiments/local_steps_diagnosis.py): 1 if the clients
  agree, about 1/sqrt(K) for unrelated directions, below that where they cancel.

    python experiments/gradient_sums.py --out experiments/results/gradient_sums.json
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
from diagnostics import encoding_gradient_sums  # experiments/diagnostics.py, beside this script
from grid_cells import cell_config

from dcco.core.client import client_update, trainable_parameters
from dcco.core.simulator import run_round
from dcco.run.planning import plan_round
from dcco.run.pretraining import Pretraining
from dcco.run.rundir import code_version, cpu_name
from dcco.run.splits import load_splits

HERE = Path(__file__).resolve().parent
GRIDS = {"dcco": HERE / "table1_claims_fmnist.toml", "fedsc": HERE / "fedsc_fmnist.toml"}
SETTINGS = ("non-iid-4", "non-iid-16")


def flat(values) -> torch.Tensor:
    return torch.cat([v.flatten() for v in values])


def measure(pt: Pretraining, r: int) -> dict[str, float]:
    """The two ratios on round ``r``'s clients at the current model."""
    plan = plan_round(pt.cfg, pt.partition, r)
    x1, x2 = pt.views(plan, r)
    with torch.no_grad():
        f, g = pt.model(x1, x2)
    sums = encoding_gradient_sums(pt.algorithm.method, f, g, plan.segments)
    one = run_round(pt.model, pt.algorithm, x1, x2, plan.segments, "reference")
    sizes = plan.segments.counts.tolist()
    clients = [client_update(pt.model, pt.algorithm.method, a, b, one.shared, 1.0).delta
               for a, b in zip(x1.split(sizes), x2.split(sizes), strict=True)]
    mean_client = sum(float(flat(c.values()).norm()) for c in clients) / len(clients)
    names = [n for n, _ in trainable_parameters(pt.model)]
    pooled = float(flat(one.pseudo_gradient[n] for n in names).norm())
    return {"clients": len(clients),
            "encoding_coherence_median": float(sums.coherence.median()),
            "encoding_coherence_round": sums.round_coherence,
            "pooled_over_client": pooled / mean_client,
            "unrelated_directions": len(clients) ** -0.5}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, nargs="+", default=[0, 30])
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows = []
    for setting in SETTINGS:
        for method, grid in GRIDS.items():
            cfg = cell_config(grid, "small", f"{setting}-{method}-s0", args.data_dir)
            train, _ = load_splits(cfg)
            torch.manual_seed(0)
            pt = Pretraining.of(cfg, train)
            for r in range(max(args.rounds) + 1):
                if r in args.rounds:
                    row = {"setting": setting, "method": method, "round": r} | measure(pt, r)
                    rows.append(row)
                    print(f"{setting:11s} {method:6s} round {r:4d}: encoding coherence "
                          f"median {row['encoding_coherence_median']:.3f}, round "
                          f"{row['encoding_coherence_round']:.2e}; pooled / client "
                          f"{row['pooled_over_client']:.4f} (unrelated "
                          f"{row['unrelated_directions']:.3f})", flush=True)
                pt.step()
    command = (f"python experiments/gradient_sums.py --rounds {' '.join(map(str, args.rounds))}"
               f" --out {args.out}")
    record = {"command": command, "machine": f"{cpu_name()}, {platform.system()}",
              "code": code_version(),
              "cells": {m: f"{g.name} small, seed 0" for m, g in GRIDS.items()},
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"record: {args.out}")


if __name__ == "__main__":
    main()
