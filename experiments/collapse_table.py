"""The tables of docs/results/collapse.md, from the records of
``experiments/collapse_mechanism.py`` (``experiments/results/collapse/*.json``).

    python experiments/collapse_table.py experiments/results/collapse/paper_dcco_adam5e-3.json \
        experiments/results/collapse/paper_dcco_adam1e-3.json --rounds 1 10 50 100

Prints, per record and variant: the loss, its two terms, the collapse figures (of the fixed
probe views, and of S_A where the method shares statistics), the k-NN monitor, the last
projector layer's spectral step per round; then, at the last round asked for, every layer's
dead units, spread and effective rank, and each parameter group's step per round.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def rounds_table(name: str, records: list[dict], rounds: list[int]) -> list[str]:
    rows = [f"**{name}**", "",
            ("| round | loss | on-diagonal | off-diagonal | C_ii | eff. rank of C | features' "
             "eff. rank | last layer's σ₁ step a round | k-NN |"),
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by_round = {r["round"]: r for r in records}
    for r in rounds:
        rec = by_round.get(r)
        if rec is None:
            continue
        rows.append("| " + " | ".join([
            str(r), _fmt(rec.get("loss", rec.get("probe_loss")), 4), _fmt(rec["on_diag"], 4),
            _fmt(rec["off_diag"], 4), _fmt(rec["probe_corr_diag"], 2),
            _fmt(rec["probe_eff_rank"], 3), _fmt(rec["layers"]["features"]["rank"], 3),
            _fmt(rec.get("last_w_spectral_update"), 2),
            f"{100 * rec['knn']:.1f} %" if "knn" in rec else ""]) + " |")
    return rows


def layers_table(name: str, rec: dict) -> list[str]:
    rows = [f"**{name}, round {rec['round']}**", "",
            "| layer | dead units | spread across samples | effective rank |",
            "|---|---:|---:|---:|"]
    for layer, f in rec["layers"].items():
        rows.append(f"| {layer} | {f['dead']:.0%} | {f['spread']:.3f} | {f['rank']:.1f} |")
    rows += ["", "| parameters | ‖Δw‖/‖w‖ a round (mean over the last window) |", "|---|---:|"]
    for group, v in sorted(rec.get("update", {}).items()):
        rows.append(f"| {group} | {v:.3g} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("--rounds", nargs="+", type=int, default=[0, 1, 10, 20, 50, 100])
    args = ap.parse_args(argv)
    out: list[str] = []
    for path in args.records:
        data = json.loads(path.read_text())
        for name, records in data["records"].items():
            out += [*rounds_table(f"{path.stem}: {name}", records, args.rounds), ""]
            last = [r for r in records if r["round"] <= max(args.rounds)][-1]
            out += [*layers_table(f"{path.stem}: {name}", last), ""]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
