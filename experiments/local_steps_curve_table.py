"""Accuracy against exchanges for E = 1, 2 and 4 local steps (docs/results/future-work.md), from the
committed cells of experiments/local_steps_fmnist.toml's scales curve-e1, curve-lw-e2 and
curve-lw-e4.

    python experiments/local_steps_curve_table.py

Each row: the standardised k-NN monitor every 50 rounds (100 exchanges: two a round), the
mean over the seeds that reached that round, then the 5,000-label probe at the end, mean ±
std and per seed. A seed that diverged shows the round it stopped at.
"""

from __future__ import annotations

import json
import statistics

from appendix_c_table import RESULTS

SCALES = [(1, "local_steps_fmnist-curve-e1"), (2, "local_steps_fmnist-curve-lw-e2"),
          (4, "local_steps_fmnist-curve-lw-e4")]
ROUNDS = (50, 100, 150, 200, 250, 300)


def cell(folder: str, n: int, seed: int) -> tuple[dict[int, float], float | str | None]:
    """The k-NN monitor by round, and the probe (%), "diverged at R", or None (not run)."""
    run = RESULTS / folder / f"non-iid-{n}-dcco-s{seed}"
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        return {}, None
    knn, diverged = {}, None
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if "knn" in row:
            knn[row["round"]] = 100 * row["knn"]
        if row.get("diverged"):
            diverged = row["round"]
    if diverged is not None:
        return knn, f"diverged at {diverged}"
    summary = run / "summary.json"
    if not summary.is_file():
        return knn, None
    return knn, 100 * json.loads(summary.read_text())["evaluations"]["linear@5000"]["accuracy"]


def main() -> None:
    head = " | ".join(f"k-NN at {2 * r} exchanges" for r in ROUNDS)
    print(f"| n (clients a round) | E | {head} | linear@5000 (%) | seeds 0, 1, 2 |")
    print("|---|---|" + "---:|" * len(ROUNDS) + "---|---|")
    for n in (16, 64):
        for e, folder in SCALES:
            cells = [cell(folder, n, s) for s in range(3)]
            curve = []
            for r in ROUNDS:
                got = [k[r] for k, _ in cells if r in k]
                curve.append(f"{statistics.mean(got):.1f}" if got else "—")
            probes = [p for _, p in cells]
            done = [p for p in probes if isinstance(p, float)]
            mean = (f"{statistics.mean(done):.1f}" + (f" ± {statistics.stdev(done):.1f}"
                                                      if len(done) > 1 else "")) if done else "—"
            shown = ", ".join(f"{p:.1f}" if isinstance(p, float) else (p or "—") for p in probes)
            print(f"| {n} ({128 // n}) | {e} | " + " | ".join(curve) + f" | {mean} | {shown} |")


if __name__ == "__main__":
    main()
