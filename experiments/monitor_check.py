"""Does the k-NN monitor track the linear probe? The monitor in three feature spaces (raw
cosine, as before; centred; standardised) against the 5,000-label probe, over committed cells
whose encoders are trained again (the committed cells keep no checkpoints).

    python experiments/monitor_check.py --work /tmp/monitor-check \
        --out experiments/results/monitor_check CELL_DIR [CELL_DIR ...]

For each cell folder (one holding ``config.toml`` and a ``summary.json`` with linear@5000):

1. its config is pretrained again into ``--work/<grid folder>/<cell>`` (resumed if
   interrupted; a run there that finished is reused) without the monitor, unless the cell
   folder still holds its own finished checkpoint (a cell run on this machine);
2. the encoder's features of the monitor's bank and queries (the cell's own ``eval.knn_bank``,
   ``knn_queries`` and seed) are computed once, and the monitor votes in each space;
3. the 5,000-label probe is run again on the retrained encoder, and set beside the committed
   one: equal values say the retrained encoder is the committed one.

Each cell's record is written to ``--work`` as it finishes, so an interrupted check resumes.
The output is ``--out``.json (every cell, the correlations) and ``--out``.md (the table), with
Spearman's rank correlation between each monitor and the probe over the cells, and Kendall's
tau beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
from scipy.stats import kendalltau, spearmanr

from dcco.config import load_config
from dcco.core.seeding import generator
from dcco.evaluate import KNN_FEATURES, extract_features, knn_predict
from dcco.run.checkpoint import atomic_write_text
from dcco.run.device_plan import resolve_device
from dcco.run.evaluations import eval_config_for, evaluate_model, pretrained_model
from dcco.run.loop import run_pretraining
from dcco.run.rundir import RunDir, code_version
from dcco.run.splits import load_splits


def retrained(cell: Path, work: Path, splits) -> RunDir:
    """The cell's encoder: the cell itself where it still holds its finished checkpoint
    (cells run on this machine), else its config pretrained again in ``work`` (reused when
    finished there)."""
    cfg = load_config(cell / "config.toml")
    own = RunDir(cell)
    if own.checkpoint_path.is_file() and own.summary().get("rounds") == cfg.train.rounds:
        return own
    target = work / cell.parent.name / cell.name
    run, existed = RunDir.open_or_create(target, cfg)
    if run.summary().get("rounds") != cfg.train.rounds:
        print(f"[{cell.parent.name}/{cell.name}] pretraining {cfg.train.rounds} rounds"
              + (" (resuming)" if existed else ""), flush=True)
        start = time.perf_counter()
        run_pretraining(cfg, run, splits[0], None, resume=existed)
        print(f"  {time.perf_counter() - start:.0f} s", flush=True)
    return run


def monitors(model, cfg, train, test, device) -> dict[str, float]:
    """The monitor's accuracy in every space of ``KNN_FEATURES``, on one set of features."""
    e = cfg.eval
    gen = generator(cfg.train.seed, "knn")  # the bank and queries knn_accuracy draws
    bank_ids = torch.randperm(len(train), generator=gen)[:e.knn_bank or len(train)]
    query_ids = torch.randperm(len(test), generator=gen)[:e.knn_queries or len(test)]
    bank = extract_features(model, train.inputs(0)[bank_ids], e.feature_batch, device)
    queries = extract_features(model, test.inputs(0)[query_ids], e.feature_batch, device)
    truth = test.labels[query_ids]
    out = {}
    for space in KNN_FEATURES:
        pred = knn_predict(bank, train.labels[bank_ids], queries, train.num_classes, e.knn_k,
                           e.knn_temperature, features=space)
        out[space] = float((pred.cpu() == truth).double().mean())
    unit = torch.nn.functional.normalize(queries.double(), dim=1)
    cos = unit @ unit.T
    out["mean_pairwise_cosine"] = float((cos.sum() - cos.diagonal().sum())
                                        / (cos.numel() - cos.shape[0]))
    return out


def _committed(cell: Path) -> dict:
    """What the committed cell recorded: its probe, and its final k-NN with the monitor that
    made it (``raw`` for records from before the monitor was named)."""
    summary = json.loads((cell / "summary.json").read_text())
    return {"linear@5000": summary["evaluations"]["linear@5000"]["accuracy"],
            "knn": summary.get("knn"), "knn_features": summary.get("knn_features", "raw")}


def check_cell(cell: Path, work: Path, splits_cache: dict) -> dict:
    record_path = work / cell.parent.name / f"{cell.name}.check.json"
    if record_path.is_file():  # the retrained part is the costly one; the rest is reread
        return json.loads(record_path.read_text()) | {"committed": _committed(cell)}
    cfg = load_config(cell / "config.toml")
    key = (cfg.data.dataset, cfg.data.data_dir)
    if key not in splits_cache:
        splits_cache.clear()
        splits_cache[key] = load_splits(cfg)
    train, test = splits_cache[key]
    run = retrained(cell, work, (train, test))
    device = resolve_device(cfg.train.device)
    model = pretrained_model(cfg, run, train.input_shapes, device)
    knn = monitors(model, cfg, train, test, device)
    probe = evaluate_model(model, "linear", eval_config_for(cfg, 5000), cfg.train.seed, train,
                           test, device, method=cfg.train.method)
    record = {
        "cell": f"{cell.parent.name}/{cell.name}", "method": cfg.train.method,
        "rounds": cfg.train.rounds, "knn_bank": cfg.eval.knn_bank,
        "knn_queries": cfg.eval.knn_queries,
        "committed": _committed(cell),
        "retrained": {"linear@5000": probe.accuracy, **knn},
    }
    record_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(record_path, json.dumps(record, indent=2) + "\n")
    return record


def correlations(records: list[dict], boot: int = 2000) -> dict[str, dict[str, float]]:
    """Per monitor: Spearman's and Kendall's rank correlation with the probe; the mean gap
    below the probe, in points; how many pairs of cells of one grid folder whose probes
    differ by a point or more it orders as the probe does; and, against the standardised
    monitor, a bootstrap 95 % interval of the Spearman difference (cells resampled,
    seeded)."""
    import numpy as np

    probe = np.array([r["retrained"]["linear@5000"] for r in records])
    values = {s: np.array([r["retrained"][s] for r in records]) for s in KNN_FEATURES}
    groups = [r["cell"].split("/")[0] for r in records]
    pairs = [(a, b) for a in range(len(records)) for b in range(a + 1, len(records))
             if groups[a] == groups[b] and abs(probe[a] - probe[b]) >= 0.01]
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, len(records), len(records)) for _ in range(boot)]
    std = values["standardized"]
    out = {}
    for space, v in values.items():
        entry = {"spearman": float(spearmanr(v, probe).statistic),
                 "kendall": float(kendalltau(v, probe).statistic),
                 "mean_gap_points": float(100 * (probe - v).mean()),
                 "pairs_ordered_as_probe": sum(1 for a, b in pairs
                                               if (v[a] - v[b]) * (probe[a] - probe[b]) > 0),
                 "pairs": len(pairs)}
        if space != "standardized":
            diffs = [spearmanr(std[i], probe[i]).statistic - spearmanr(v[i], probe[i]).statistic
                     for i in draws]
            entry["standardized_minus_this_spearman_95ci"] = [
                float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))]
        out[space] = entry
    return out


def markdown(records: list[dict], corr: dict, command: str) -> str:
    lines = [f"Command: `{command}`", "",
             ("| cell | probe, committed | probe, retrained | k-NN as committed (its "
              "monitor) | raw | centred | standardised | mean pairwise cosine |"),
             "|---|---|---|---|---|---|---|---|"]
    pct = (lambda v: "—" if v is None else f"{100 * v:.1f}")
    for r in sorted(records, key=lambda r: r["retrained"]["linear@5000"]):
        c, t = r["committed"], r["retrained"]
        lines.append(f"| {r['cell']} | {pct(c['linear@5000'])} | {pct(t['linear@5000'])} | "
                     f"{pct(c['knn'])} ({c['knn_features']}) | {pct(t['raw'])} | "
                     f"{pct(t['centered'])} | "
                     f"{pct(t['standardized'])} | {t['mean_pairwise_cosine']:.3f} |")
    lines += ["", (f"Against the retrained linear@5000 over {len(records)} encoders (pairs: "
                   f"cells of one grid folder whose probes differ by a point or more):"), "",
              ("| monitor | Spearman | Kendall | mean gap below the probe (points) | pairs "
               "ordered as the probe | standardized − this, Spearman, 95 % interval |"),
              "|---|---|---|---|---|---|"]
    for space, c in corr.items():
        ci = c.get("standardized_minus_this_spearman_95ci")
        lines.append(f"| {space} | {c['spearman']:.3f} | {c['kendall']:.3f} | "
                     f"{c['mean_gap_points']:.1f} | {c['pairs_ordered_as_probe']} of "
                     f"{c['pairs']} | " + ("—" if ci is None else
                                           f"[{ci[0]:+.3f}, {ci[1]:+.3f}]") + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", type=Path, nargs="+", help="committed cell folders")
    parser.add_argument("--work", type=Path, required=True,
                        help="where the retrained runs and per-cell records go")
    parser.add_argument("--out", type=Path, required=True,
                        help="output prefix: writes PREFIX.json and PREFIX.md")
    args = parser.parse_args(argv)
    splits_cache: dict = {}
    records = []
    for i, cell in enumerate(args.cells, 1):
        if not (cell / "config.toml").is_file():
            parser.error(f"{cell} is not a cell folder (no config.toml)")
        records.append(check_cell(cell, args.work, splits_cache))
        r = records[-1]["retrained"]
        print(f"({i}/{len(args.cells)}) {records[-1]['cell']}: probe "
              f"{100 * r['linear@5000']:.1f}, k-NN raw {100 * r['raw']:.1f}, centred "
              f"{100 * r['centered']:.1f}, standardised {100 * r['standardized']:.1f}",
              flush=True)
    corr = correlations(records) if len(records) > 2 else {}
    command = "python experiments/monitor_check.py --work WORK --out " + str(args.out) + " " \
        + " ".join(str(c) for c in args.cells)
    machine = {k: v for k, v in code_version().items() if k in ("cpu", "gpu", "torch",
                                                                 "python", "git_commit")}
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(
        {"command": command, "machine": machine | {"platform": platform.platform(),
                                                   "threads": torch.get_num_threads(),
                                                   "cpus": os.cpu_count()},
         "correlations": corr, "cells": records}, indent=2) + "\n")
    atomic_write_text(args.out.with_suffix(".md"), markdown(records, corr, command))
    print(markdown(records, corr, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
