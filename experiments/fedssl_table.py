"""The comparison of the methods whose clients keep state (FedU, FedEMA, MoCo) with BYOL,
SimSiam and DCCO, for docs/results/stateful-peers.md, from the finished cells of
experiments/fedssl_fmnist.toml (each scale's folder under experiments/results), DCCO's and
the FedAvg baselines' cells of the claims grid (experiments/table1_claims_fmnist.toml,
group norm, seeds 0-2 of its 5), the cross-silo grids (experiments/fedssl_cross_silo_fmnist.toml,
its DCCO and centralized CCO, experiments/fedssl_cross_silo_dcco_fmnist.toml, and its FedSC,
experiments/fedssl_cross_silo_fedsc_fmnist.toml; batch norm, scale small), and
the untrained encoders of the same network, with batch norm (results/random_init-small-bn,
appendix C's floor) for the batch-norm cells and with group norm (results/random_init-small)
for the claims grid's.

    python experiments/fedssl_table.py [--scale one-step-bn] [--plot docs/fedssl.png]

Each row: linear@5000 (%) by seed, finished seeds only, and the gain over the untrained
encoder of the same seed, and against DCCO of the same seed (paired: mean ± sd of the
seeds' differences, and whether every seed lies on one side). A scale other than the one
step's also gets each method against itself at the one step, paired by seed. Then what
FedU's and FedEMA's rules did in the cells that logged it (``divergence_rules``).
``--plot``: each setting's methods as bars of their mean with every seed as a dot, DCCO's
mean as a line and the untrained encoder's as a dotted one.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("fedu", "fedema", "moco_fedavg", "byol_fedavg", "simsiam_fedavg")
CLAIMS = ("dcco", "cco_fedavg", "contrastive_fedavg", "centralized_cco")
"""The claims grid's methods shown (group norm, its LARS 1.5 recipe; centralized training's
cells are one for every setting)."""
GROUP_NORM = (*CLAIMS, "fedsc")
"""Methods whose cells have group norm: the claims grid's and FedSC's (experiments/fedsc_fmnist.toml,
scale small, the claims grid's recipe)."""
ONE_STEP_SCALE = "one-step-bn"
"""The scale at dcco's one local step, which ``against_one_step`` pairs other scales with."""
SETTINGS = (("non-IID 4", "non-iid-4"), ("non-IID 16", "non-iid-16"))
CROSS_SILO = ("cross-silo Dir 0.1", "cross-silo-dir-0-1")
"""10 clients of 64 photos, all of them a round: its own grids, at scale ``small``, whatever
the scale of the tiny-client cells."""
ONE_STEP = "fedssl_cross_silo_dcco_fmnist-small"
LOCAL_EPOCHS = "fedssl_cross_silo_fmnist-small"
CROSS_SILO_GRIDS = {"dcco": ONE_STEP, "centralized_cco": ONE_STEP, "cco_fedavg": ONE_STEP,
                    "contrastive_fedavg": ONE_STEP,
                    "fedsc": "fedssl_cross_silo_fedsc_fmnist-small"}
"""The cross-silo cells at the DCCO paper's round (one local step, the server's LARS):
DCCO's grid (DCCO, its paper's FedAvg baselines, centralized CCO on the pooled 640 photos)
and FedSC's; the other methods' are at their papers' 5 local epochs (``LOCAL_EPOCHS``), where
the DCCO paper's baselines ran too (shown as rows of their own)."""
CROSS_SILO_ONE_STEP = "fedssl_cross_silo_one_step_fmnist-small"
"""FedU, FedEMA, MoCo, BYOL and SimSiam in the cross-silo setting at dcco's one step
(experiments/fedssl_cross_silo_one_step_fmnist.toml), beside their 5-epoch cells."""
AGAINST_EACH_OTHER = (*((m, "byol_fedavg") for m in ("fedu", "fedema", "simsiam_fedavg",
                                                     "moco_fedavg")), ("fedema", "fedu"))
"""The pairs ``against_byol`` prints: each method against BYOL + FedAvg, whose clients are
the BYOL family's without a rule, and FedEMA against FedU."""


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
    over, against = differences(values, floor), differences(values, dcco)
    return f"{spread(values)} | {paired(over)} | {paired(against)}"


def spread(values: dict[int, float]) -> str:
    """'mean ± sd (s0, s1, …)' of values by seed."""
    shown = ", ".join(f"{values[s]:.1f}" for s in sorted(values))
    sd = f" ± {statistics.stdev(values.values()):.1f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values.values()):.1f}{sd} ({shown})"


def paired(d: list[float]) -> str:
    """Paired differences over seeds: mean ± sd, and which side every seed lies on."""
    if not d or not any(d):  # none, or DCCO against itself
        return "—"
    spread = f" ± {statistics.stdev(d):.1f}" if len(d) > 1 else ""
    side = ("above on every seed" if min(d) > 0 else "below on every seed" if max(d) < 0
            else "either side")
    return f"{statistics.fmean(d):+.1f}{spread} ({len(d)} seed{'s' * (len(d) > 1)}, {side})"


def differences(here: dict[int, float], there: dict[int, float]) -> list[float]:
    """here − there, seed by seed, over the seeds both have finished."""
    return [here[s] - there[s] for s in sorted(here) if s in there]


def folder(scale: str, slug: str, method: str) -> Path | None:
    """Where a method's cells of a setting are: the grid's folder, the claims grid's (group
    norm) for DCCO and the FedAvg baselines, the cross-silo grids' for that setting (None:
    the method has no cells there)."""
    if slug == CROSS_SILO[1]:  # every method has batch norm there
        return RESULTS / CROSS_SILO_GRIDS.get(method, LOCAL_EPOCHS)
    if method == "fedsc":
        return RESULTS / "fedsc_fmnist-small"
    return (RESULTS / "table1_claims_fmnist-small" if method in CLAIMS
            else RESULTS / f"fedssl_fmnist-{scale}")


def cells(scale: str, slug: str, method: str, where: Path | None = None) -> dict[int, float]:
    """linear@5000 by seed of a method's finished cells in a setting (in ``where``, else
    the method's folder there)."""
    where = where or folder(scale, slug, method)
    if where is None:
        return {}
    prefix = "" if method == "centralized_cco" else f"{slug}-"  # one cell for every setting
    return {s: v for s in range(3)
            if (v := probe(where / f"{prefix}{method}-s{s}")) is not None}


def plot(scale: str, floor: dict[int, float], path: Path) -> None:
    """The settings side by side: bars of each method's mean, its seeds as dots, DCCO's mean
    as a solid line and the untrained encoder's (batch norm) as a dotted one. In the
    cross-silo panel each update-sharing method has two bars: its papers' 5 local epochs and,
    hatched, dcco's one step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = (*METHODS, "cco_fedavg", "contrastive_fedavg", "fedsc", "centralized_cco", "dcco")
    shown = (*SETTINGS, CROSS_SILO)
    fig, axes = plt.subplots(1, len(shown), figsize=(6 * len(shown), 4), sharey=True)
    for ax, (label, slug) in zip(axes, shown, strict=True):
        for i, method in enumerate(names):
            bars = [(i, 0.8, cells(scale, slug, method), None)]
            if slug == CROSS_SILO[1] and method in METHODS:  # 5 local epochs | one step
                one = cells("", slug, method, RESULTS / CROSS_SILO_ONE_STEP)
                bars = [(i - 0.2, 0.4, bars[0][2], None), (i + 0.2, 0.4, one, "//")]
            for x, width, values, hatch in bars:
                if not values:
                    ax.text(x, 50.5, "not run", rotation=90, ha="center", va="bottom",
                            fontsize=8)
                    continue
                color = "tab:red" if method == "dcco" else (
                    "tab:grey" if method in GROUP_NORM and slug != CROSS_SILO[1]
                    else "tab:blue")
                ax.bar(x, statistics.fmean(values.values()), width, color=color, alpha=0.6,
                       hatch=hatch)
                ax.plot([x] * len(values), list(values.values()), "k.", markersize=5)
        dcco = cells(scale, slug, "dcco")
        if dcco:
            ax.axhline(statistics.fmean(dcco.values()), color="tab:red", lw=1)
        if floor:
            ax.axhline(statistics.fmean(floor.values()), color="k", ls=":", lw=1)
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"{label} (scale small; all batch norm; the DCCO paper's methods\n"
                     f"and FedSC at one step; the others 5 local epochs | hatched: one step)"
                     if slug == CROSS_SILO[1]
                     else f"{label} (scale {scale}; grey and red: group norm)", fontsize=9)
        ax.set_ylim(50, 80)
    axes[0].set_ylabel("linear probe, 5,000 labels (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def against_one_step(scale: str) -> None:
    """Each method's cells at ``scale`` against its cells at dcco's one step
    (``ONE_STEP_SCALE``), paired by seed: what the scale's recipe changes, method by
    method."""
    print(f"\n{scale} against {ONE_STEP_SCALE}, the same method and seed: linear@5000 (%)")
    print(f"| setting | method | {scale} | {ONE_STEP_SCALE} | {scale} − {ONE_STEP_SCALE} "
          f"(same seed) |")
    print("|---|---|---|---|---:|")
    for label, slug in SETTINGS:
        for method in METHODS:
            here, one = cells(scale, slug, method), cells(ONE_STEP_SCALE, slug, method)
            if not here:
                continue
            shown = ", ".join(f"{one[s]:.1f}" for s in sorted(here) if s in one)
            print(f"| {label} | {method} | {spread(here)} | {shown} | "
                  f"{paired(differences(here, one))} |")


def cross_silo_against_one_step() -> None:
    """In the cross-silo setting, each method's cells at its papers' 5 local epochs against
    its cells at dcco's one step, paired by seed (printed once either has finished)."""
    label, slug = CROSS_SILO
    pairs = [(m, cells("", slug, m, RESULTS / LOCAL_EPOCHS),
              cells("", slug, m, RESULTS / CROSS_SILO_ONE_STEP)) for m in METHODS]
    if not any(one for _, _, one in pairs):
        return
    print(f"\n{label}: 5 local epochs against one step, the same method and seed")
    print("| setting | method | 5 local epochs | one step | 5 local epochs − one step "
          "(same seed) |")
    print("|---|---|---|---|---:|")
    for method, epochs, one in pairs:
        if one:
            print(f"| {label} | {method} | {spread(epochs) if epochs else 'not run'} | "
                  f"{spread(one)} | "
                  f"{paired(differences(epochs, one))} |")


def against_byol(scale: str) -> None:
    """The BYOL family and MoCo against BYOL + FedAvg (and FedEMA against FedU), the same
    grid and seed: what the divergence-aware rules add to BYOL's clients, in each setting of
    the scale and in both cross-silo grids; in the cross-silo one-step grid also MoCo
    against contrastive FedAvg at DCCO's round."""
    print(f"\n{scale} (and the cross-silo cells): methods against each other, the same seed")
    print("| setting | difference | by seed | paired |")
    print("|---|---|---|---:|")
    shown = [(label, slug, None) for label, slug in SETTINGS]
    shown += [(f"{CROSS_SILO[0]}, {name}", CROSS_SILO[1], RESULTS / grid)
              for name, grid in (("5 local epochs", LOCAL_EPOCHS),
                                 ("one step", CROSS_SILO_ONE_STEP))]
    for label, slug, where in shown:
        compared = [(f"{method} − {base}", cells(scale, slug, method, where),
                     cells(scale, slug, base, where)) for method, base in AGAINST_EACH_OTHER]
        if where == RESULTS / CROSS_SILO_ONE_STEP:  # contrastive FedAvg: DCCO's grid
            compared.append(("moco_fedavg − contrastive_fedavg (one step)",
                             cells(scale, slug, "moco_fedavg", where),
                             cells(scale, slug, "contrastive_fedavg")))
        for name, here, there in compared:
            if d := differences(here, there):
                print(f"| {label} | {name} | {', '.join(f'{x:+.1f}' for x in d)} | "
                      f"{paired(d)} |")


def divergence_rules(scale: str) -> None:
    """What FedU's and FedEMA's rules did in each finished cell of the scale, and of the
    cross-silo grids, whose ``metrics.jsonl`` logs it (``returning_clients``: cells started
    after those metrics were added): the logged
    windows' mean divergence of the returning clients from the global model (its range and
    median), and, weighted by the returning clients, FedU's share that took the global
    predictor (with the first window where any did, and the last window's share) or
    FedEMA's μ (with its range)."""
    print(f"\n{scale} (and the cross-silo cells): the divergence-aware rules, over the "
          f"logged windows with returning clients")
    shown = [(label, slug, RESULTS / f"fedssl_fmnist-{scale}") for label, slug in SETTINGS]
    shown += [(f"{CROSS_SILO[0]}, {name}", CROSS_SILO[1], RESULTS / grid)
              for name, grid in (("5 local epochs", LOCAL_EPOCHS),
                                 ("one step", CROSS_SILO_ONE_STEP))]
    for label, slug, where in shown:
        for method, key in (("fedu", "fedu_global_predictor"), ("fedema", "fedema_mu")):
            for s in range(3):
                path = where / f"{slug}-{method}-s{s}"
                if probe(path) is None:
                    continue
                lines = (path / "metrics.jsonl").read_text().splitlines()
                windows = [w for w in map(json.loads, lines) if w.get("returning_clients")]
                if not windows:
                    continue
                returning = sum(w["returning_clients"] for w in windows)
                mean = sum(w["returning_clients"] * w[key] for w in windows) / returning
                divergence = [w["divergence"] for w in windows]
                values = [w[key] for w in windows]
                line = (f"{label} {method} s{s}: divergence {min(divergence):.2f} to "
                        f"{max(divergence):.2f} (median {statistics.median(divergence):.2f})")
                if method == "fedu":
                    first = next((w["round"] for w in windows if w[key] > 0), None)
                    line += (f"; took the global predictor: {100 * mean:.0f} % of returning "
                             f"clients, first in the window to round {first}, "
                             f"{100 * values[-1]:.0f} % in the last")
                else:
                    line += f"; mu {mean:.2f} ({min(values):.2f} to {max(values):.2f})"
                print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default=ONE_STEP_SCALE)
    parser.add_argument("--plot", type=Path, default=None, help="also draw the plot here")
    args = parser.parse_args()
    scale = args.scale
    floor = {s: v for s in range(3)
             if (v := probe(RESULTS / "random_init-small-bn" / f"s{s}")) is not None}
    floor_gn = {s: v for s in range(3)
                if (v := probe(RESULTS / "random_init-small" / f"s{s}")) is not None}
    print(f"fedssl_fmnist, scale {scale}: linear@5000 (%), seeds as finished")
    print("| setting | method | linear@5000 | over untrained (same seed) | against DCCO "
          "(same seed) |")
    print("|---|---|---|---:|---:|")
    for label, slug in SETTINGS:
        dcco = cells(scale, slug, "dcco")
        for method in METHODS:
            print(f"| {label} | {method} | {row(cells(scale, slug, method), floor, dcco)} |")
        for method in (*CLAIMS, "fedsc"):  # group norm, the claims grid's recipe
            where = "FedSC grid" if method == "fedsc" else "claims grid"
            print(f"| {label} | {method} ({where}, group norm) | "
                  f"{row(cells(scale, slug, method), floor_gn, dcco)} |")
    label, slug = CROSS_SILO  # its DCCO has batch norm too, the floor is the same network's
    dcco = cells(scale, slug, "dcco")
    for method in METHODS:
        print(f"| {label} | {method} | {row(cells(scale, slug, method), floor, dcco)} |")
    for method in ("cco_fedavg", "contrastive_fedavg"):  # at the BYOL papers' local recipe
        values = cells(scale, slug, method, RESULTS / LOCAL_EPOCHS)
        print(f"| {label} | {method} (5 local epochs) | {row(values, floor, dcco)} |")
    for method in METHODS:  # at dcco's one step, their own grid
        values = cells(scale, slug, method, RESULTS / CROSS_SILO_ONE_STEP)
        print(f"| {label} | {method} (one step) | {row(values, floor, dcco)} |")
    for method in ("cco_fedavg", "contrastive_fedavg", "fedsc", "centralized_cco", "dcco"):
        print(f"| {label} | {method} (one step) | {row(cells(scale, slug, method), floor, dcco)} |")
    for name, values in (("batch norm", floor), ("group norm", floor_gn)):
        shown = ", ".join(f"{values[s]:.1f}" for s in sorted(values))
        print(f"untrained encoder, {name}: {shown}")
    if scale != ONE_STEP_SCALE:
        against_one_step(scale)
    cross_silo_against_one_step()
    against_byol(scale)
    divergence_rules(scale)
    if args.plot is not None:
        plot(scale, floor, args.plot)


if __name__ == "__main__":
    main()
