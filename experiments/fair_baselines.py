"""The floors of the fair fight's final table (docs/results/fair-fight.md): the raw pixels
and the untrained encoders, probed exactly as the final cells are.

For each seed of ``experiments/fair_fmnist_final.toml`` (scale ``final``), this probes

- ``raw pixels``: the photos' 784 pixels, flattened, through the linear probe;
- ``untrained (gn)`` and ``untrained (bn)``: the network of the final cells, with group norm
  and with batch norm, at the weights it starts from at that seed (``build_model`` seeds the
  initialisation from ``train.seed``, so a trained cell of seed s starts from exactly this
  encoder: the comparison pairs by seed).

The probe is the final cells' ``linear@5000``: the same 5,000 labelled training photos
(``labelled_subset`` at the seed), the same 300 LARS steps, scored on the 10,000 test photos.
The record holds the command, the machine and the code's commit and source hash. The
committed record ran with the final cells' code, from their worktree (docs/results/fair-fight.md):

    PYTHONPATH=/work/fair-final/src python experiments/fair_baselines.py \
        --out experiments/results/fair_fmnist-final/baselines.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "experiments" / "fair_fmnist_final.toml"
EVALUATION = "linear@5000"
NORMS = {"gn": "dcco", "bn": "byol_fedavg"}
"""A method whose pick runs each normalisation: its cell's config is the untrained encoder's."""


def baselines(seeds: list[int] | None, threads: int) -> dict:
    from dcco.evaluate import labelled_subset, linear_probe
    from dcco.reproduce import load_grid, plan_cells
    from dcco.run.evaluations import eval_config_for, evaluate_model
    from dcco.run.rundir import code_version
    from dcco.run.setup import build_model
    from dcco.run.splits import load_splits

    torch.set_num_threads(threads)
    grid = load_grid(GRID, "final")
    cells = plan_cells(grid, ROOT / "unused")
    labels = int(EVALUATION.split("@")[1])
    device = torch.device("cpu")
    record: dict = {"command": " ".join(["python", *sys.argv]), "evaluation": EVALUATION,
                    "grid": str(GRID.relative_to(ROOT)), "version": code_version(),
                    "seeds": {}}
    splits = None
    for seed in seeds if seeds is not None else list(grid.seeds):
        row = {}
        for norm, method in NORMS.items():
            cell = next(c for c in cells if c.method == method and c.seed == seed)
            cfg = cell.cfg
            if cfg.model.norm != norm:
                raise SystemExit(f"{method}'s pick runs model.norm = {cfg.model.norm!r}, not "
                                 f"{norm!r}: NORMS in {Path(__file__).name} needs another method")
            splits = splits or load_splits(cfg)
            train, test = splits
            ecfg = eval_config_for(cfg, labels)
            if norm == "gn":  # the pixels do not depend on the network
                ids = labelled_subset(train.labels, ecfg.labels, train.num_classes, seed)
                start = time.perf_counter()
                raw = linear_probe(nn.Flatten(), train, test, ids, ecfg, seed, device)
                row["raw pixels"] = {**asdict(raw), "seconds": time.perf_counter() - start}
                print(f"seed {seed}: raw pixels {100 * raw.accuracy:.2f} %", flush=True)
            model = build_model(cfg, *train.input_shapes).to(device)
            result = evaluate_model(model, "linear", ecfg, seed, train, test, device)
            row[f"untrained ({norm})"] = asdict(result)
            print(f"seed {seed}: untrained ({norm}) {100 * result.accuracy:.2f} %", flush=True)
        record["seeds"][str(seed)] = row
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON record to write")
    parser.add_argument("--seeds", type=int, nargs="*", default=None,
                        help="default: the grid's seeds")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    record = baselines(args.seeds, args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
