"""Does every shipped recipe train? Each config in ``configs/`` is run at its own budget for the
methods it is meant for, and every scale of the grids in ``experiments/`` is read from its
committed cells; each is set beside the untrained encoder of the same network.

    python experiments/recipe_check.py --work /tmp/recipe-check \
        --out experiments/results/recipe_check

A recipe trains when its loss falls (the first logged window against the last) and its
linear probe beats the untrained encoder's by at least ``--margin`` points (3 by default).

- Configs: pretrained into ``--work/<config>-<method>`` (resumed if interrupted; finished
  runs are reused), then the standardised k-NN monitor and the linear probe with the
  config's ``eval.labels``; the untrained encoder is the config's network at its
  initialisation, probed the same way. A config whose data is not on this machine (CIFAR)
  is listed as not run, with the reason.
- Grid scales: the committed cells in ``experiments/results/<grid>-<scale>/`` (first and
  last logged loss, linear@5000), against the committed untrained encoders of the same
  network (``FLOORS``). A scale without committed cells is listed as not run.

Output: ``--out``.json (every row, the command, the machine) and ``--out``.md (the table).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"

METHODS = {
    "fmnist_small.toml": ["dcco", "cco_fedavg", "contrastive_fedavg", "centralized_cco"],
    "cifar100_paper.toml": ["dcco", "cco_fedavg", "contrastive_fedavg", "centralized_cco"],
}
"""The methods each shipped config is meant for (its header says so); others: its own."""

FLOORS = {
    "appendix_c_fmnist-small-bn": "random_init-small-bn",
    "appendix_c_fmnist-pilot-bn-lr01": "random_init-small-bn",
    "two_view_fmnist-small": "two_view_fmnist-untrained",
    "two_view_fmnist-pilot300-aug": "two_view_fmnist-untrained",
    "two_view_fmnist-pilot300-noaug": "two_view_fmnist-untrained",
}
"""The committed untrained encoders a grid scale's cells are set beside (default:
``random_init-small``, ResNet14 at widths 16/32/64 with group norm, the small scales'
network)."""

MEASURES_A_FAILURE = {
    "appendix_c_fmnist-small": "the paper's appendix C: BYOL and SimSiam with group norm "
                               "collapse (its Figs. 3, 4)",
    "privacy_fmnist-small-eps8": "DP at 32 clients a round leaves no learning (docs/results/privacy.md)",
    "privacy_fmnist-small-eps4": "DP at 32 clients a round leaves no learning",
    "privacy_fmnist-small-eps1": "DP at 32 clients a round leaves no learning",
    "local_steps_fmnist-small-e2-b8": "several local steps, a negative result (issue 33)",
    "local_steps_fmnist-small-e4-b4": "several local steps, a negative result (issue 33)",
    "local_steps_fmnist-small-e2-b32": "several local steps, a negative result (issue 33)",
    "local_steps_fmnist-small-e4-b16-lr1e-4": "several local steps, a negative result",
    "local_steps_fmnist-pilot40-e4-b4-lr1e-4": "a pilot of local learning rates",
    "local_steps_fmnist-pilot40-e4-b4-lr1e-3": "a pilot of local learning rates",
    "local_steps_fmnist-pilot40-e4-b4-lr1e-2": "a pilot of local learning rates",
    "stale_fmnist-small-adam": "Adam 5e-3 at the small scale, the stalled recipe (issue 30)",
    "stale_fmnist-small-stale-adam": "Adam 5e-3 at the small scale, the stalled recipe",
}
"""Grid scales that exist to measure a failure (their verdict says so, and why): they are
experiments, not recipes to train with."""


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


def _first_last_loss(metrics: list[dict]) -> tuple[float | None, float | None]:
    losses = [m["loss"] for m in metrics if "loss" in m]
    return (losses[0], losses[-1]) if losses else (None, None)


def verdict(first: float | None, last: float | None, probe: float | None,
            floor: float | None, margin: float) -> str:
    if probe is None or floor is None or first is None:
        return "incomplete"
    falls = last < first
    beats = 100 * (probe - floor) >= margin
    if falls and beats:
        return "trains"
    return "does not train: " + "; ".join(
        ([] if falls else [f"loss {first:.4g} → {last:.4g}"])
        + ([] if beats else [f"probe {100 * (probe - floor):+.1f} points over untrained"]))


# ------------------------------------------------------------------------------ configs


def _label(path: Path) -> str:
    """A config's path as the table shows it: relative to the repository when inside it."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def check_config(path: Path, work: Path, margin: float) -> list[dict]:
    from dataclasses import replace

    from dcco.config import load_config
    from dcco.data.datasets import DataError
    from dcco.run.device_plan import resolve_device
    from dcco.run.evaluations import evaluate_model, pretrained_model
    from dcco.run.loop import run_pretraining
    from dcco.run.rundir import RunDir
    from dcco.run.setup import build_model
    from dcco.run.splits import load_splits

    base = load_config(path)
    label = _label(path)
    methods = METHODS.get(path.name, [base.train.method])
    try:
        train, test = load_splits(base)
    except DataError as e:
        return [{"recipe": label, "method": m, "budget": base.train.rounds,
                 "verdict": f"not run here: {base.data.dataset} is not on this machine",
                 "reason": str(e)} for m in methods]
    device = resolve_device(base.train.device)
    untrained = build_model(base, *train.input_shapes).to(device)
    floor = evaluate_model(untrained, "linear", base.eval, base.train.seed, train, test,
                           device).accuracy
    floor_knn = evaluate_model(untrained, "knn", replace(base.eval, labels=base.eval.knn_bank
                                                         or len(train)),
                               base.train.seed, train, test, device).accuracy
    rows = []
    for method in methods:
        cfg = replace(base, train=replace(base.train, method=method))
        run, existed = RunDir.open_or_create(work / f"{path.stem}-{method}", cfg)
        start = time.perf_counter()
        if run.summary().get("rounds") != cfg.train.rounds:
            print(f"[{path.name} {method}] pretraining {cfg.train.rounds} rounds", flush=True)
            run_pretraining(cfg, run, train, test, resume=existed)
        summary = run.summary()
        model = pretrained_model(cfg, run, train.input_shapes, device)
        probe = evaluate_model(model, "linear", cfg.eval, cfg.train.seed, train, test,
                               device, method=method).accuracy
        first, last = _first_last_loss(run.metrics())
        rows.append({"recipe": label, "method": method,
                     "budget": cfg.train.rounds, "loss_first": first, "loss_last": last,
                     "knn": summary.get("knn"), "knn_monitor": summary.get("knn_monitor"),
                     "probe": probe, "labels": cfg.eval.labels, "untrained_probe": floor,
                     "untrained_knn": floor_knn,
                     "seconds": round(time.perf_counter() - start),
                     "verdict": verdict(first, last, probe, floor, margin)})
        print(f"[{path.name} {method}] {rows[-1]['verdict']}: loss {first:.4g} → {last:.4g}, "
              f"k-NN {_pct(rows[-1]['knn'])}, probe {_pct(probe)} (untrained "
              f"{_pct(floor)})", flush=True)
    return rows


# ------------------------------------------------------------------------------ grid scales


def _grid_scales() -> list[tuple[str, str]]:
    from dcco.config import read_toml

    found = []
    for grid in sorted((ROOT / "experiments").glob("*.toml")):
        scales = read_toml(grid, "grid file").get("scale", {})
        found += [(grid.stem, scale) for scale in scales]
    return found


def _probe(summary: dict) -> float | None:
    entry = summary.get("evaluations", {}).get("linear@5000")
    return None if entry is None else entry["accuracy"]


def check_grid_scale(grid: str, scale: str, margin: float) -> list[dict]:
    folder = RESULTS / f"{grid}-{scale}"
    recipe = f"experiments/{grid}.toml --scale {scale}"
    if not folder.is_dir():
        return [{"recipe": recipe, "method": "—",
                 "verdict": "no committed cells (not run on this machine)"}]
    floor_dir = RESULTS / FLOORS.get(folder.name, "random_init-small")
    floors = [p for c in sorted(floor_dir.iterdir()) if c.is_dir()
              and (p := _probe(json.loads((c / "summary.json").read_text()))) is not None]
    floor = statistics.fmean(floors) if floors else None
    by_method: dict[str, list[tuple]] = {}
    for cell in sorted(c for c in folder.iterdir() if c.is_dir()):
        summary_path = cell / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        if summary.get("method") in (None, "supervised", "random_init"):
            continue
        metrics = [json.loads(line) for line in (cell / "metrics.jsonl").read_text()
                   .splitlines() if line.strip()] if (cell / "metrics.jsonl").is_file() else []
        by_method.setdefault(summary["method"], []).append(
            (*_first_last_loss(metrics), _probe(summary)))
    rows = []
    for method, cells in sorted(by_method.items()):
        probes = [p for *_, p in cells if p is not None]
        falls = sum(1 for f, last, _ in cells if f is not None and last < f)
        first = statistics.fmean(f for f, _, _ in cells if f is not None)
        last = statistics.fmean(x for _, x, _ in cells if x is not None)
        probe = statistics.fmean(probes) if probes else None
        row = {"recipe": recipe, "method": method, "cells": len(cells),
               "loss_first": first, "loss_last": last, "loss_falls_in": falls, "probe": probe,
               "untrained_probe": floor, "untrained_from": floor_dir.name,
               "verdict": verdict(first, last, probe, floor, margin)}
        if falls < len(cells) and row["verdict"] == "trains":
            row["verdict"] = f"trains in {falls} of {len(cells)} cells (the loss rose in the rest)"
        if folder.name in MEASURES_A_FAILURE and row["verdict"] != "trains":
            row["verdict"] += f" — as measured on purpose: {MEASURES_A_FAILURE[folder.name]}"
        rows.append(row)
    return rows or [{"recipe": recipe, "method": "—", "verdict": "no pretrained cells"}]


# ------------------------------------------------------------------------------ output


def markdown(config_rows: list[dict], grid_rows: list[dict], command: str,
             margin: float) -> str:
    lines = [(f"Command: `{command}`. A recipe trains when its loss falls and its linear probe "
             f"beats the untrained encoder of the same network by at least {margin:g} "
             f"points."), "", "Shipped configs, each run at its own budget:", "",
             ("| config | method | rounds | loss, first → last window | standardized k-NN (%) "
             "| linear probe (%) | untrained: probe / k-NN (%) | verdict |"),
             "|---|---|---|---|---|---|---|---|"]
    for r in config_rows:
        if "probe" not in r:
            lines.append(f"| {r['recipe']} | {r['method']} | {r['budget']} | — | — | — | — | "
                         f"{r['verdict']} |")
            continue
        lines.append(f"| {r['recipe']} | {r['method']} | {r['budget']} | "
                     f"{r['loss_first']:.4g} → {r['loss_last']:.4g} | {_pct(r['knn'])} | "
                     f"{_pct(r['probe'])} ({r['labels']} labels) | "
                     f"{_pct(r['untrained_probe'])} / {_pct(r['untrained_knn'])} | "
                     f"{r['verdict']} |")
    if not grid_rows:
        return "\n".join(lines) + "\n"
    lines += ["", "Grid scales, from their committed cells (means over cells; linear@5000):",
              "", ("| grid scale | method | cells | loss, first → last window | linear probe "
              "(%) | untrained probe (%) | verdict |"), "|---|---|---|---|---|---|---|"]
    for r in grid_rows:
        if "cells" not in r:
            lines.append(f"| {r['recipe']} | — | 0 | — | — | — | {r['verdict']} |")
            continue
        lines.append(f"| {r['recipe']} | {r['method']} | {r['cells']} | "
                     f"{r['loss_first']:.4g} → {r['loss_last']:.4g} | {_pct(r['probe'])} | "
                     f"{_pct(r['untrained_probe'])} ({r['untrained_from']}) | {r['verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", type=Path, nargs="*",
                    help="configs to run (default: every file in configs/)")
    ap.add_argument("--work", type=Path, required=True, help="where the runs go")
    ap.add_argument("--out", type=Path, required=True, help="output prefix (.json, .md)")
    ap.add_argument("--margin", type=float, default=3.0,
                    help="points the probe must beat the untrained encoder by")
    ap.add_argument("--no-grids", action="store_true", help="only the configs")
    ap.add_argument("--grids-only", action="store_true", help="only the grid scales")
    args = ap.parse_args(argv)

    from dcco.run.checkpoint import atomic_write_text
    from dcco.run.rundir import code_version

    configs = args.configs or sorted((ROOT / "configs").glob("*.toml"))
    config_rows = [] if args.grids_only else [
        r for path in configs for r in check_config(path, args.work, args.margin)]
    grid_rows = [] if args.no_grids else [r for grid, scale in _grid_scales()
                                          for r in check_grid_scale(grid, scale, args.margin)]
    command = "python experiments/recipe_check.py " + shlex.join(
            sys.argv[1:] if argv is None else argv)
    info = code_version()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(
        {"command": command, "machine": {k: info[k] for k in ("cpu", "gpu", "torch",
                                                               "git_commit")},
         "margin_points": args.margin, "configs": config_rows, "grid_scales": grid_rows},
        indent=2) + "\n")
    text = markdown(config_rows, grid_rows, command, args.margin)
    atomic_write_text(args.out.with_suffix(".md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
