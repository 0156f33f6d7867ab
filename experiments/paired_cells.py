"""Paired-by-seed differences of two groups of finished cells, with and without the runs that
did not train, for the figures of docs/results/ that the harness's claims table does not
print: "The claims at 5 seeds" (over the seeds that trained) and "FedSC" (FedSC against the
claims grid's DCCO cells).

A run "did not train" when its final pretraining loss is above ``--failed-loss`` (default 125:
the CCO loss of every trained DCCO and centralized run of the claims grid ends at 94-110; the
two failures at 134 and 145). Only DCCO's and centralized CCO's pooled CCO loss is on that
scale, so the test applies to them alone.

    python experiments/paired_cells.py > experiments/results/paired_cells.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CLAIMS = RESULTS / "table1_claims_fmnist-small"
FEDSC = RESULTS / "fedsc_fmnist-small"
SETTINGS = ("non-iid-1", "non-iid-4", "non-iid-16", "iid-16")


def runs(folder: Path, cell: str, evaluation: str) -> dict[int, tuple[float, float, str]]:
    """seed → (accuracy in %, final loss, method) of the finished runs ``cell-s<seed>``."""
    out = {}
    for path in sorted(folder.glob(f"{cell}-s*/summary.json")):
        s = json.loads(path.read_text())
        e = s.get("evaluations", {}).get(evaluation)
        if e is not None:
            out[int(path.parent.name.rsplit("-s", 1)[1])] = (
                100 * e["accuracy"], s.get("final_loss", 0.0), s["method"])
    return out


def trained(run: tuple[float, float, str], failed_loss: float) -> bool:
    return run[2] not in ("dcco", "centralized_cco") or run[1] <= failed_loss


def paired(a: dict, b: dict, failed_loss: float | None) -> str:
    """mean ± standard error of a − b over the seeds both have (and both trained)."""
    diffs = [a[s][0] - b[s][0] for s in sorted(a) if s in b and (
        failed_loss is None or (trained(a[s], failed_loss) and trained(b[s], failed_loss)))]
    if len(diffs) < 2:
        return "—"
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    return f"{statistics.mean(diffs):+.1f} ± {se:.1f} ({len(diffs)} seeds)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--failed-loss", type=float, default=125.0)
    args = ap.parse_args()
    cut = args.failed_loss
    summaries = {p.parent.name: json.loads(p.read_text())
                 for p in sorted(CLAIMS.glob("*/summary.json"))}
    failed = [f"{name} (loss {s['final_loss']:.1f})" for name, s in summaries.items()
              if not trained((0.0, s.get("final_loss", 0.0), s["method"]), cut)]
    print(f"Runs that did not train (final loss above {cut:g}): {', '.join(failed) or 'none'}\n")
    for evaluation in ("linear@5000", "linear@500"):
        print(f"## {evaluation}\n\n| quantity | setting | all seeds | seeds that trained |")
        print("|---|---|---|---|")
        central = runs(CLAIMS, "centralized_cco", evaluation)
        for setting in SETTINGS:
            dcco = runs(CLAIMS, f"{setting}-dcco", evaluation)
            print(f"| centralized_cco − dcco | {setting} | {paired(central, dcco, None)} | "
                  f"{paired(central, dcco, cut)} |")
        iid, non = runs(CLAIMS, "iid-16-dcco", evaluation), runs(CLAIMS, "non-iid-16-dcco",
                                                                  evaluation)
        print(f"| dcco: IID − non-IID | 16 | {paired(iid, non, None)} | "
              f"{paired(iid, non, cut)} |\n")
    print("## FedSC − DCCO, linear@5000 (experiments/fedsc_fmnist.toml, scale small)\n")
    print("| setting | FedSC by seed | DCCO by seed | FedSC − DCCO |\n|---|---|---|---|")
    for setting in ("non-iid-4", "non-iid-16"):
        fedsc = runs(FEDSC, f"{setting}-fedsc", "linear@5000")
        dcco = runs(CLAIMS, f"{setting}-dcco", "linear@5000")
        dcco = {s: v for s, v in dcco.items() if s in fedsc}
        show = (lambda r: " / ".join(f"{r[s][0]:.1f}" for s in sorted(r)))
        print(f"| {setting} | {show(fedsc)} | {show(dcco)} | {paired(fedsc, dcco, None)} |")


if __name__ == "__main__":
    main()
