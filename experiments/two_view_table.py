"""The two-tower table for docs/results/two-towers.md, from the committed cells of
experiments/two_view_fmnist.toml (small scale).

    python experiments/two_view_table.py [FOLDER]

FOLDER defaults to experiments/results/two_view_fmnist-small. Each entry is the mean ± the
standard deviation over the seeds found (their number in brackets when not 3); centralized
CCO does not depend on the client setting, so its row is the same cells in every setting.

The floor, the same evaluations of the untrained towers (seeds 0-2, the grid's architecture;
retrieval in both spaces, standardized and cosine), is computed once and kept in
experiments/results/two_view_fmnist-untrained.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
FOLDER = ROOT / "results" / "two_view_fmnist-small"
METHODS = (("dcco", "DCCO"), ("cco_fedavg", "CCO + FedAvg"), ("clip_fedavg", "CLIP + FedAvg"),
           ("centralized_cco", "centralized CCO"))
SETTINGS = (("non-iid-1", "non-IID 1"), ("non-iid-4", "non-IID 4"), ("non-iid-16", "non-IID 16"))
COLUMNS = (("retrieval@1000", "x_to_y", "recall@1", "X→Y R@1"),
           ("retrieval@1000", "x_to_y", "recall@5", "X→Y R@5"),
           ("retrieval@1000", "y_to_x", "recall@1", "Y→X R@1"),
           ("retrieval@1000", "y_to_x", "recall@5", "Y→X R@5"),
           ("linear@5000", None, None, "probe X"),
           ("linear_y@5000", None, None, "probe Y"))
SEEDS = (0, 1, 2)
UNTRAINED = ROOT / "results" / "two_view_fmnist-untrained"


def value(summary: dict, key: str, direction: str | None, measure: str | None) -> float:
    """One column of one cell, in %."""
    entry = summary["evaluations"][key]
    return 100 * (entry["details"][direction][measure] if direction else entry["accuracy"])


def entry(values: list[float]) -> str:
    if not values:
        return "—"
    text = f"{statistics.mean(values):.1f}"
    if len(values) > 1:
        text += f" ± {statistics.stdev(values):.1f}"
    return text + (f" ({len(values)})" if len(values) != len(SEEDS) else "")


def cells(folder: Path, method: str, setting: str) -> list[dict]:
    """The finished seeds' summaries of one table cell."""
    out = []
    for seed in SEEDS:
        name = f"{method}-s{seed}" if method.startswith("centralized") else \
            f"{setting}-{method}-s{seed}"
        path = folder / name / "summary.json"
        if path.is_file():
            summary = json.loads(path.read_text())
            if all(c[0] in summary.get("evaluations", {}) for c in COLUMNS):
                out.append(summary)
    return out


def untrained() -> dict[str, list[dict]]:
    """The evaluations of the untrained towers, per retrieval space, seeds 0-2 (computed and
    kept in ``UNTRAINED`` the first time)."""
    from dataclasses import asdict

    from dcco.reproduce import load_grid, plan_cells, select_cells
    from dcco.run.device_plan import resolve_device
    from dcco.run.evaluations import eval_config_for, evaluate_model
    from dcco.run.rundir import RunDir
    from dcco.run.setup import build_model
    from dcco.run.splits import load_splits

    grid = load_grid(ROOT / "two_view_fmnist.toml", "small")
    out: dict[str, list[dict]] = {"standardized": [], "cosine": []}
    splits = None
    for seed in SEEDS:
        (cell,) = select_cells(plan_cells(grid, UNTRAINED), [f"non-iid-4-dcco-s{seed}"])
        for space, method in (("standardized", "dcco"), ("cosine", "clip_fedavg")):
            path = UNTRAINED / f"{space}-s{seed}"
            summary = path / "summary.json"
            if not summary.is_file():
                splits = splits or load_splits(cell.cfg)
                run, _ = RunDir.open_or_create(path, cell.cfg)
                model = build_model(cell.cfg, *splits[0].input_shapes)
                for key in grid.evaluations:
                    protocol, labels = key.split("@")
                    result = evaluate_model(model, protocol, eval_config_for(cell.cfg, int(labels)),
                                            seed, *splits, resolve_device("cpu"), method=method)
                    run.update_summary(method="untrained", rounds=0,
                                       evaluations={key: asdict(result)})
            out[space].append(json.loads(summary.read_text()))
    return out


def table(folder: Path) -> str:
    lines = ["| setting | method | " + " | ".join(c[3] for c in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    for space, found in untrained().items():
        row = [entry([value(s, *c[:3]) for s in found]) for c in COLUMNS]
        lines.append(f"| — | untrained towers ({space}) | " + " | ".join(row) + " |")
    for setting, setting_name in SETTINGS:
        for method, method_name in METHODS:
            if method.endswith("fedavg") and setting == "non-iid-1":
                row = ["n/a (needs ≥ 2 pairs a client)"] + [""] * (len(COLUMNS) - 1)
            else:
                found = cells(folder, method, setting)
                row = [entry([value(s, *c[:3]) for s in found]) for c in COLUMNS]
            lines.append(f"| {setting_name} | {method_name} | " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1]) if len(sys.argv) > 1 else FOLDER))
