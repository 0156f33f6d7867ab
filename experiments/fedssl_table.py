"""The comparison of the methods whose clients keep state (FedU, FedEMA, MoCo) with BYOL,
SimSiam and DCCO, for docs/results.md, from the finished cells of
experiments/fedssl_fmnist.toml (each scale's folder under experiments/results), DCCO's and
the FedAvg baselines' cells of the claims grid (experiments/table1_claims_fmnist.toml,
group norm, seeds 0-2 of its 5), and the untrained encoders of the same network, with batch
norm (results/random_init-small-bn, appendix C's floor) for the grid's cells and with group
norm (results/random_init-small) for the claims grid's.

    python experiments/fedssl_table.py [--scale one-step-bn]

Each row: linear@5000 (%) by seed, finished seeds only, and the gain over the untrained
encoder of the same seed, and against DCCO of the same seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("fedu", "fedema", "moco_fedavg", "byol_fedavg", "simsiam_fedavg")
CLAIMS = ("dcco", "cco_fedavg", "contrastive_fedavg")
SETTINGS = (("non-IID 4", "non-iid-4"), ("non-IID 16", "non-iid-16"))


def probe(path: Path) -> float | None:
    """linear@5000 (%) of a finished cell, or None."""
    summary = path / "summary.json"
    if not summary.is_file():
        return None
    evaluation = json.loads(summary.read_text()).get("evaluations", {}).get("linear@5000")
    return None if evaluation is None else 100 * evaluation["accuracy"]


def row(values: dict[int, float], floor: dict[int, float], dcco: dict[int, float]) -> str:
    """'mean ± sd (s0, s1, …)', then the paired gains over the floor and against DCCO."""
    if not values:
        return "not run | | "
    seeds = sorted(values)
    shown = ", ".join(f"{values[s]:.1f}" for s in seeds)
    spread = f" ± {statistics.stdev(values.values()):.1f}" if len(values) > 1 else ""
    mean = statistics.fmean(values.values())
    over = [values[s] - floor[s] for s in seeds if s in floor]
    against = [values[s] - dcco[s] for s in seeds if s in dcco]
    paired = (lambda d: f"{statistics.fmean(d):+.1f}" if d else "—")
    return f"{mean:.1f}{spread} ({shown}) | {paired(over)} | {paired(against)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="one-step-bn")
    scale = parser.parse_args().scale
    floor = {s: v for s in range(3)
             if (v := probe(RESULTS / "random_init-small-bn" / f"s{s}")) is not None}
    floor_gn = {s: v for s in range(3)
                if (v := probe(RESULTS / "random_init-small" / f"s{s}")) is not None}
    print(f"fedssl_fmnist, scale {scale}: linear@5000 (%), seeds as finished")
    print("| setting | method | linear@5000 | over untrained (same seed) | against DCCO "
          "(same seed) |")
    print("|---|---|---|---:|---:|")
    for label, slug in SETTINGS:
        dcco = {s: v for s in range(3) if (v := probe(
            RESULTS / "table1_claims_fmnist-small" / f"{slug}-dcco-s{s}")) is not None}
        for method in METHODS:
            values = {s: v for s in range(3) if (v := probe(
                RESULTS / f"fedssl_fmnist-{scale}" / f"{slug}-{method}-s{s}")) is not None}
            print(f"| {label} | {method} | {row(values, floor, dcco)} |")
        for method in CLAIMS:  # the claims grid's, group norm, its own recipe
            values = {s: v for s in range(3) if (v := probe(
                RESULTS / "table1_claims_fmnist-small" / f"{slug}-{method}-s{s}")) is not None}
            print(f"| {label} | {method} (claims grid, group norm) | "
                  f"{row(values, floor_gn, dcco)} |")
    for name, values in (("batch norm", floor), ("group norm", floor_gn)):
        shown = ", ".join(f"{values[s]:.1f}" for s in sorted(values))
        print(f"untrained encoder, {name}: {shown}")


if __name__ == "__main__":
    main()
