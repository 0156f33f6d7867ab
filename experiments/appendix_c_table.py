"""The appendix C tables for docs/results/appendix-c.md, from the committed cells of
experiments/appendix_c_fmnist.toml (scales small and small-bn) and the Table 1 grid's DCCO.

    python experiments/appendix_c_table.py

Also computes, once, the floor of each encoder: the linear probe of the untrained group-norm
network (results/random_init-small, as the privacy table's) and of the untrained batch-norm
one (results/random_init-small-bn), seeds 0-2.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from privacy_table import random_init_rows

RESULTS = Path(__file__).resolve().parent / "results"


def accuracies(folder: str, cell: str) -> list[float]:
    """linear@5000 (%) of seeds 0-2 of ``cell`` in ``results/<folder>`` (those finished)."""
    out = []
    for seed in range(3):
        path = RESULTS / folder / f"{cell}-s{seed}" / "summary.json"
        if path.is_file():
            evaluation = json.loads(path.read_text()).get("evaluations", {}).get("linear@5000")
            if evaluation:
                out.append(100 * evaluation["accuracy"])
    return out


def final_losses(folder: str, cell: str) -> list[float]:
    out = []
    for seed in range(3):
        path = RESULTS / folder / f"{cell}-s{seed}" / "summary.json"
        if path.is_file():
            out.append(json.loads(path.read_text())["final_loss"])
    return out


def show(acc: list[float]) -> str:
    if not acc:
        return "not run"
    seeds = ", ".join(f"{a:.1f}" for a in acc)
    spread = f" ± {statistics.stdev(acc):.1f}" if len(acc) > 1 else ""
    return f"{statistics.mean(acc):.1f}{spread} ({seeds})"


def main() -> None:
    gn_floor = random_init_rows()
    bn_floor = random_init_rows("appendix_c_fmnist.toml", "small-bn", "centralized_byol",
                                "random_init-small-bn")
    print("| centralized, 300 steps of 128 | batch norm | group norm + WS |")
    print("|---|---|---|")
    for method, label in (("centralized_byol", "BYOL"), ("centralized_simsiam", "SimSiam")):
        bn = accuracies("appendix_c_fmnist-small-bn", method)
        gn = accuracies("appendix_c_fmnist-small", method)
        print(f"| {label}: linear@5000 (%) | {show(bn)} | {show(gn)} |")
        loss_bn = final_losses("appendix_c_fmnist-small-bn", method)
        loss_gn = final_losses("appendix_c_fmnist-small", method)
        print(f"| {label}: final loss | {', '.join(f'{v:.3g}' for v in loss_bn)} | "
              f"{', '.join(f'{v:.3g}' for v in loss_gn)} |")
    print(f"| untrained encoder (the floor) | {show(bn_floor)} | {show(gn_floor)} |")
    print()
    print("| method (group norm), linear@5000 (%) | non-IID 4 | non-IID 16 |")
    print("|---|---|---|")
    for method in ("byol_fedavg", "simsiam_fedavg"):
        row = [show(accuracies("appendix_c_fmnist-small", f"non-iid-{n}-{method}"))
               for n in (4, 16)]
        print(f"| {method} | {row[0]} | {row[1]} |")
    dcco = [show(accuracies("table1_fmnist-small", f"non-iid-{n}-dcco")) for n in (4, 16)]
    print(f"| dcco (Table 1 grid, its recipe) | {dcco[0]} | {dcco[1]} |")
    print(f"| untrained encoder | {show(gn_floor)} | {show(gn_floor)} |")


if __name__ == "__main__":
    main()
