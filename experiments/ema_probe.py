"""Does a moving average of the weights steady the probe? A pilot for issue 42's recipe.

Trains one cell of ``experiments/reruns_fmnist.toml`` (a scale and a cell name) in this
process, keeping exponential moving averages of the model's parameters for each
``--decays`` value beside the live weights, then takes the cell's linear probe (5,000
labels) of the live weights and of every average. Run it at two thread counts
(``OMP_NUM_THREADS``): if the averages' probes agree more closely than the live ones, a
moving average of the evaluated encoder is worth a place in the recipe.

    OMP_NUM_THREADS=1 python experiments/ema_probe.py --scale current \\
        --out experiments/results/ema_probe/current-dcco-t1.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

from dcco.run.rundir import code_version

GRID = Path(__file__).resolve().parent / "reruns_fmnist.toml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", default="current")
    ap.add_argument("--cell", default="non-iid-4-dcco-s0")
    ap.add_argument("--decays", type=float, nargs="+", default=[0.9, 0.97, 0.99])
    ap.add_argument("--rounds", type=int, help="fewer rounds than the cell's (a smoke test)")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from grid_cells import cell_config

    from dcco.evaluate import labelled_subset, linear_probe
    from dcco.run.evaluations import eval_config_for
    from dcco.run.pretraining import Pretraining
    from dcco.run.splits import load_splits

    cfg = cell_config(GRID, args.scale, args.cell, args.data_dir)
    if args.rounds is not None:
        from dataclasses import replace

        cfg = replace(cfg, train=replace(cfg.train, rounds=args.rounds))
    train, test = load_splits(cfg)
    run = Pretraining.of(cfg, train)
    averages = {d: copy.deepcopy(run.model) for d in args.decays}
    start = time.perf_counter()
    losses = []
    while not run.finished:
        losses.append(float(run.step().loss))
        with torch.no_grad():
            live = dict(run.model.named_parameters())
            for d, avg in averages.items():
                for name, p in avg.named_parameters():
                    p.mul_(d).add_(live[name], alpha=1 - d)
    seconds = time.perf_counter() - start
    ecfg = eval_config_for(cfg, 5000)
    ids = labelled_subset(train.labels, ecfg.labels, train.num_classes, cfg.train.seed)
    probes = {}
    for name, model in [("live", run.model)] + [(f"ema {d}", m) for d, m in averages.items()]:
        result = linear_probe(model, train, test, ids, ecfg, cfg.train.seed, run.device)
        probes[name] = result.accuracy
        print(f"{name}: {100 * result.accuracy:.2f}%", flush=True)
    record = {"command": "python experiments/ema_probe.py " + " ".join(sys.argv[1:]),
              "threads": torch.get_num_threads(), "code": code_version(),
              "cell": f"reruns_fmnist.toml {args.scale} {args.cell}",
              "pretrain_seconds": seconds, "final_loss": losses[-1],
              "losses_every_10": losses[9::10], "linear@5000": probes}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
