"""Does the fast path move accuracy? The same DCCO run, eager float32 against the fastest
configuration, with the same seed.

Takes the non-IID 4 DCCO cell of a reproduction grid (default: the Table 1 grid's ``full``
scale, the paper's network and batch), shortens it to ``--rounds`` rounds, and pretrains it
twice into run directories under ``--work``: once with ``train.precision = "float32"`` and
``train.compile = "off"`` (today's path), once with ``--fast-precision`` and
``--fast-compile``. Both run at once, in two processes (``--sequential`` runs them one after
the other). Then it compares their final k-NN accuracy (target: within ``--tolerance``
points) and overlays their loss curves in a plot.

    python benchmarks/precision_check.py --rounds 2000 --out benchmarks/results

writes ``precision_check_<device>.json`` (each run's settings, k-NN, final loss, rounds per
second, and the verdict) and ``precision_check_<device>.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cell_config(grid: Path, scale: str, cell: str, rounds: int, knn_every: int,
                overrides: list[str]):
    """The grid cell's config with the round budget and monitor shortened."""
    from dataclasses import replace

    from dcco.config import load_config
    from dcco.reproduce import load_grid, plan_cells, select_cells

    g = load_grid(grid, scale, overrides)
    (c,) = select_cells([c for c in plan_cells(g, Path(tempfile.gettempdir())) if c.na is None],
                        [cell])
    cfg = replace(c.cfg, train=replace(c.cfg.train, rounds=rounds, knn_every=knn_every,
                                       checkpoint_every=rounds,
                                       log_every=max(1, min(10, rounds // 50))))
    return load_config(None, [], base=cfg)


def run_one(args: argparse.Namespace) -> None:
    """The child process: one pretraining run into ``--run-dir``."""
    from dataclasses import replace

    from dcco.run.loop import run_pretraining
    from dcco.run.rundir import RunDir
    from dcco.run.setup import resolved
    from dcco.run.splits import load_splits

    cfg = cell_config(args.grid, args.scale, args.cell, args.rounds, args.knn_every, args.set)
    cfg = resolved(replace(cfg, train=replace(cfg.train, precision=args.precision,
                                              compile=args.compile)))
    train, test = load_splits(cfg)
    run = RunDir.create(args.run_dir, cfg)
    summary = run_pretraining(cfg, run, train, test)
    print(json.dumps({"knn": summary["knn"], "final_loss": summary["final_loss"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", type=Path, default=ROOT / "experiments" / "table1_fmnist.toml")
    ap.add_argument("--scale", default="full")
    ap.add_argument("--cell", default="non-iid-4-dcco-s0")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--knn-every", type=int, default=500)
    ap.add_argument("--fast-precision", default="bf16")
    ap.add_argument("--fast-compile", default="on")
    ap.add_argument("--tolerance", type=float, default=1.0,
                    help="largest k-NN difference allowed, in points (percent)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override the grid's base config (repeatable)")
    ap.add_argument("--work", type=Path, default=None,
                    help="where the two run directories go (default: a temporary folder)")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON and plot here")
    ap.add_argument("--tag", default="",
                    help="appended to the record's name (the GPU session: the scale checked)")
    ap.add_argument("--sequential", action="store_true")
    # the child's arguments
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--precision", help=argparse.SUPPRESS)
    ap.add_argument("--compile", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_one(args)
        return

    import torch

    work = args.work or Path(tempfile.mkdtemp(prefix="precision-check-"))
    runs = {"eager float32": ("float32", "off"),
            "fast": (args.fast_precision, args.fast_compile)}
    common = [sys.executable, __file__, "--child", "--grid", str(args.grid), "--scale",
              args.scale, "--cell", args.cell, "--rounds", str(args.rounds), "--knn-every",
              str(args.knn_every)] + [f"--set={s}" for s in args.set]
    procs = {}
    for name, (precision, compile) in runs.items():
        run_dir = work / re.sub(r"[^a-z0-9]+", "-", name)
        cmd = common + ["--precision", precision, "--compile", compile, "--run-dir",
                        str(run_dir)]
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        procs[name] = (run_dir, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                                 text=True))
        if args.sequential:
            procs[name][1].wait()
    results = {}
    for name, (run_dir, proc) in procs.items():
        proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"the {name} run failed (exit {proc.returncode}); its run "
                             f"directory is {run_dir}")
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text()
                   .splitlines() if line.strip()]
        summary = json.loads((run_dir / "summary.json").read_text())
        config = (run_dir / "config.toml").read_text()
        results[name] = {
            "precision": re.search(r'^precision = "(\w+)"', config, re.MULTILINE).group(1),
            "compile": re.search(r'^compile = "(\w+)"', config, re.MULTILINE).group(1),
            "knn": summary["knn"], "final_loss": summary["final_loss"],
            "knn_monitor": summary.get("knn_monitor", "raw k-NN"),
            "seconds": summary["pretrain_seconds_this_session"],
            "loss_curve": [[m["round"], m["loss"]] for m in metrics if "loss" in m],
            "knn_curve": [[m["round"], m["knn"]] for m in metrics if "knn" in m],
        }
    # summary.json keeps k-NN as a fraction; the check is in points (percent)
    difference = 100 * (results["fast"]["knn"] - results["eager float32"]["knn"])
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    record = {"device": device, "torch": torch.__version__, "grid": str(args.grid.name),
              "scale": args.scale, "cell": args.cell, "rounds": args.rounds,
              "overrides": args.set,
              "command": "python benchmarks/precision_check.py " + " ".join(sys.argv[1:]),
              "runs": results, "knn_difference_points": round(difference, 3),
              "tolerance_points": args.tolerance,
              "within_tolerance": abs(difference) <= args.tolerance}
    for name, r in results.items():
        print(f"{name}: precision {r['precision']}, compile {r['compile']}: "
              f"{r['knn_monitor']} {100 * r['knn']:.2f} %,"
              f" final loss {r['final_loss']:.4g}, {r['seconds']:.0f} s")
    print(f"k-NN difference {difference:+.2f} points (tolerance ±{args.tolerance}): "
          f"{'within' if record['within_tolerance'] else 'OUTSIDE'}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / (f"precision_check_{re.sub(r'[^a-z0-9]+', '-', device.lower())}"
                           + (f"_{args.tag}" if args.tag else ""))
        stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
        plot(record, stem.with_suffix(".png"))
        print(f"wrote {stem}.json and {stem}.png")


def plot(record: dict, path: Path) -> None:
    """The two runs' loss curves overlaid, k-NN in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in record["runs"].items():
        rounds, losses = zip(*r["loss_curve"])
        ax.plot(rounds, losses, label=f"{name} ({r['precision']}, compile {r['compile']}): "
                                      f"k-NN {100 * r['knn']:.1f} %", alpha=0.8)
    ax.set_xlabel("round")
    ax.set_ylabel("loss (mean over each logging window)")
    ax.set_yscale("log")
    ax.set_title(f"{record['cell']} at scale {record['scale']}, {record['rounds']} rounds, "
                 f"{record['device']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
