"""The paper's Figs. 3-4 on Fashion-MNIST: BYOL's and SimSiam's training loss, centralized,
with batch norm and with group norm (experiments/appendix_c_fmnist.toml).

    python experiments/appendix_c_plot.py [--gn DIR] [--bn DIR] [--out PNG]

Each seed is a thin line, the mean over seeds a thick one; the loss is the logged mean over
each logging window. Also prints the loss at rounds 10, 50 and the last, per cell.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
METHODS = {"centralized_byol": "BYOL (2 − 2 cos, both directions)",
           "centralized_simsiam": "SimSiam (−cos, symmetrised)"}


def curves(folder: Path, method: str) -> list[list[tuple[int, float]]]:
    """The (round, loss) records of every seed's run of ``method`` in ``folder``."""
    out = []
    for run in sorted(folder.glob(f"{method}-s*")):
        lines = (run / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        out.append([(r["round"], r["loss"]) for r in records if "loss" in r])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    res = ROOT / "experiments" / "results"
    parser.add_argument("--gn", type=Path, default=res / "appendix_c_fmnist-small")
    parser.add_argument("--bn", type=Path, default=res / "appendix_c_fmnist-small-bn")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "appendix_c_fmnist.png")
    args = parser.parse_args()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, (method, title) in zip(axes, METHODS.items()):
        for norm, folder, colour in (("batch norm", args.bn, "C0"),
                                     ("group norm", args.gn, "C3")):
            runs = curves(folder, method)
            for i, points in enumerate(runs):
                x, y = zip(*points)
                ax.plot(x, y, color=colour, alpha=0.35, lw=0.8)
                print(f"{method:20s} {norm:10s} seed {i}: " + ", ".join(
                    f"round {r}: {v:.4f}" for r, v in points if r in (10, 50, x[-1])))
            if runs:
                n = min(len(p) for p in runs)
                mean = [sum(p[j][1] for p in runs) / len(runs) for j in range(n)]
                ax.plot([runs[0][j][0] for j in range(n)], mean, color=colour, lw=2,
                        label=f"{norm} ({len(runs)} seeds)")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step (centralized, batch 128)")
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Appendix C on Fashion-MNIST (small scale): training loss, BN vs GN",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
