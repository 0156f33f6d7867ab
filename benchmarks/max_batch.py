"""The batched round in one forward against the same round in client groups
(``train.max_batch``), measured in one run: seconds per round for each group size, interleaved
in blocks, and the ratio to one forward.

The workload of benchmarks/peers.py: K clients of n samples, the Table 1 `small` network
(ResNet14 GN + WS, widths 16/32/64, projector 128³), DCCO and contrastive FedAvg.

    OMP_NUM_THREADS=1 python benchmarks/max_batch.py --clients 256 --samples 4 \\
        --record benchmarks/results/max_batch.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import workload  # the same workload as the peers benchmark

from dcco.core.simulator import run_round
from dcco.methods import build_method
from dcco.run.rundir import code_version, cpu_name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=256)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--groups", type=int, nargs="+", default=[0, 1024, 256, 64],
                    help="samples a group (0: one forward)")
    ap.add_argument("--methods", nargs="+", default=["dcco", "contrastive_fedavg"])
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--record", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, x1, x2, segments = workload(args.clients, args.samples)
    rows = []
    for name in args.methods:
        method = build_method(name)
        seconds = {g: [] for g in args.groups}
        for _ in range(args.blocks):  # interleaved: a slow spell hits every group size
            for g in args.groups:
                start = time.perf_counter()
                run_round(model, method, x1, x2, segments, "batched", chunk=g or None)
                seconds[g].append(time.perf_counter() - start)
        base = statistics.median(seconds[args.groups[0]])
        for g in args.groups:
            median = statistics.median(seconds[g])
            rows.append({"method": name, "group": g or None, "seconds": seconds[g],
                         "median_s": median, "ratio_to_first": median / base})
            print(f"{name}, K = {args.clients} × {args.samples}, group "
                  f"{g or 'one forward'}: {median:.2f} s a round ({median / base:.2f} ×)",
                  flush=True)
    if args.record:
        record = {"command": "python benchmarks/max_batch.py " + " ".join(sys.argv[1:]),
                  "machine": f"{cpu_name()} ({os.cpu_count()} cores), {platform.system()}",
                  "code": code_version(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                  "clients": args.clients, "samples_per_client": args.samples, "rows": rows}
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {args.record}")


if __name__ == "__main__":
    main()
