"""Do FedSC's local steps pay? Its k-NN monitor against exchanges and against the clients'
gradient steps, E = 1, 2 and 5 local steps, beside DCCO's curves at the same recipe, and the
probes of every method of the comparison, mean and spread over seeds (docs/results.md,
"FedSC").

Reads the finished cells of experiments/fedsc_fmnist.toml (scales ``small``, ``small-e2``,
``small-e5``, ``small-e2-fedsc``, ``small-e5-fedsc``, and FedSC's own mechanism, a FedAvg
server with FedSC's local recipe: ``fedavg-e1-lr03``, ``fedavg-e1-lr003``,
``fedavg-e5-lr03``, ``fedavg-e5-lr003``); DCCO's curves from the claims grid's ``curve``
scale (experiments/table1_claims_fmnist.toml: its ``small`` recipe with the monitor); and the
probes of contrastive FedAvg, CCO + FedAvg and centralized CCO from the claims grid's ``small``
cells of the same seeds. A missing cell is left out, and said so.

    python experiments/fedsc_local_steps.py --seeds 0 1 2 \\
        --plot docs/fedsc_local_steps.png > experiments/results/fedsc_local_steps.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SETTINGS = {"non-iid-4": "non-IID 4 (32 clients of 4)", "non-iid-16": "non-IID 16 (8 of 16)"}
EXCHANGES = (100, 300, 600)
"""Where the table reads the k-NN curves."""


@dataclass(frozen=True)
class Series:
    label: str
    folder: str
    method: str
    steps: int
    curve: bool = True
    """Whether the plot draws it (its cells ran the monitor)."""
    per_setting: bool = True
    """False: one cell for every setting (centralized, ``<method>-s<seed>``)."""


DCCO = "DCCO, E = 1"
EXACT = "FedSC, E = 1"
SERIES = [
    Series(EXACT, "fedsc_fmnist-small", "fedsc", 1),
    Series("FedSC, E = 2, N_k/N", "fedsc_fmnist-small-e2", "fedsc", 2),
    Series("FedSC, E = 2, FedSC's α", "fedsc_fmnist-small-e2-fedsc", "fedsc", 2),
    Series("FedSC, E = 5, N_k/N", "fedsc_fmnist-small-e5", "fedsc", 5),
    Series("FedSC, E = 5, FedSC's α", "fedsc_fmnist-small-e5-fedsc", "fedsc", 5),
    # the scales' names: lr03 is a local rate of 0.3, lr003 of 0.03 (FedSC's own)
    Series("FedSC, FedAvg server, E = 1, local lr 0.3", "fedsc_fmnist-fedavg-e1-lr03",
           "fedsc", 1, curve=False),
    Series("FedSC, FedAvg server, E = 1, local lr 0.03", "fedsc_fmnist-fedavg-e1-lr003",
           "fedsc", 1, curve=False),
    Series("FedSC, FedAvg server, E = 5, local lr 0.3", "fedsc_fmnist-fedavg-e5-lr03",
           "fedsc", 5, curve=False),
    Series("FedSC, FedAvg server, E = 5, local lr 0.03", "fedsc_fmnist-fedavg-e5-lr003",
           "fedsc", 5, curve=False),
    Series(DCCO, "table1_claims_fmnist-curve", "dcco", 1),
    Series("contrastive FedAvg", "table1_claims_fmnist-small", "contrastive_fedavg", 1,
           curve=False),
    Series("CCO + FedAvg", "table1_claims_fmnist-small", "cco_fedavg", 1, curve=False),
    Series("centralized CCO", "table1_claims_fmnist-small", "centralized_cco", 1,
           curve=False, per_setting=False),
]


def cell(series: Series, setting: str, seed: int) -> dict | None:
    """The cell's k-NN curve (round → accuracy), probe, rounds, exchanges a round and
    seconds; None when it is not finished."""
    name = (f"{setting}-{series.method}-s{seed}" if series.per_setting
            else f"{series.method}-s{seed}")
    run = RESULTS / series.folder / name
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


def knn_at(run: dict, exchanges: int) -> float | None:
    """The monitor's reading after ``exchanges`` exchanges (None where it did not read)."""
    return run["curve"].get(exchanges // run["exchanges"]) if run["curve"] else None


def exchanges_to(run: dict, target: float) -> int | None:
    """The first exchange count at which the monitor reads ``target`` or more; None: never."""
    for rnd in sorted(run["curve"]):
        if run["curve"][rnd] >= target - 1e-9:
            return rnd * run["exchanges"]
    return None


def spread(values: list[float]) -> str:
    """"mean ± sample sd (n)"; one value alone."""
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values):.1f}"


def final_knn(run: dict) -> float | None:
    """The monitor's last reading (the end of the run), None without one."""
    return run["curve"][max(run["curve"])] if run["curve"] else None


def table(found: dict, seeds: list[int]) -> str:
    lines = [("| setting | series | seeds | probe (%), mean ± sd | probe by seed | − DCCO, "
              "paired | k-NN at exchange 100 / 300 / 600 (%) | probe − final k-NN | "
              "exchanges to E = 1's final k-NN, by seed | pretraining s |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for setting, name in SETTINGS.items():
        for sr in SERIES:
            runs = {s: found[(setting, sr.label, s)] for s in seeds
                    if (setting, sr.label, s) in found}
            if not runs:
                continue
            probes = [r["probe"] for r in runs.values() if r["probe"] is not None]
            by_seed = " / ".join(f"{r['probe']:.1f}" for r in runs.values()
                                 if r["probe"] is not None)
            dcco = {s: found.get((setting, DCCO, s)) for s in runs}
            paired = [runs[s]["probe"] - d["probe"] for s, d in dcco.items()
                      if d is not None and sr.label != DCCO]
            knn = [spread([v for v in (knn_at(r, x) for r in runs.values()) if v is not None])
                   if sr.per_setting else "no exchanges" for x in EXCHANGES]
            gap = spread([r["probe"] - final_knn(r) for r in runs.values()
                          if r["probe"] is not None and r["curve"]])
            reach = []  # the same method's monitor: FedSC's E = 1 of the same seed
            for s, r in runs.items():
                one = found.get((setting, EXACT, s))
                if sr.method != "fedsc" or one is None or not one["curve"] or not r["curve"]:
                    continue
                x = exchanges_to(r, final_knn(one))
                reach.append("never" if x is None else str(x))
            secs = " / ".join(f"{r['seconds']:.0f}" for r in runs.values() if r["seconds"])
            lines.append(f"| {name} | {sr.label} | {len(runs)} | {spread(probes)} | "
                         f"{by_seed or '—'} | {spread(paired) if paired else '—'} | "
                         f"{' · '.join(knn)} | {gap} | {' / '.join(reach) or '—'} | "
                         f"{secs or '—'} |")
    return "\n".join(lines)


def plot(found: dict, seeds: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharey="row")
    for col, setting in enumerate(SETTINGS):
        for sr in SERIES:
            runs = [found[(setting, sr.label, s)] for s in seeds
                    if (setting, sr.label, s) in found and sr.curve]
            runs = [r for r in runs if r["curve"]]
            if not runs:
                continue
            rounds = sorted(set.intersection(*(set(r["curve"]) for r in runs)))
            mean = [statistics.fmean(r["curve"][k] for r in runs) for k in rounds]
            low = [min(r["curve"][k] for r in runs) for k in rounds]
            high = [max(r["curve"][k] for r in runs) for k in rounds]
            per_round = runs[0]["exchanges"]
            kw = {"ls": "-" if sr.method == "fedsc" else "--", "marker": "o", "ms": 3,
                  "color": f"C{SERIES.index(sr) % 10}"}  # one colour a series, both panels
            label = f"{sr.label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
            for row, x in ((0, [k * per_round for k in rounds]),
                           (1, [k * sr.steps for k in rounds])):
                axes[row, col].plot(x, mean, label=label, **kw)
                if len(runs) > 1:
                    axes[row, col].fill_between(x, low, high, color=kw["color"], alpha=0.15)
        axes[0, col].set_title(SETTINGS[setting])
        axes[0, col].set_xlabel("exchanges (2 a round)")
        axes[1, col].set_xlabel("client gradient steps (rounds × E)")
        axes[1, col].set_xscale("log")
    for row in range(2):
        axes[row, 0].set_ylabel("k-NN accuracy (%), 1,000 queries")
    for ax in axes[0]:
        ax.legend(fontsize=7)
    fig.suptitle(f"FedSC's local steps on Fashion-MNIST, small recipe: mean over seeds "
                 f"{seeds}, band from the lowest to the highest seed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args()
    found, missing = {}, {}
    for setting in SETTINGS:
        for sr in SERIES:
            for seed in args.seeds:
                r = cell(sr, setting, seed)
                if r is None:
                    where = (f"{sr.folder} {setting}-{sr.method}" if sr.per_setting
                             else f"{sr.folder} {sr.method}")
                    missing.setdefault(where, set()).add(seed)
                else:
                    found[(setting, sr.label, seed)] = r
    print(f"# FedSC's local steps\n\n    python experiments/fedsc_local_steps.py "
          f"{' '.join(sys.argv[1:])}\n")
    print(table(found, args.seeds))
    print("\nProbe: 5,000-label linear probe at the end of the run. − DCCO, paired: the "
          "series' probe minus DCCO's of the same seed (same partition), mean ± sd over the "
          "seeds that have both. Probe − final k-NN: how far the monitor reads below the "
          "probe (it differs by method, so k-NN curves compare within a method, not across). "
          "Exchanges to E = 1's final k-NN: the first monitor reading at or above that of "
          "FedSC's one-step round of the same seed at its end (600 exchanges); never: not "
          "within the run.")
    if missing:
        print("\nNot run or not finished (left out): " + "; ".join(
            f"{where} seed{'s' if len(missed) > 1 else ''} {', '.join(map(str, sorted(missed)))}"
            for where, missed in missing.items()) + ".")
    if args.plot:
        plot(found, args.seeds, args.plot)


if __name__ == "__main__":
    main()
