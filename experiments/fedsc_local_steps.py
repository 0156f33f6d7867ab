"""Do FedSC's local steps pay? Its k-NN monitor against exchanges and against the clients'
gradient steps, E = 1, 2 and 5 local steps, beside DCCO's curves at the same recipe, and the
probes of every method of the comparison, mean and spread over seeds (docs/results/future-work.md).

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
PROBE_EXCHANGES = (100, 200, 300)
"""Where it reads the probes during pretraining (the last, at 600, is the final probe)."""


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
    probes: str | None = None
    """The scale of the same cells with the linear probe every 50 rounds
    (``train.probe_every``), which trains bit for bit as ``folder``'s: a cell finished in
    either serves, and its probes draw the probe curve."""


DCCO = "DCCO, E = 1"
EXACT = "FedSC, E = 1"
SERIES = [
    Series(EXACT, "fedsc_fmnist-small", "fedsc", 1, probes="fedsc_fmnist-small-probes"),
    Series("FedSC, E = 2, N_k/N", "fedsc_fmnist-small-e2", "fedsc", 2,
           probes="fedsc_fmnist-small-e2-probes"),
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
    Series(DCCO, "table1_claims_fmnist-curve", "dcco", 1,
           probes="table1_claims_fmnist-curve-probes"),
    Series("contrastive FedAvg", "table1_claims_fmnist-small", "contrastive_fedavg", 1,
           curve=False),
    Series("CCO + FedAvg", "table1_claims_fmnist-small", "cco_fedavg", 1, curve=False),
    Series("centralized CCO", "table1_claims_fmnist-small", "centralized_cco", 1,
           curve=False, per_setting=False),
]


def read_cell(run: Path) -> dict | None:
    """A finished cell's k-NN and probe curves (round → accuracy), final probe, rounds,
    exchanges a round and the seconds its rounds took (from the logged windows' rates: the
    monitor and probes left out, and whole across a stop and resume, where the summary's
    ``pretrain_seconds_this_session`` holds only the last session's); None until its final
    probe is recorded."""
    if not (run / "summary.json").exists():
        return None
    s = json.loads((run / "summary.json").read_text())
    curve, probes = {}, {}
    seconds, since = 0.0, 0  # the rounds' own seconds, summed over the logged windows
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "knn" in rec and "round" in rec:
            curve[int(rec["round"])] = 100 * rec["knn"]
        if "probe" in rec and "round" in rec:
            probes[int(rec["round"])] = 100 * rec["probe"]
        if "stopped" in rec:  # a resumed run goes on from this round's checkpoint
            since = int(rec["round"])
        elif rec.get("rounds_per_sec"):
            seconds += (int(rec["round"]) - since) / rec["rounds_per_sec"]
            since = int(rec["round"])
    probe = s.get("evaluations", {}).get("linear@5000", {}).get("accuracy")
    if probe is None or "final_loss" not in s:  # pretraining or its probe still running
        return None
    return {"curve": curve, "probes": probes, "probe": 100 * probe,
            "rounds": s["rounds"], "exchanges": s.get("exchanges_per_round", 2),
            "seconds": seconds, "final_loss": s["final_loss"],
            "folder": run.parent.name}


def cell(series: Series, setting: str, seed: int, agreement: list[str]) -> dict | None:
    """The series' cell (its plain scale's, else its probes scale's), with the probes
    scale's probe curve when that cell is finished; where both are, whether they trained
    alike is added to ``agreement``."""
    name = (f"{setting}-{series.method}-s{seed}" if series.per_setting
            else f"{series.method}-s{seed}")
    plain = read_cell(RESULTS / series.folder / name)
    probed = read_cell(RESULTS / series.probes / name) if series.probes else None
    if plain is not None and probed is not None:
        same = (plain["final_loss"] == probed["final_loss"]
                and plain["probe"] == probed["probe"] and plain["curve"] == probed["curve"])
        agreement.append(f"{series.probes}/{name}: "
                         + ("the same final loss, k-NN curve and probe as "
                            f"{series.folder}'s cell" if same else
                            f"DIFFERS from {series.folder}'s cell (final loss "
                            f"{probed['final_loss']!r} against {plain['final_loss']!r})"))
    run = plain if plain is not None else probed
    if run is not None and probed is not None:
        run = run | {"probes": probed["probes"]}
    return run


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
    """"mean ± sample sd"; one value alone (a rounded −0.0 printed as 0.0)."""
    if not values:
        return "—"
    mean = round(statistics.fmean(values), 1) + 0.0
    if len(values) == 1:
        return f"{mean:.1f}"
    return f"{mean:.1f} ± {statistics.stdev(values):.1f}"


def final_knn(run: dict) -> float | None:
    """The monitor's last reading (the end of the run), None without one."""
    return run["curve"][max(run["curve"])] if run["curve"] else None


def table(found: dict, seeds: list[int]) -> str:
    lines = [("| setting | series | seeds | probe (%), mean ± sd | probe by seed | − DCCO, "
              "paired | k-NN at exchange 100 / 300 / 600 (%) | probe at exchange 100 / 200 / "
              "300 (%), seeds | probe − final k-NN | exchanges to E = 1's final k-NN, by seed "
              "| pretraining s, by seed |"), "|---|---|---|---|---|---|---|---|---|---|---|"]
    for setting, name in SETTINGS.items():
        for sr in SERIES:
            runs = {s: found[(setting, sr.label, s)] for s in seeds
                    if (setting, sr.label, s) in found}
            if not runs:
                continue
            probes = [r["probe"] for r in runs.values()]
            by_seed = " / ".join(f"{r['probe']:.1f}" for r in runs.values())
            dcco = {s: found.get((setting, DCCO, s)) for s in runs}
            paired = [runs[s]["probe"] - d["probe"] for s, d in dcco.items()
                      if d is not None and sr.label != DCCO]
            knn = [spread([v for v in (knn_at(r, x) for r in runs.values()) if v is not None])
                   if sr.per_setting else "no exchanges" for x in EXCHANGES]
            early = []
            for x in PROBE_EXCHANGES:
                vals = [r["probes"].get(x // r["exchanges"]) for r in runs.values()]
                vals = [v for v in vals if v is not None]
                early.append(f"{spread(vals)} ({len(vals)})" if vals else "—")
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
                         f"{' · '.join(knn)} | {' · '.join(early)} | {gap} | "
                         f"{' / '.join(reach) or '—'} | "
                         f"{secs or '—'} |")
    return "\n".join(lines)


def probe_at(run: dict, x: int) -> float | None:
    """The run's probe at ``x`` exchanges: during pretraining, or the final probe at its
    end; None where it read none."""
    if x == run["rounds"] * run["exchanges"]:
        return run["probe"]
    return run["probes"].get(x // run["exchanges"])


def paired_probes(found: dict, setting: str, runs: dict, other: str,
                  ends: tuple[int, ...]) -> list[str]:
    """At each exchange count, the runs' probe minus series ``other``'s of the same seed,
    mean ± sd over the seeds that have both ("—" where none has)."""
    out = []
    for x in ends:
        diffs = []
        for seed, r in runs.items():
            o = found.get((setting, other, seed))
            mine, theirs = probe_at(r, x), (probe_at(o, x) if o and o["probes"] else None)
            if mine is not None and theirs is not None:
                diffs.append(mine - theirs)
        out.append(spread(diffs) if diffs else "—")
    return out


def probe_table(found: dict, seeds: list[int]) -> str:
    """Accuracy against exchanges by the probe: each series with probes during pretraining,
    at every probe's exchange count and at the end, and its difference from DCCO's probe
    at the same count and seed (paired), mean ± sd over the seeds that have both."""
    ends = (*PROBE_EXCHANGES, EXCHANGES[-1])
    heads = " / ".join(map(str, ends))
    lines = [(f"| setting | series | seeds | probe at exchange {heads} (%) | − DCCO, "
              f"paired, at {heads} | − FedSC's E = 1, paired | exchanges to DCCO's final "
              f"probe, by seed |"), "|---|---|---|---|---|---|---|"]

    for setting, name in SETTINGS.items():
        for sr in SERIES:
            runs = {s: found[(setting, sr.label, s)] for s in seeds
                    if (setting, sr.label, s) in found
                    and found[(setting, sr.label, s)]["probes"]}
            if not runs:
                continue
            level = []
            for x in ends:
                vals = [v for v in (probe_at(r, x) for r in runs.values()) if v is not None]
                level.append(spread(vals) if vals else "—")

            vs = [" · ".join(paired_probes(found, setting, runs, other, ends))
                  if sr.label not in (other, DCCO) else "—" for other in (DCCO, EXACT)]
            reach = []  # the first probe at or above DCCO's final probe of the same seed
            for seed, r in runs.items():
                d = found.get((setting, DCCO, seed))
                if d is None:
                    continue
                first = [x for x in ends if (v := probe_at(r, x)) is not None
                         and v >= d["probe"]]
                reach.append(str(first[0]) if first else "never")
            lines.append(f"| {name} | {sr.label} | {len(runs)} | {' · '.join(level)} | "
                         f"{vs[0]} | {vs[1]} | {' / '.join(reach) or '—'} |")
    return "\n".join(lines)


def draw(ax, runs: list[dict], key: str, x_of, kw: dict, label: str) -> None:
    """The mean over seeds of each run's ``key`` curve (rounds → %) at the rounds all of
    them read, with a band from the lowest seed to the highest."""
    runs = [r for r in runs if r[key]]
    if not runs:
        return
    rounds = sorted(set.intersection(*(set(r[key]) for r in runs)))
    x = [x_of(runs[0], k) for k in rounds]
    ax.plot(x, [statistics.fmean(r[key][k] for r in runs) for k in rounds],
            label=f"{label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})", **kw)
    if len(runs) > 1:
        ax.fill_between(x, [min(r[key][k] for r in runs) for k in rounds],
                        [max(r[key][k] for r in runs) for k in rounds], color=kw["color"],
                        alpha=0.15)


def plot(found: dict, seeds: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(11, 12), sharey="row")
    for col, setting in enumerate(SETTINGS):
        for sr in SERIES:
            runs = [found[(setting, sr.label, s)] for s in seeds
                    if (setting, sr.label, s) in found and sr.curve]
            kw = {"ls": "-" if sr.method == "fedsc" else "--", "marker": "o", "ms": 3,
                  "color": f"C{SERIES.index(sr) % 10}"}  # one colour a series, every panel
            draw(axes[0, col], runs, "curve", lambda r, k: k * r["exchanges"], kw, sr.label)
            draw(axes[1, col], runs, "probes", lambda r, k: k * r["exchanges"], kw, sr.label)
            draw(axes[2, col], runs, "curve", lambda r, k, e=sr.steps: k * e, kw, sr.label)
        axes[0, col].set_title(SETTINGS[setting])
        for row in (0, 1):
            axes[row, col].set_xlabel("exchanges (2 a round)")
        axes[2, col].set_xlabel("client gradient steps (rounds × E)")
        axes[2, col].set_xscale("log")
    for row, what in ((0, "k-NN monitor (%), 1,000 queries"),
                      (1, "linear probe (%), 5,000 labels"),
                      (2, "k-NN monitor (%), 1,000 queries")):
        axes[row, 0].set_ylabel(what)
    for ax in (*axes[0], *axes[1]):
        if ax.has_data():
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
    found, missing, agreement = {}, {}, []
    for setting in SETTINGS:
        for sr in SERIES:
            for seed in args.seeds:
                r = cell(sr, setting, seed, agreement)
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
          "within the run. Probe at exchange 100 / 200 / 300: the probes during pretraining "
          "(train.probe_every, the series' probes scale), with the number of seeds read. "
          "Pretraining s: the seconds of the rounds themselves (the monitor and probes left "
          "out), one thread a cell, two cells side by side; not a benchmark.")
    print("\n" + probe_table(found, args.seeds))
    print("\nAccuracy against exchanges by the probe during pretraining (every 50 rounds; "
          f"the last column is the final probe, at {EXCHANGES[-1]} exchanges), for the series "
          "run in a probes scale; − DCCO (− FedSC's E = 1), paired: minus DCCO's (FedSC's "
          "one-step round's) probe at the same exchange count and seed, mean ± sd over the "
          "seeds that have both. Exchanges to DCCO's final probe: the first of these probes "
          f"at or above DCCO's at its end ({EXCHANGES[-1]} exchanges) of the same seed; "
          "never: not within the run.")
    if agreement:
        print("\nCells trained in both scales: " + "; ".join(agreement) + ".")
    if missing:
        print("\nNot run or not finished (left out): " + "; ".join(
            f"{where} seed{'s' if len(missed) > 1 else ''} {', '.join(map(str, sorted(missed)))}"
            for where, missed in missing.items()) + ".")
    if args.plot:
        plot(found, args.seeds, args.plot)


if __name__ == "__main__":
    main()
