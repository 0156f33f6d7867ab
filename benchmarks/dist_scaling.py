"""Seconds per round of one process against N torch.distributed ranks on this machine.

Runs ``dcco pretrain CONFIG`` for ``--rounds`` rounds (k-NN monitor off) as one process
with all the threads, then as ``torchrun --nproc_per_node N`` with threads / N each, both
float32 on the CPU by default, and prints the mean seconds per round after the first
logging window (from each run's ``metrics.jsonl``) and the speed-up.

    python benchmarks/dist_scaling.py configs/fmnist_small.toml --ranks 2 --rounds 40
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path


def seconds_per_round(run: Path) -> float:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rates = [r["rounds_per_sec"] for r in records if "rounds_per_sec" in r][1:]
    return 1 / (sum(rates) / len(rates))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--out", type=Path, default=None, help="write dist_scaling.json here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dist-scaling-"))
    sets = [f"--set={s}" for s in [f"train.rounds={args.rounds}", "train.knn_every=0",
                                   "train.log_every=5", 'train.device="cpu"', *args.set]]
    common = ["-m", "dcco", "pretrain", str(args.config.resolve()), "--no-progress", *sets]
    runs = {}
    for label, launcher, threads in (
            ("1 process", [sys.executable], args.threads),
            (f"{args.ranks} ranks", [sys.executable, "-m", "torch.distributed.run",
                                     "--nproc_per_node", str(args.ranks), "--master_port",
                                     str(_port())], max(args.threads // args.ranks, 1))):
        run = work / label.replace(" ", "-")
        done = subprocess.run(launcher + common + ["--run-dir", str(run)], cwd=work,
                              env=os.environ | {"OMP_NUM_THREADS": str(threads)},
                              capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"{label} failed:\n{done.stderr[-3000:]}")
        runs[label] = {"threads_per_process": threads, "s_per_round": seconds_per_round(run)}
    base = runs["1 process"]["s_per_round"]
    print(f"# {args.config} {' '.join(args.set)}; {args.rounds} rounds, {os.cpu_count()} "
          f"cores")
    print("| launch | threads per process | s / round | speed-up |")
    print("|---|---:|---:|---:|")
    for label, r in runs.items():
        print(f"| {label} | {r['threads_per_process']} | {r['s_per_round']:.3f} | "
              f"{base / r['s_per_round']:.2f}× |")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"command": "python benchmarks/dist_scaling.py " + " ".join(sys.argv[1:]),
                  "cores": os.cpu_count(), "runs": runs}
        (args.out / "dist_scaling.json").write_text(json.dumps(record, indent=2) + "\n")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
