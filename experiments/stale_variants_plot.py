"""The stale-statistics variants' curves (experiments/stale_variants.py's record): each
variant's loss, round by round, at non-IID 1 and non-IID 4, against fresh DCCO's (the Table 1
grid's seed-0 cells, logged every 10 rounds).

    python experiments/stale_variants_plot.py [--record JSON] [--out PNG]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
FRESH = {"non-iid-1": RESULTS / "table1_fmnist-small" / "non-iid-1-dcco-s0",
         "non-iid-4": RESULTS / "table1_fmnist-small" / "non-iid-4-dcco-s0"}


def fresh_curve(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    return [(r["round"], r["loss"]) for r in rows if "loss" in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", type=Path, default=RESULTS / "stale_variants.json")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "stale_variants.png")
    args = ap.parse_args()
    record = json.loads(args.record.read_text())
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, setting in zip(axes, ("non-iid-1", "non-iid-4"), strict=True):
        fresh = fresh_curve(FRESH[setting])
        ax.plot(*zip(*fresh, strict=True), color="black", lw=2.5,
                label="fresh DCCO (two exchanges)")
        for variant, run in record[setting].items():
            points = [(r, loss) for r, loss, *_ in run["curve"] if math.isfinite(loss)]
            label = f"{variant}: {run['end']} ({run['rounds']})"
            ax.plot(*zip(*points, strict=True), lw=1, label=label)
        ax.set_yscale("log")
        ax.set_title(f"{setting}: stale statistics, LARS lr 1.5, seed 0")
        ax.set_xlabel("round")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("client loss before the step (log)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
