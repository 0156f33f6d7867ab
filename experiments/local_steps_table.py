"""The several-local-steps table for docs/results/future-work.md, from the committed cells of
experiments/local_steps_fmnist.toml (and, for E = 1 at 16 samples per client, the Table 1
grid's identical DCCO cells).

    python experiments/local_steps_table.py

A seed whose cell folder holds no summary stopped with a non-finite loss (reproduce stops a
cell that diverges; the folders of the n = 64, E = 4, lr 1e-3 cells, all three diverged at
round 2, were not kept).
"""

from __future__ import annotations

import json
import statistics

from appendix_c_table import RESULTS

NOT_KEPT = "diverged"
"""What a seed without a folder shows in the row whose cells all diverged and were not kept."""
ROWS = [
    # (n, E, b, local lr, folder, cell, what a seed without a folder shows)
    (16, 1, 16, "(1.0)", "table1_fmnist-small", "non-iid-16-dcco", "—"),
    (16, 2, 8, "1e-3", "local_steps_fmnist-small-e2-b8", "non-iid-16-dcco", "—"),
    (16, 4, 4, "1e-3", "local_steps_fmnist-small-e4-b4", "non-iid-16-dcco", "—"),
    (64, 1, 64, "(1.0)", "local_steps_fmnist-small", "non-iid-64-dcco", "—"),
    (64, 2, 32, "1e-3", "local_steps_fmnist-small-e2-b32", "non-iid-64-dcco", "—"),
    (64, 4, 16, "1e-3", "local_steps_fmnist-small-e4-b16", "non-iid-64-dcco", NOT_KEPT),
    (64, 4, 16, "1e-4", "local_steps_fmnist-small-e4-b16-lr1e-4", "non-iid-64-dcco", "—"),
]


def seeds(folder: str, cell: str, absent: str) -> list[float | str]:
    """Per seed: linear@5000 (%); "diverged" for a folder without a summary (reproduce
    stops a cell whose loss is not finite); ``absent`` without a folder."""
    out: list[float | str] = []
    for seed in range(3):
        run = RESULTS / folder / f"{cell}-s{seed}"
        summary = run / "summary.json"
        if summary.is_file():
            out.append(100 * json.loads(summary.read_text())["evaluations"]["linear@5000"]
                       ["accuracy"])
        else:
            out.append("diverged" if run.is_dir() else absent)
    return out


def main() -> None:
    print("| samples per client n (clients a round) | E | b | local lr | linear@5000 (%) "
          "| seeds 0, 1, 2 |")
    print("|---|---|---|---|---|---|")
    for n, e, b, lr, folder, cell, absent in ROWS:
        per_seed = seeds(folder, cell, absent)
        done = [v for v in per_seed if isinstance(v, float)]
        mean = (f"{statistics.mean(done):.1f}" + (f" ± {statistics.stdev(done):.1f}"
                                                  if len(done) > 1 else "")) if done else "—"
        shown = ", ".join(f"{v:.1f}" if isinstance(v, float) else v for v in per_seed)
        print(f"| {n} ({128 // n}) | {e} | {b} | {lr} | {mean} | {shown} |")


if __name__ == "__main__":
    main()
