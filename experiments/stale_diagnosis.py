"""Why stale DCCO diverges under LARS: the norms of the 1-D parameters, round by round.

Runs the Table 1 small recipe's stale DCCO (experiments/stale_fmnist.toml, scale
small-stale: non-IID 4, LARS lr 1.5) for ``--rounds`` rounds, twice:

- ``lars``: as configured, LARS leaving the 1-D parameters (biases, group-norm gains and
  shifts) out of its trust ratio, so they step by the server lr itself;
- ``lars-1d-adapted``: the same with every parameter group adapted by the trust ratio.

and records each round's loss and the three largest 1-D parameter norms.

    python experiments/stale_diagnosis.py --rounds 25 \\
        --out experiments/results/stale_diagnosis.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from pathlib import Path

import torch
from grid_cells import cell_config

from dcco.run.pretraining import Pretraining
from dcco.run.rundir import code_version, cpu_name
from dcco.run.splits import load_splits

GRID = Path(__file__).resolve().parent / "stale_fmnist.toml"


def run(cfg, train, rounds: int, adapt_1d: bool) -> list[dict]:
    pt = Pretraining.of(cfg, train)
    if adapt_1d:  # LARS's trust ratio for the 1-D parameters' group too
        for group in pt.optimizer.param_groups:
            group["exclude"] = False
    rows = []
    for _ in range(rounds):
        m = pt.step()
        norms = sorted(((float(p.detach().norm()), n) for n, p in pt.model.named_parameters()
                        if p.ndim <= 1), reverse=True)[:3]
        rows.append({"round": m.round, "loss": float(m.loss),
                     "largest_1d_norms": [[n, v] for v, n in norms]})
        print(f"{'adapted' if adapt_1d else 'lars'} round {m.round}: loss {float(m.loss):.2f}, "
              f"largest 1-D norm {norms[0][0]:.3g} ({norms[0][1]})", flush=True)
        if not math.isfinite(float(m.loss)):
            break
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = cell_config(GRID, "small-stale", "non-iid-4-dcco-s0", args.data_dir)
    train, _ = load_splits(cfg)
    record = {"command": "python experiments/stale_diagnosis.py --rounds "
                         f"{args.rounds} --out {args.out}",
              "machine": f"{cpu_name()}, {platform.system()}", "code": code_version(),
              "cell": "stale_fmnist.toml small-stale non-iid-4-dcco-s0",
              "lars": run(cfg, train, args.rounds, adapt_1d=False),
              "lars_1d_adapted": run(cfg, train, args.rounds, adapt_1d=True)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"record: {args.out}")


if __name__ == "__main__":
    main()
