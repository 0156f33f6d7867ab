"""Do FedSC's local steps pay? Its k-NN monitor against exchanges and against the clients'
gradient steps, E = 1, 2 and 5 local steps, beside DCCO's curves at the same recipe, and the
probes (docs/results.md, "FedSC").

Reads the finished cells of experiments/fedsc_fmnist.toml (scales ``small``, ``small-e2``,
``small-e5``, ``small-e2-fedsc``, ``small-e5-fedsc``, and FedSC's own mechanism, a FedAvg
server with FedSC's local recipe: ``fedavg-e1-lr03``, ``fedavg-e1-lr003``,
``fedavg-e5-lr03``, ``fedavg-e5-lr003``) and, for DCCO at non-IID 16, those of
experiments/local_steps_fmnist.toml (``curve-e1``: E = 1; ``curve-lw-e4``: 4 layer-wise local
steps, the local recipe FedSC's scales use). A missing cell is left out, and said so.

    python experiments/fedsc_local_steps.py --seeds 0 \\
        --plot docs/fedsc_local_steps.png > experiments/results/fedsc_local_steps.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
FAILED_LOSS = 125.0
"""A DCCO run whose final CCO loss is above it did not train (experiments/paired_cells.py)."""
SETTINGS = {"non-iid-4": "non-IID 4 (32 clients of 4)", "non-iid-16": "non-IID 16 (8 of 16)"}
SERIES = [  # label, folder, cell prefix, local steps
    ("FedSC, E = 1", "fedsc_fmnist-small", "fedsc", 1),
    ("FedSC, E = 2, N_k/N", "fedsc_fmnist-small-e2", "fedsc", 2),
    ("FedSC, E = 2, FedSC's α", "fedsc_fmnist-small-e2-fedsc", "fedsc", 2),
    ("FedSC, E = 5, N_k/N", "fedsc_fmnist-small-e5", "fedsc", 5),
    ("FedSC, E = 5, FedSC's α", "fedsc_fmnist-small-e5-fedsc", "fedsc", 5),
    # the scales' names: lr03 is a local rate of 0.3, lr003 of 0.03 (FedSC's own)
    ("FedSC, FedAvg server, E = 1, local lr 0.3", "fedsc_fmnist-fedavg-e1-lr03", "fedsc", 1),
    ("FedSC, FedAvg server, E = 1, local lr 0.03", "fedsc_fmnist-fedavg-e1-lr003", "fedsc",
     1),
    ("FedSC, FedAvg server, E = 5, local lr 0.3", "fedsc_fmnist-fedavg-e5-lr03", "fedsc", 5),
    ("FedSC, FedAvg server, E = 5, local lr 0.03", "fedsc_fmnist-fedavg-e5-lr003", "fedsc",
     5),
    ("DCCO, E = 1", "local_steps_fmnist-curve-e1", "dcco", 1),
    ("DCCO, E = 4, layer-wise, local lr 1e-5", "local_steps_fmnist-curve-lw-e4", "dcco", 4),
]


def cell(folder: str, setting: str, method: str, seed: int) -> dict | None:
    """The cell's k-NN curve (round → accuracy), probe, rounds, exchanges a round and
    seconds; None when it is not finished."""
    run = RESULTS / folder / f"{setting}-{method}-s{seed}"
    if not (run / "summary.json").exists():
        return None
    s = json.loads((run / "summary.json").read_text())
    curve = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "knn" in rec and "round" in rec:
            curve[int(rec["round"])] = 100 * rec["knn"]
    probe = s.get("evaluations", {}).get("linear@5000", {}).get("accuracy")
    return {"curve": curve, "probe": None if probe is None else 100 * probe,
            "rounds": s["rounds"], "exchanges": s.get("exchanges_per_round", 2),
            "seconds": s.get("pretrain_seconds_this_session"), "final_loss": s["final_loss"]}


def table(found: dict, seeds: list[int]) -> str:
    lines = [("| setting | series | seeds | probe (%) | k-NN at exchange 100 / 300 / 600 (%) "
              "| final loss | pretraining s |"), "|---|---|---|---|---|---|---|"]
    for setting, name in SETTINGS.items():
        for label, *_ in SERIES:
            runs = [found[(setting, label, s)] for s in seeds if (setting, label, s) in found]
            if not runs:
                continue
            probes = " / ".join(f"{r['probe']:.1f}" for r in runs if r["probe"] is not None)
            knn = []
            for exch in (100, 300, 600):
                vals = [r["curve"].get(exch // r["exchanges"]) for r in runs]
                vals = [v for v in vals if v is not None]
                knn.append(" / ".join(f"{v:.1f}" for v in vals) if vals else "—")
            loss = " / ".join(f"{r['final_loss']:.3g}" for r in runs)
            secs = " / ".join(f"{r['seconds']:.0f}" for r in runs if r["seconds"])
            lines.append(f"| {name} | {label} | {len(runs)} | {probes or '—'} | "
                         f"{' · '.join(knn)} | {loss} | {secs or '—'} |")
    return "\n".join(lines)


def plot(found: dict, seeds: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharey="row")
    for col, setting in enumerate(SETTINGS):
        for label, _, method, steps in SERIES:
            for seed in seeds:
                r = found.get((setting, label, seed))
                if r is None or not r["curve"]:
                    continue
                rounds = sorted(r["curve"])
                acc = [r["curve"][k] for k in rounds]
                style = "-" if method == "fedsc" else "--"
                failed = method == "dcco" and r["final_loss"] > FAILED_LOSS
                name = label + (f" (seed {seed} did not train)" if failed else "")
                kw = {"label": name if seed == seeds[0] or failed else None, "ls": style,
                      "marker": "o", "ms": 3, "alpha": 0.4 if failed else 1.0}
                axes[0, col].plot([k * r["exchanges"] for k in rounds], acc, **kw)
                axes[1, col].plot([k * steps for k in rounds], acc, **kw)
        axes[0, col].set_title(SETTINGS[setting])
        axes[0, col].set_xlabel("exchanges (2 a round)")
        axes[1, col].set_xlabel("client gradient steps (rounds × E)")
        axes[1, col].set_xscale("log")
    for row in range(2):
        axes[row, 0].set_ylabel("k-NN accuracy (%), 1,000 queries")
    for ax in axes[0]:
        ax.legend(fontsize=7)
    fig.suptitle(f"FedSC's local steps on Fashion-MNIST, small recipe, seeds {seeds}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args()
    found, missing = {}, []
    for setting in SETTINGS:
        for label, folder, method, _ in SERIES:
            for seed in args.seeds:
                r = cell(folder, setting, method, seed)
                if r is None:
                    missing.append(f"{folder}/{setting}-{method}-s{seed}")
                else:
                    found[(setting, label, seed)] = r
    print(f"# FedSC's local steps\n\n    python experiments/fedsc_local_steps.py "
          f"{' '.join(sys.argv[1:])}\n")
    print(table(found, args.seeds))
    if missing:
        print("\nNot finished (left out): " + ", ".join(missing))
    if args.plot:
        plot(found, args.seeds, args.plot)


if __name__ == "__main__":
    main()
