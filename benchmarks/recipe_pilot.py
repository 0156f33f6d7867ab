"""Which recipe trains the CCO family at a grid's network: one short run per candidate scale,
side by side, judged by a rule fixed before the run.

    python benchmarks/recipe_pilot.py --grid experiments/table1_fmnist.toml \
        --scales gpu gpu-paper gpu-lars gpu-warmup --cell centralized_cco-s0 --rounds 300 \
        --out /tmp/pilot --record benchmarks/results/recipe_pilot_<machine>.json

Each candidate is a scale of the grid file (its own recipe); the pilot runs the same cell of
each (centralized CCO by default: the CCO loss without the federated part) for ``--rounds``
rounds, the cosine schedule over those rounds, with the collapse figures every record and the
run's standardised k-NN monitor at the end, each in its own process (``--jobs`` at once).

**The rule** (``pick``), fixed before any run: among the candidates whose run finished with a
finite loss and no collapse warning, the highest k-NN at the last round; within
``TIE_POINTS`` of it, the one listed first. No candidate qualifies: none is picked, and the
record says why. The GPU session (``benchmarks/gpu_session.py``) runs the grid at the
picked scale, and skips the pilot once the repository holds a record of one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIE_POINTS = 0.5
"""k-NN points within which two candidates tie (the first listed wins)."""


def pick(runs: list[dict]) -> tuple[str | None, str]:
    """The rule: the scale picked and why (``runs``: each candidate's record, in order)."""
    fit = [r for r in runs if r.get("knn") is not None and r.get("final_loss") is not None
           and math.isfinite(r["final_loss"]) and not r.get("collapse_warning")]
    if not fit:
        reasons = "; ".join(f"{r['scale']}: {r.get('why_not', 'no k-NN')}" for r in runs)
        return None, f"no candidate finished without collapse ({reasons})"
    best = max(r["knn"] for r in fit)
    chosen = next(r for r in fit if r["knn"] >= best - TIE_POINTS / 100)
    return chosen["scale"], (f"{chosen['scale']}: k-NN {100 * chosen['knn']:.1f} % at round "
                             f"{chosen['rounds']}, the highest of those without collapse "
                             f"(within {TIE_POINTS} points, the first listed)")


def candidate_config(grid: Path, scale: str, cell: str, rounds: int):
    """The cell's config at ``scale``, cut to ``rounds`` rounds with the k-NN monitor at the
    end and a metrics record every tenth of the run."""
    from dataclasses import replace

    from dcco.reproduce import load_grid, plan_cells

    cells = {c.path.name: c for c in plan_cells(load_grid(grid, scale), Path("/nonexistent"))}
    if cell not in cells:
        raise SystemExit(f"recipe_pilot: no cell {cell!r} at scale {scale!r} of {grid}")
    cfg = cells[cell].cfg
    every = max(1, rounds // 10)
    return replace(cfg, train=replace(cfg.train, rounds=rounds, knn_every=rounds,
                                      log_every=every, checkpoint_every=rounds))


def run_one(args: argparse.Namespace) -> int:
    """One candidate, in this process: pretrain into ``--out/<scale>``, write its record."""
    from dcco.run.loop import run_pretraining
    from dcco.run.rundir import RunDir
    from dcco.run.setup import check_run
    from dcco.run.splits import load_splits

    cfg = candidate_config(args.grid, args.one, args.cell, args.rounds)
    train, test = load_splits(cfg)
    check_run(cfg, train)
    path = args.out / args.one
    start = time.perf_counter()
    run, existed = RunDir.open_or_create(path, cfg)
    summary = run_pretraining(cfg, run, train, test, resume=existed,
                              on_warning=lambda text: None)
    record = {"scale": args.one, "cell": args.cell, "rounds": summary["rounds"],
              "final_loss": summary.get("final_loss"), "knn": summary.get("knn"),
              "collapse": summary.get("collapse"),
              "collapse_warning": summary.get("collapse_warning"),
              "optim": {k: v for k, v in vars(cfg.optim).items()},
              "seconds": time.perf_counter() - start}
    (path / "pilot.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", type=Path, default=ROOT / "experiments" / "table1_fmnist.toml")
    ap.add_argument("--scales", nargs="+", default=["gpu", "gpu-paper", "gpu-lars",
                                                    "gpu-warmup"])
    ap.add_argument("--cell", default="centralized_cco-s0")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--jobs", type=int, default=4, help="candidates side by side")
    ap.add_argument("--out", type=Path, required=True, help="the candidates' run folders")
    ap.add_argument("--record", type=Path, default=None, help="the pilot's record (.json)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:
        return run_one(args)
    args.out.mkdir(parents=True, exist_ok=True)
    from dcco.reproduce.pool import threads_per_job
    from dcco.run.device_plan import resolve_device

    # every candidate's config is checked before any starts
    configs = [candidate_config(args.grid, scale, args.cell, args.rounds) for scale in args.scales]
    pending, running = list(args.scales), []
    # candidates side by side on a CPU share its cores, as ``dcco reproduce --jobs`` cells do
    # (N processes on every core each: rounds 40 x slower at the test grid's size)
    env = os.environ | threads_per_job(min(args.jobs, len(args.scales)),
                                       resolve_device(configs[0].train.device).type)
    logs = args.out / "logs"
    logs.mkdir(exist_ok=True)
    started = time.perf_counter()
    while pending or running:
        while pending and len(running) < args.jobs:
            scale = pending.pop(0)
            log = open(logs / f"{scale}.log", "w")  # noqa: SIM115 (closed when it ends)
            command = [sys.executable, str(Path(__file__).resolve()), "--grid", str(args.grid),
                       "--cell", args.cell, "--rounds", str(args.rounds), "--out",
                       str(args.out), "--one", scale]
            running.append((scale, subprocess.Popen(command, stdout=log,
                                                    stderr=subprocess.STDOUT,
                                                    env=env), log))
        for item in list(running):
            scale, process, log = item
            if process.poll() is not None:
                log.close()
                running.remove(item)
                print(f"[{scale}] exit {process.returncode}", flush=True)
        time.sleep(1)
    runs = []
    for scale in args.scales:
        path = args.out / scale / "pilot.json"
        if path.is_file():
            runs.append(json.loads(path.read_text()))
        else:
            tail = (logs / f"{scale}.log").read_text().splitlines()[-3:]
            runs.append({"scale": scale, "why_not": "failed: " + " | ".join(tail)})
    for r in runs:
        if r.get("collapse_warning"):
            r["why_not"] = r["collapse_warning"]
    chosen, why = pick(runs)
    from dcco.run.rundir import code_version

    record = {"command": "python benchmarks/recipe_pilot.py " + " ".join(
        sys.argv[1:] if argv is None else argv), "grid": str(args.grid), "cell": args.cell,
        "rounds": args.rounds, "rule": pick.__doc__, "tie_points": TIE_POINTS,
        "candidates": runs, "picked": chosen, "why": why,
        "seconds": time.perf_counter() - started,
        "machine": {k: v for k, v in code_version().items()
                    if k in ("gpu", "cpu", "torch", "git_commit", "source_sha256")}}
    print(f"picked: {chosen} ({why})")
    if args.record is not None:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")
    return 0 if chosen is not None else 1


if __name__ == "__main__":
    sys.exit(main())
