"""The privacy–utility table of docs/results/privacy.md, from the committed cells.

For DCCO and contrastive FedAvg at non-IID 4 (the Table 1 grid's small scale), the linear
probe's accuracy (5,000 labels; mean ± std over the seeds found) at ε = ∞ (the Table 1 grid's
own cells, no DP) and at the ε of each ``privacy_fmnist`` scale, with the noise multiplier σ
that the run solved for and the ε it reports.

    python experiments/privacy_table.py                 # --random-init: also the floor

``--random-init`` adds the linear probe of a randomly initialised encoder (the floor any
pretraining must beat), computed once per seed with the cell's evaluation and kept in
``results/random_init-small``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("dcco", "contrastive_fedavg")
SCALES = (("∞ (no DP)", "table1_fmnist-small"), ("8", "privacy_fmnist-small-eps8"),
          ("4", "privacy_fmnist-small-eps4"), ("1", "privacy_fmnist-small-eps1"))


def cells(folder: str, method: str) -> list[dict]:
    out = []
    for seed in range(3):
        path = RESULTS / folder / f"non-iid-4-{method}-s{seed}" / "summary.json"
        if path.is_file():
            summary = json.loads(path.read_text())
            if "linear@5000" in summary.get("evaluations", {}):
                out.append(summary)
    return out


def random_init_rows(grid_file: str = "table1_fmnist.toml", scale: str = "small",
                     cell_name: str = "non-iid-4-dcco", folder: str = "random_init-small"
                     ) -> list[float]:
    """Linear-probe accuracies (%) of random encoders, seeds 0-2, computed once and kept in
    ``results/<folder>``: the encoder of ``cell_name``'s config in ``grid_file`` at ``scale``,
    untrained."""
    from dcco.reproduce import load_grid, plan_cells, select_cells
    from dcco.run.evaluations import random_encoder_run
    from dcco.run.rundir import RunDir
    from dcco.run.splits import load_splits

    grid = load_grid(RESULTS.parent / grid_file, scale)
    out = RESULTS / folder
    accs, splits = [], None
    for seed in range(3):
        (cell,) = select_cells(plan_cells(grid, out), [f"{cell_name}-s{seed}"])
        path = out / f"s{seed}"
        summary = path / "summary.json"
        if not summary.is_file():
            splits = splits or load_splits(cell.cfg)
            run, _ = RunDir.open_or_create(path, cell.cfg)
            random_encoder_run(cell.cfg, run, 5000, splits)
        accs.append(100 * json.loads(summary.read_text())["evaluations"]["linear@5000"]
                    ["accuracy"])
    return accs


def main() -> None:
    import sys

    print("| method | ε (δ = 1e-5) | σ | ε reported | seeds | linear probe, 5,000 labels |")
    print("|---|---|---:|---:|---:|---:|")
    if "--random-init" in sys.argv[1:]:
        acc = random_init_rows()
        print(f"| random encoder (no pretraining) | | | | {len(acc)} | "
              f"{statistics.mean(acc):.1f} ± {statistics.stdev(acc):.1f} |")
    for method in METHODS:
        for label, folder in SCALES:
            found = cells(folder, method)
            if not found:
                print(f"| {method} | {label} | | | 0 | not run |")
                continue
            acc = [100 * s["evaluations"]["linear@5000"]["accuracy"] for s in found]
            mean = statistics.mean(acc)
            std = statistics.stdev(acc) if len(acc) > 1 else 0.0
            privacy = found[0].get("privacy")
            sigma = f"{privacy['noise_multiplier']:.3g}" if privacy else "0"
            eps = (f"{max(s['privacy']['epsilon'] for s in found):.3g}" if privacy else "∞")
            print(f"| {method} | {label} | {sigma} | {eps} | {len(acc)} | "
                  f"{mean:.1f} ± {std:.1f} |")


if __name__ == "__main__":
    main()
